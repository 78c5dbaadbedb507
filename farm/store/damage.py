"""Damaged rows: stored values this farm cannot read (malformed JSON, an unparseable
timestamp, a word outside its column's allowed values, a value of the wrong type),
named by table, row and column. Scanned when reading the store failed, to say where.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from farm.store.schema import _expected_tables, _user_tables

__all__ = ["damaged_rows"]


_IN_LIST = re.compile(r"^\s*(\w+)\s+IN\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)


def _allowed_values(table: sa.Table) -> dict[str, tuple[str, ...]]:
    """Column -> allowed words, from the table's ``col IN ('a', 'b')`` check constraints."""
    allowed = {}
    for constraint in table.constraints:
        if isinstance(constraint, sa.CheckConstraint):
            match = _IN_LIST.match(str(constraint.sqltext))
            if match:
                allowed[match.group(1)] = tuple(re.findall(r"'([^']*)'", match.group(2)))
    return allowed


_PYTHON_TYPES: tuple[tuple[type[sa.types.TypeEngine[Any]], tuple[type, ...], str], ...] = (
    (sa.Boolean, (bool, int), "a boolean"),
    (sa.Integer, (int,), "a whole number"),
    (sa.Float, (int, float), "a number"),
    (sa.String, (str,), "text"),
)


def _value_problem(
    column: sa.Column[Any],
    raw: Any,
    process: Callable[[Any], Any] | None,
    allowed: tuple[str, ...] | None,
) -> str | None:
    """What is wrong with one stored value, or None."""
    shown = repr(raw) if len(repr(raw)) <= 60 else repr(raw)[:57] + "..."
    if process is not None:
        try:
            process(raw)
        except Exception as exc:  # the column type's own reader: any failure is damage
            base = getattr(column.type, "impl", column.type)
            kind = (
                "valid JSON"
                if isinstance(base, sa.JSON)
                else "a timestamp"
                if isinstance(base, sa.DateTime)
                else f"a {str(base).lower()} value"
            )
            return f"{shown} is not {kind} ({exc})"
    if allowed is not None and raw not in allowed:
        return f"{shown} is not one of {', '.join(allowed)}"
    for sql_type, python_types, what in _PYTHON_TYPES:
        if isinstance(column.type, sql_type) and process is None:
            if not isinstance(raw, python_types) or (
                sql_type is not sa.Boolean and isinstance(raw, bool)
            ):
                return f"{shown} is not {what}"
            break
    return None


def _reader(column: sa.Column[Any], dialect: sa.Dialect) -> Callable[[Any], Any] | None:
    """The column type's own reader of a raw value on ``dialect`` (SQLite keeps JSON and
    timestamps as text); None where the driver reads values itself (PostgreSQL)."""
    try:
        return column.type.dialect_impl(dialect).result_processor(dialect, None)
    except (TypeError, ValueError, NotImplementedError):
        return None


def damaged_rows(engine: Engine, limit: int = 20) -> list[str]:
    """``row <table> id=N: <column>: <problem>`` for stored values this farm cannot read
    (malformed JSON, an unparseable timestamp, a word outside its column's allowed
    values, a value of the wrong type), at most ``limit``. Reads every row: call it
    when reading the store failed, to say where."""
    problems: list[str] = []
    with engine.connect() as connection:
        present = _user_tables(connection)
        dialect = connection.dialect
        for name, table in _expected_tables().items():
            if name not in present:
                continue
            allowed = _allowed_values(table)
            readers = {c.name: _reader(c, dialect) for c in table.columns}
            keys = [c.name for c in table.primary_key.columns]
            # Raw values: no type processing, so one bad value cannot stop the scan.
            rows = connection.exec_driver_sql(f'SELECT * FROM "{name}"')
            for row in rows.mappings():
                for column in table.columns:
                    raw = row.get(column.name)
                    if raw is None:
                        continue
                    problem = _value_problem(
                        column, raw, readers[column.name], allowed.get(column.name)
                    )
                    if problem:
                        ident = " ".join(f"{k}={row.get(k)}" for k in keys)
                        problems.append(f"row {name} {ident}: {column.name}: {problem}")
                        if len(problems) >= limit:
                            return problems
    return problems

"""One typed reader for the JSON columns of stored rows.

A JSON column can hold valid JSON of the wrong shape (a hand edit, a foreign writer,
a farm of another version): ``verdict.findings`` a number, ``bisection.first_bad``
past the commits, ``bisect_step.position`` -1 (which Python would read as the last
commit, showing the bad end as the step). Every stored JSON column is read through
:func:`read_column` with the shape it must have, and every stored position through
:func:`read_position`; a value that does not fit raises StoreDamagedError naming the
table, the row and the column, and what to do, instead of a traceback or a wrong
report. A record built from several columns is built inside :func:`reading_row`,
which names the column a validation error points at.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from farm.errors import StoreDamagedError

__all__ = ["damaged", "read_column", "read_position", "reading_row"]

T = TypeVar("T")


@cache
def _adapter(shape: Any) -> TypeAdapter[Any]:
    return TypeAdapter(shape)


def damaged(table: str, row: object, column: str, problem: str) -> StoreDamagedError:
    """The error for ``column`` of row ``row`` of ``table`` holding ``problem``."""
    return StoreDamagedError(
        f"the store holds a row this farm cannot read: row {table} id={row}: {column}: "
        f"{problem} (fix or delete the row, or restore a backup)"
    )


def read_column(shape: type[T], value: object, *, table: str, row: object, column: str) -> T:
    """``value`` (a stored JSON column) as ``shape`` (a type pydantic validates:
    ``tuple[Finding, ...]``, ``dict[str, str]``...). Raises StoreDamagedError
    naming ``table``, ``row`` and ``column`` when it does not fit."""
    try:
        result: T = _adapter(cast("Hashable", shape)).validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        problem = f"{where + ': ' if where else ''}{first['msg']} (got {_shown(value)})"
        raise damaged(table, row, column, problem) from None
    return result


@contextmanager
def reading_row(
    table: str, row: object, *, fields: Mapping[str, str], default: str
) -> Iterator[None]:
    """Build a record from the JSON columns of row ``row`` of ``table`` in the block: a
    ValidationError of a field ``fields`` maps to a column (others: ``default``), or of
    ``default``'s, becomes StoreDamagedError naming that column. A field mapped to ""
    is a plain column: its error is left to the caller (the store's row scan names
    plain values better)."""
    try:
        yield
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        column = fields.get(loc[0], default) if loc else default
        if not column:
            raise
        where = ".".join(loc)
        problem = f"{where + ': ' if where else ''}{first['msg']} (got {_shown(first['input'])})"
        raise damaged(table, row, column, problem) from None


def read_position(
    value: int | None, count: int, *, table: str, row: object, column: str
) -> int | None:
    """``value`` (a stored index into a list of ``count`` items, or None) when it is one;
    StoreDamagedError otherwise (a negative index would silently mean another item)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise damaged(table, row, column, f"{value!r} is not a position in 0..{count - 1}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

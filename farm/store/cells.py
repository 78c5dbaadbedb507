"""Cells and their results: the planned cells' rows, saving a cell's outcome with its
variant runs and counters, and reading a whole sweep back (:func:`load_sweep`).

Writes commit their own unit of work (:mod:`farm.store.base`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from farm.errors import StoreError
from farm.inert import untrusted
from farm.plan import ExcludedCell, ServerCell
from farm.records import (
    CELL_OUTCOMES,
    CellResult,
    EffectiveConfig,
    RequestRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    VariantResult,
)
from farm.store.base import _id, _require_sweep, _unit_of_work
from farm.store.builds import _build, _sweep_build_rows
from farm.store.columns import read_column, reading_row
from farm.store.confirmations import confirmation_runs
from farm.store.requests import delete_requests, insert_requests, read_requests, server_cell
from farm.store.tables import CellRow, ExcludedCellRow, MetricRow, VariantRunRow

__all__ = [
    "CellAlreadyStoredError",
    "completed_cell_ids",
    "load_sweep",
    "save_cell_result",
]


def _axis_columns(row_type: type[CellRow | VariantRunRow], axes: dict[str, Any]) -> dict[str, Any]:
    """The axis values that ``row_type`` also keeps as columns (the axes of the first
    schema, read by SQL such as the dashboards); every value is in its ``axes`` JSON."""
    return {name: value for name, value in axes.items() if name in row_type.model_fields}


def _planned_variants(cell: ServerCell) -> list[dict[str, Any]]:
    """The cell's variants as stored: each with its comparable key, which SQL readers
    (the dashboards) join on; :func:`_server_cell` drops it again."""
    return [
        {**v.model_dump(mode="json"), "comparable_key": cell.variant_key(v.axes).fingerprint}
        for v in cell.variants
    ]


def _cell_row(sweep_id: int, ordinal: int, cell: ServerCell) -> CellRow:
    return CellRow(
        sweep_id=sweep_id,
        ordinal=ordinal,
        cell_id=cell.cell_id,
        family=cell.family,
        axes=cell.axes,
        **_axis_columns(CellRow, cell.axes),
        planned_graph_mode=cell.planned_graph_mode,
        remaps=list(cell.remaps),
        variants=_planned_variants(cell),
        fingerprint=cell.key.fingerprint,
        status="planned",
    )


class CellAlreadyStoredError(StoreError):
    """``save_cell_result(..., replace=False)`` met a cell that already has a result:
    the first writer's result stays (``status`` names it)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


def save_cell_result(
    session: Session, sweep_id: int, result: CellResult, *, replace: bool = True
) -> None:
    """Store the outcome of a planned cell, replacing any earlier outcome of it; with
    ``replace=False`` only a cell that has no outcome yet is written (first writer
    wins: a spool flush never replaces what another driver stored).

    Raises StoreError when the sweep has no planned cell ``result.cell_id`` or a
    timestamp has no time zone, CellAlreadyStoredError when ``replace`` is False and
    the cell has a result; nothing is written then.
    """
    started_at = _utc(result.started_at, "started_at", result.cell_id)
    finished_at = _utc(result.finished_at, "finished_at", result.cell_id)
    with _unit_of_work(session):
        # The row lock makes concurrent saves of one cell (two drivers, a flush racing a
        # resume) take turns on PostgreSQL: each replaces the other's variant runs instead
        # of both inserting theirs. SQLite locks the whole file on write anyway.
        row = session.exec(
            select(CellRow)
            .where(CellRow.sweep_id == sweep_id, CellRow.cell_id == result.cell_id)
            .with_for_update()
        ).one_or_none()
        if row is None:
            _require_sweep(session, sweep_id)
            raise StoreError(
                f"sweep {sweep_id} has no planned cell {result.cell_id!r}; results are saved "
                "only for cells created by create_sweep"
            )
        if not replace and row.status != "planned":
            # Under the row lock: a concurrent writer's result is seen here once it
            # committed (PostgreSQL re-reads a row locked FOR UPDATE after the wait).
            raise CellAlreadyStoredError(
                f"sweep {sweep_id} cell {result.cell_id} already has a result "
                f"({row.status}); it is kept",
                row.status,
            )
        cell_row_id = _id(row.id)
        _delete_variant_runs(session, cell_row_id)

        effective = result.effective
        row.status = result.status
        row.effective = effective.model_dump(mode="json") if effective else None
        row.effective_graph_mode = effective.graph_mode if effective else None
        row.argv = list(result.argv)
        row.node = result.node
        row.started_at = started_at
        row.finished_at = finished_at
        row.startup_s = result.startup_s
        row.generation_s = result.generation_s
        row.npus = result.npus
        # Masked again here: a result changed by model_copy skipped its fields' masking.
        row.error = None if result.error is None else untrusted(result.error)
        row.log_tail = None if result.log_tail is None else untrusted(result.log_tail)
        row.log_path = result.log_path
        session.add(row)
        _insert_variants(session, sweep_id, _server_cell(row), cell_row_id, result.variants)


def _utc(value: datetime, field: str, cell_id: str) -> datetime:
    if value.tzinfo is None:
        raise StoreError(
            f"cell {cell_id}: {field}={value.isoformat()} has no time zone; the runner "
            "must record timestamps as datetime.now(UTC)"
        )
    return value.astimezone(UTC)


def _insert_variants(
    session: Session,
    sweep_id: int,
    cell: ServerCell,
    cell_row_id: int,
    variants: tuple[VariantResult, ...],
) -> None:
    runs = [
        VariantRunRow(
            cell_row_id=cell_row_id,
            ordinal=i,
            axes=v.axes,
            **_axis_columns(VariantRunRow, v.axes),
            comparable_key=key.fingerprint,
            key_label=key.label,
            concurrency=v.concurrency,
            elapsed_s=v.elapsed_s,
            sequential=v.sequential.model_dump(mode="json") if v.sequential else None,
        )
        for i, v in enumerate(variants)
        for key in (cell.variant_key(v.axes),)
    ]
    session.add_all(runs)
    session.flush()
    metrics: list[dict[str, Any]] = []
    for run, variant in zip(runs, variants, strict=True):
        metrics.extend(
            {"variant_run_id": _id(run.id), "name": name, "position": pos, "value": value}
            for name, pos, value in _counter_rows(variant.counters)
        )
    # Bulk insert: a variant carries per-position counters.
    if metrics:
        session.exec(sa.insert(MetricRow), params=metrics)
    insert_requests(
        session, sweep_id, [(_id(r.id), v) for r, v in zip(runs, variants, strict=True)]
    )


def _delete_variant_runs(session: Session, cell_row_id: int) -> None:
    # Explicit child deletes instead of relying on ON DELETE CASCADE, which SQLite
    # honours only when the connection enabled foreign keys.
    runs = select(VariantRunRow.id).where(VariantRunRow.cell_row_id == cell_row_id)
    session.exec(sa.delete(MetricRow).where(col(MetricRow.variant_run_id).in_(runs)))
    delete_requests(session, runs)
    session.exec(sa.delete(VariantRunRow).where(col(VariantRunRow.cell_row_id) == cell_row_id))


# Counters an engine may not export (0 then): stored only when there is a count, so a
# store of years of sweeps holds no rows of zeros for them (read back as 0).
_SPARSE_COUNTERS = frozenset({"engine_steps", "prefix_queries", "prefix_hits"})


def _counter_rows(counters: SpecCounters) -> Iterable[tuple[str, int | None, int]]:
    """Long format: ``(name, None, value)`` per scalar counter, one row per position."""
    for name, value in counters:
        if isinstance(value, tuple):
            yield from ((name, pos, v) for pos, v in enumerate(value))
        elif value or name not in _SPARSE_COUNTERS:
            yield name, None, value


def _counters(rows: Iterable[MetricRow]) -> SpecCounters:
    scalars: dict[str, int] = {}
    positions: dict[str, dict[int, int]] = defaultdict(dict)
    for m in rows:
        if m.position is None:
            scalars[m.name] = m.value
        else:
            positions[m.name][m.position] = m.value
    vectors = {
        name: tuple(by_pos.get(i, 0) for i in range(max(by_pos) + 1))
        for name, by_pos in positions.items()
    }
    known = SpecCounters.model_fields
    # Counters a newer farm wrote and this one does not know are left out.
    return SpecCounters.model_validate(
        {k: v for k, v in {**scalars, **vectors}.items() if k in known}
    )


def completed_cell_ids(session: Session, sweep_id: int) -> set[str]:
    """Cell ids of the sweep that have an outcome (ok, failed, build_failed): skip on resume."""
    _require_sweep(session, sweep_id)
    return set(
        session.exec(
            select(CellRow.cell_id).where(
                CellRow.sweep_id == sweep_id, col(CellRow.status).in_(CELL_OUTCOMES)
            )
        ).all()
    )


def load_sweep(session: Session, sweep_id: int) -> SweepRecord:
    """Read a whole sweep back: planned cells with their results, exclusions, builds,
    the reruns of its suspicious cells.

    Raises StoreError when there is no such sweep.
    """
    sweep = _require_sweep(session, sweep_id)
    cells = session.exec(
        select(CellRow).where(CellRow.sweep_id == sweep_id).order_by(col(CellRow.ordinal))
    ).all()
    runs_by_cell: dict[int, list[VariantRunRow]] = defaultdict(list)
    for run in session.exec(
        select(VariantRunRow)
        .join(CellRow)
        .where(CellRow.sweep_id == sweep_id)
        .order_by(col(VariantRunRow.cell_row_id), col(VariantRunRow.ordinal))
    ):
        runs_by_cell[run.cell_row_id].append(run)
    metrics_by_run: dict[int, list[MetricRow]] = defaultdict(list)
    for metric in session.exec(
        select(MetricRow).join(VariantRunRow).join(CellRow).where(CellRow.sweep_id == sweep_id)
    ):
        metrics_by_run[metric.variant_run_id].append(metric)
    requests_by_run = read_requests(session, sweep_id)

    stored: list[StoredCell] = []
    for row in cells:
        variants = tuple(
            _variant_result(run, metrics_by_run[_id(run.id)], requests_by_run[_id(run.id)])
            for run in runs_by_cell[_id(row.id)]
        )
        stored.append(StoredCell(cell=_server_cell(row), result=_cell_result(row, variants)))

    excluded = session.exec(
        select(ExcludedCellRow)
        .where(ExcludedCellRow.sweep_id == sweep_id)
        .order_by(col(ExcludedCellRow.ordinal))
    ).all()
    builds = _sweep_build_rows(session, sweep_id)
    return SweepRecord(
        sweep_id=sweep_id,
        job=sweep.job,
        started_at=sweep.started_at,
        finished_at=sweep.finished_at,
        status=sweep.status,
        cells=tuple(stored),
        excluded=tuple(_excluded(e) for e in excluded),
        builds=tuple(_build(b) for b in builds),
        confirmations=confirmation_runs(session, sweep_id),
    )


# Each stored row read through the shapes its columns must have: a value that does not
# fit names its table, row and column (farm.store.columns), never a traceback.


def _variant_result(
    run: VariantRunRow, metrics: list[MetricRow], requests: list[RequestRecord]
) -> VariantResult:
    axes = read_column(dict[str, Any], run.axes, table="variant_run", row=run.id, column="axes")
    fields = {"axes": "axes", "sequential": "sequential"}
    with reading_row("variant_run", run.id, fields=fields, default=""):
        return VariantResult.model_validate(
            {
                "axes": axes,
                "counters": _counters(metrics),
                "requests": tuple(requests),
                "elapsed_s": run.elapsed_s,
                "concurrency": run.concurrency,
                "sequential": run.sequential,
            }
        )


def _excluded(row: ExcludedCellRow) -> ExcludedCell:
    with reading_row("excluded_cell", row.id, fields={"axes": "axes"}, default=""):
        return ExcludedCell(axes=row.axes, reason=row.reason)


def _server_cell(row: CellRow) -> ServerCell:
    return server_cell(
        row.family, row.axes, row.planned_graph_mode, row.remaps, row.variants, row=row.id
    )


def _cell_result(row: CellRow, variants: tuple[VariantResult, ...]) -> CellResult | None:
    if row.status == "planned":
        return None
    at: dict[str, Any] = {"table": "cell", "row": row.id}
    # argv and effective are the JSON columns, read through their shapes; the plain
    # columns' errors are named by the store's row scan (farm.store.damage.damaged_rows).
    return CellResult.model_validate(
        {
            "cell_id": row.cell_id,
            "status": row.status,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
            "node": row.node,
            "argv": read_column(tuple[str, ...], row.argv, column="argv", **at),
            "effective": None
            if row.effective is None
            else read_column(EffectiveConfig, row.effective, column="effective", **at),
            "variants": variants,
            "startup_s": row.startup_s,
            "generation_s": row.generation_s,
            "npus": row.npus,
            "error": row.error,
            "log_tail": row.log_tail,
            "log_path": row.log_path,
        }
    )

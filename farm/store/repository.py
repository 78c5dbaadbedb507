"""Repository functions: typed records in, typed records out, rows stay inside.

Every function takes an explicit ``Session``. Functions that write commit their own
unit of work, so the driver can call them between cells and a crash loses at most
the cell in flight; when they fail they roll the session back (discarding anything
else pending in it) and write nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from farm import __version__
from farm.comparable import ComparableKey
from farm.errors import FarmError, StoreError
from farm.inert import untrusted
from farm.plan import ExcludedCell, Plan, ServerCell
from farm.records import (
    CELL_OUTCOMES,
    SWEEP_STATUSES,
    BuildInfo,
    CellResult,
    ConfirmationRun,
    EffectiveConfig,
    RequestRecord,
    SequentialRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    SweepStatus,
    VariantResult,
)
from farm.store.columns import read_column, reading_row
from farm.store.requests import delete_requests, insert_requests, read_requests, server_cell
from farm.store.requests import history_series as requests_history_series

if TYPE_CHECKING:
    from farm.analysis.history import HistoryPoint

from farm.store.tables import (
    BuildLocationRow,
    BuildRow,
    CellRow,
    ConfirmationRunRow,
    ExcludedCellRow,
    MetricRow,
    SweepBuildRow,
    SweepRow,
    UTCDateTime,
    VariantRunRow,
)

__all__ = [
    "BuildLocation",
    "CellAlreadyStoredError",
    "SweepCost",
    "SweepInUseError",
    "SweepLease",
    "SweepStatus",
    "SweepSummary",
    "build_locations",
    "claim_sweep",
    "completed_cell_ids",
    "confirmation_runs",
    "create_sweep",
    "dialect_insert",
    "finish_sweep",
    "heartbeat",
    "history_series",
    "history_sweeps",
    "job_sweeps",
    "latest_sweep_id",
    "list_sweeps",
    "load_sweep",
    "median_cell_durations",
    "record_build",
    "record_build_location",
    "save_cell_result",
    "sweep_builds",
    "sweep_cost",
    "sweep_job",
]


class SweepSummary(BaseModel):
    """One line of ``farm report``'s sweep list: a sweep and how its cells ended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    job: str
    started_at: datetime
    finished_at: datetime | None
    status: str
    cells_ok: int = 0
    cells_failed: int = 0
    cells_build_failed: int = 0
    server_s: float = 0.0  # engine start-up plus generation, summed over the cells
    # The same on each device a server held (farm.records.CellResult.device_s).
    device_s: float = 0.0
    cells_planned: int = 0

    @property
    def cells_total(self) -> int:
        return self.cells_ok + self.cells_failed + self.cells_build_failed + self.cells_planned


class SweepCost(BaseModel):
    """What a sweep's servers cost (farm.records.CellResult.device_s), summed over its
    cells: start-up and generation time, and device time (each NPU a server held)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cells: int = 0
    startup_s: float = 0.0
    generation_s: float = 0.0
    device_s: float = 0.0
    # Variants whose sequential looks stopped early, and the generation time the sweep
    # would have taken had they sent every prompt (each one's time per prompt so far).
    stopped_early: int = 0
    fixed_generation_s: float | None = None
    # The night's confirmation reruns (farm.analysis.confirm), apart from its cells.
    reruns: int = 0
    rerun_device_s: float = 0.0

    def describe(self) -> str:
        """``cost: 0.42 device-h (12 cells; start-up 6.1 min, generation 19.0 min)``,
        and what the looks saved: ``; 3 variants stopped early by their looks:
        generation 19.0 min vs 41.5 min at the fixed sample (0.46x)``."""
        text = (
            f"cost: {self.device_s / 3600:.2f} device-h ({self.cells} cells; start-up "
            f"{self.startup_s / 60:.1f} min, generation {self.generation_s / 60:.1f} min)"
        )
        fixed = self.fixed_generation_s
        if self.stopped_early and fixed:
            text += (
                f"; {self.stopped_early} variant(s) stopped early by their looks: generation "
                f"{self.generation_s / 60:.1f} min vs {fixed / 60:.1f} min at the fixed "
                f"sample ({self.generation_s / fixed:.2f}x)"
            )
        if self.reruns:
            ratio = (self.device_s + self.rerun_device_s) / self.device_s if self.device_s else 0
            text += (
                f"; {self.reruns} confirmation rerun(s): {self.rerun_device_s / 3600:.2f} "
                f"device-h more ({ratio:.2f}x the one-run night)"
            )
        return text


def _busy_seconds() -> Any:
    """SQL of one cell's server time: start-up plus generation."""
    return sa.func.coalesce(col(CellRow.startup_s), 0.0) + sa.func.coalesce(
        col(CellRow.generation_s), 0.0
    )


def _device_seconds() -> Any:
    """SQL of one cell's device seconds; a CPU host, and NPU counts not stored, as one."""
    devices = sa.case((sa.func.coalesce(col(CellRow.npus), 0) > 1, col(CellRow.npus)), else_=1)
    return _busy_seconds() * devices


def sweep_cost(session: Session, sweep_id: int) -> SweepCost:
    """The cost of the cells of sweep ``sweep_id`` that ran (one aggregate query)."""
    cells, startup, generation, device = session.exec(
        select(
            sa.func.count(),
            sa.func.sum(sa.func.coalesce(col(CellRow.startup_s), 0.0)),
            sa.func.sum(sa.func.coalesce(col(CellRow.generation_s), 0.0)),
            sa.func.sum(_device_seconds()),
        ).where(col(CellRow.sweep_id) == sweep_id, col(CellRow.startup_s).is_not(None))
    ).one()
    generation_s = float(generation or 0.0)
    looked = session.exec(
        select(VariantRunRow.id, VariantRunRow.elapsed_s, VariantRunRow.sequential)
        .join(CellRow)
        .where(col(CellRow.sweep_id) == sweep_id, col(VariantRunRow.sequential).is_not(None))
    ).all()
    skipped, early = 0.0, 0
    for row_id, elapsed, stored in looked:
        record = read_column(
            SequentialRecord, stored, table="variant_run", row=row_id, column="sequential"
        )
        if record.stopped_early and record.prompts_used:
            early += 1
            skipped += elapsed * (record.max_prompts / record.prompts_used - 1.0)
    reruns, rerun_device = session.exec(
        select(sa.func.count(), sa.func.sum(col(ConfirmationRunRow.device_s))).where(
            col(ConfirmationRunRow.sweep_id) == sweep_id
        )
    ).one()
    return SweepCost(
        cells=cells,
        startup_s=float(startup or 0.0),
        generation_s=generation_s,
        device_s=float(device or 0.0),
        stopped_early=early,
        fixed_generation_s=generation_s + skipped if early else None,
        reruns=reruns,
        rerun_device_s=float(rerun_device or 0.0),
    )


def create_sweep(
    session: Session, plan: Plan, job_yaml: str, host: str, driver: str | None = None
) -> int:
    """Insert a running sweep with its planned and excluded cells; return the sweep id.

    With ``driver`` (``host:pid``) the sweep starts leased to it (:func:`heartbeat`).
    """
    with _unit_of_work(session):
        sweep = SweepRow(
            job=plan.job,
            job_yaml=job_yaml,
            started_at=datetime.now(UTC),
            status="running",
            host=host,
            farm_version=__version__,
            driver=driver,
            heartbeat_at=_db_now(session) if driver else None,
        )
        session.add(sweep)
        session.flush()
        sweep_id = _id(sweep.id)
        session.add_all(_cell_row(sweep_id, i, cell) for i, cell in enumerate(plan.cells))
        session.add_all(
            ExcludedCellRow(
                sweep_id=sweep_id,
                ordinal=i,
                axes=ex.model_dump(mode="json")["axes"],
                reason=ex.reason,
            )
            for i, ex in enumerate(plan.excluded)
        )
    return sweep_id


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


def record_build(session: Session, sweep_id: int, build: BuildInfo) -> None:
    """Insert or update ``build`` (unique by build id) and link it to the sweep.

    Raises StoreError when there is no such sweep.
    """
    values = build.model_dump(mode="json")
    # Upsert so concurrent sweeps that share a build cannot race on its primary key.
    insert = dialect_insert(session)
    with _unit_of_work(session):
        _require_sweep(session, sweep_id)
        upsert = insert(BuildRow).values(values)
        session.exec(
            upsert.on_conflict_do_update(
                index_elements=["build_id"],
                set_={k: upsert.excluded[k] for k in values if k != "build_id"},
            )
        )
        link = insert(SweepBuildRow).values(sweep_id=sweep_id, build_id=build.build_id)
        session.exec(link.on_conflict_do_nothing())


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


def finish_sweep(
    session: Session, sweep_id: int, status: SweepStatus, driver: str | None = None
) -> bool:
    """Mark the sweep ``ok``, ``failed`` or ``interrupted`` and stamp its end time.

    With ``driver``, only while the sweep is leased to it: returns False (and changes
    nothing) when another driver took the sweep over. Raises StoreError when there is
    no such sweep, ValueError for another status.
    """
    if status not in SWEEP_STATUSES or status == "running":
        raise ValueError(f"finish_sweep: status must be ok, failed or interrupted, not {status!r}")
    with _unit_of_work(session):
        sweep = _require_sweep(session, sweep_id, lock=True)
        if driver is not None and sweep.driver not in (None, driver):
            return False
        sweep.status = status
        sweep.finished_at = datetime.now(UTC)
        session.add(sweep)
    return True


class SweepLease(BaseModel):
    """Who holds (or last held) a sweep: the driver's ``host:pid`` and its last heartbeat."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep_id: int
    driver: str | None
    heartbeat_at: datetime | None

    def describe(self, now: datetime) -> str:
        """``driver host:pid, last heartbeat 12 s ago (2026-11-30 20:00:00 UTC)``."""
        who = f"driver {self.driver}" if self.driver else "a driver that kept no lease"
        if self.heartbeat_at is None:
            return f"{who}, no heartbeat recorded"
        age = (now - self.heartbeat_at).total_seconds()
        return f"{who}, last heartbeat {age:.0f} s ago ({self.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)"


class SweepInUseError(FarmError):
    """The sweep is running under a driver whose heartbeat is fresh."""

    def __init__(self, lease: SweepLease, now: datetime, stale_after_s: float) -> None:
        super().__init__(
            f"sweep {lease.sweep_id} is running elsewhere: {lease.describe(now)}; a resume "
            f"would run its cells twice. Wait for it to end, or stop that driver (its lease "
            f"goes stale {stale_after_s:.0f} s after its last heartbeat) and resume then"
        )
        self.lease = lease


def claim_sweep(
    session: Session,
    sweep_id: int,
    driver: str,
    stale_after_s: float,
    gone: Callable[[str], bool] | None = None,
) -> SweepLease | None:
    """Lease sweep ``sweep_id`` to ``driver`` and mark it ``running`` (``--resume``).

    A sweep already running under a heartbeat younger than ``stale_after_s`` (by the
    store's clock) is refused with SweepInUseError, unless ``gone(its driver)`` says
    the caller knows that driver ended. A running sweep whose heartbeat is older, or
    missing, is taken over: its previous lease is returned so the caller can say so.
    Returns None when the sweep had ended (or was interrupted). Raises StoreError when
    there is no such sweep.
    """
    with _unit_of_work(session):
        sweep = _require_sweep(session, sweep_id, lock=True)
        now = _db_now(session)
        held = SweepLease(sweep_id=sweep_id, driver=sweep.driver, heartbeat_at=sweep.heartbeat_at)
        previous = None
        if sweep.status == "running":
            beat = sweep.heartbeat_at
            fresh = beat is not None and now - beat < timedelta(seconds=stale_after_s)
            if fresh and not (gone is not None and sweep.driver and gone(sweep.driver)):
                raise SweepInUseError(held, now, stale_after_s)
            previous = held
        # Only if nobody claimed it since it was read: PostgreSQL's row lock makes that
        # sure already, SQLite (no row locks) needs the compare.
        claim = (
            sa.update(SweepRow)
            .where(
                col(SweepRow.id) == sweep_id,
                col(SweepRow.status) == sweep.status,
                _is(col(SweepRow.driver), sweep.driver),
                _is(col(SweepRow.heartbeat_at), sweep.heartbeat_at),
            )
            .values(status="running", finished_at=None, driver=driver, heartbeat_at=now)
        )
        if session.exec(claim).rowcount != 1:
            raise SweepInUseError(_lease(session, sweep_id), now, stale_after_s)
    return previous


def _is(column: Any, value: Any) -> Any:
    return column.is_(None) if value is None else column == value


def _lease(session: Session, sweep_id: int) -> SweepLease:
    session.expire_all()
    sweep = _require_sweep(session, sweep_id)
    return SweepLease(sweep_id=sweep_id, driver=sweep.driver, heartbeat_at=sweep.heartbeat_at)


def heartbeat(session: Session, sweep_id: int, driver: str) -> SweepLease | None:
    """Refresh ``driver``'s lease on a running sweep; None while it holds it, else the
    lease of the driver that took the sweep over (nothing is written then)."""
    with _unit_of_work(session):
        now = _db_now(session)
        mine = (
            sa.update(SweepRow)
            .where(col(SweepRow.id) == sweep_id, col(SweepRow.driver) == driver)
            .values(heartbeat_at=now)
        )
        if session.exec(mine).rowcount == 1:
            return None
        return _lease(session, sweep_id)


def reopen_sweep(session: Session, sweep_id: int) -> None:
    """Mark an interrupted or finished sweep ``running`` again (``farm run --resume``)."""
    with _unit_of_work(session):
        sweep = _require_sweep(session, sweep_id)
        sweep.status = "running"
        sweep.finished_at = None
        session.add(sweep)


def latest_sweep_id(session: Session) -> int | None:
    """Id of the most recently created sweep, or None for an empty store."""
    return session.exec(select(sa.func.max(SweepRow.id))).one()


def sweep_job(session: Session, sweep_id: int) -> tuple[str, str]:
    """The job name of sweep ``sweep_id`` and the job text stored with it (credentials
    masked when stored), without reading its cells."""
    row = _require_sweep(session, sweep_id)
    return row.job, row.job_yaml


def list_sweeps(session: Session, limit: int = 20) -> list[SweepSummary]:
    """The ``limit`` most recent sweeps, newest first, with cell counts by status."""
    sweeps = session.exec(select(SweepRow).order_by(col(SweepRow.id).desc()).limit(limit)).all()
    return _summaries(session, sweeps)


def job_sweeps(session: Session, job: str, *, before: int | None = None) -> list[SweepSummary]:
    """Every sweep of ``job`` (those with an id below ``before``, when given), newest
    first, with cell counts by status. The job filter runs in SQL: no sweep is missed
    however many other jobs' sweeps the store holds."""
    query = select(SweepRow).where(col(SweepRow.job) == job)
    if before is not None:
        query = query.where(col(SweepRow.id) < before)
    return _summaries(session, session.exec(query.order_by(col(SweepRow.id).desc())).all())


def _summaries(session: Session, sweeps: Sequence[SweepRow]) -> list[SweepSummary]:
    ids = [_id(s.id) for s in sweeps]
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    server: dict[int, float] = defaultdict(float)
    device: dict[int, float] = defaultdict(float)
    if ids:
        rows = (
            session.connection()
            .execute(
                sa.select(  # five columns: more than sqlmodel's select is typed for
                    col(CellRow.sweep_id),
                    col(CellRow.status),
                    sa.func.count(),
                    sa.func.sum(_busy_seconds()),
                    sa.func.sum(_device_seconds()),
                )
                .where(col(CellRow.sweep_id).in_(ids))
                .group_by(col(CellRow.sweep_id), col(CellRow.status))
            )
            .all()
        )
        for sweep_id, status, n, seconds, device_seconds in rows:
            counts[sweep_id][status] = n
            server[sweep_id] += float(seconds or 0.0)
            device[sweep_id] += float(device_seconds or 0.0)
    return [
        SweepSummary(
            id=_id(s.id),
            job=s.job,
            started_at=s.started_at,
            finished_at=s.finished_at,
            status=s.status,
            cells_ok=counts[_id(s.id)].get("ok", 0),
            cells_failed=counts[_id(s.id)].get("failed", 0),
            cells_build_failed=counts[_id(s.id)].get("build_failed", 0),
            cells_planned=counts[_id(s.id)].get("planned", 0),
            server_s=server[_id(s.id)],
            device_s=device[_id(s.id)],
        )
        for s in sweeps
    ]


def _history_ids(session: Session, job: str, sweep_id: int, count: int) -> list[int]:
    """Ids of up to ``count`` sweeps of ``job`` ending with ``sweep_id``, oldest first."""
    if count <= 1:
        return [sweep_id]
    earlier = session.exec(
        select(SweepRow.id)
        .where(SweepRow.job == job, col(SweepRow.id) < sweep_id)
        .order_by(col(SweepRow.id).desc())
        .limit(count - 1)
    ).all()
    return [*sorted(_id(i) for i in earlier), sweep_id]


def history_sweeps(session: Session, record: SweepRecord, count: int) -> list[SweepRecord]:
    """Up to ``count`` sweeps of ``record``'s job ending with ``record``, oldest first,
    each read whole (requests and text): for callers that pair requests. History
    figures alone come cheaper from :func:`history_series`."""
    ids = _history_ids(session, record.job, record.sweep_id, count)
    return [*(load_sweep(session, i) for i in ids[:-1]), record]


def history_series(
    session: Session, record: SweepRecord, count: int
) -> dict[ComparableKey, tuple[HistoryPoint, ...]]:
    """Per-key AL series over up to ``count`` sweeps of ``record``'s job ending with it:
    ``series_from_sweeps(history_sweeps(...))`` from the stored per-variant summaries,
    one query whatever ``count``, no request read."""
    return job_history_series(session, record.job, record.sweep_id, count)


def job_history_series(
    session: Session, job: str, sweep_id: int, count: int
) -> dict[ComparableKey, tuple[HistoryPoint, ...]]:
    """:func:`history_series` by the job's name and the sweep's id: for a sweep still
    running, whose cells need not be read."""
    return requests_history_series(session, _history_ids(session, job, sweep_id, count))


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


def confirmation_runs(session: Session, sweep_id: int) -> tuple[ConfirmationRun, ...]:
    """Sweep ``sweep_id``'s reruns in the order they were stored."""
    rows = session.exec(
        select(ConfirmationRunRow)
        .where(ConfirmationRunRow.sweep_id == sweep_id)
        .order_by(col(ConfirmationRunRow.id))
    ).all()
    return tuple(
        read_column(
            ConfirmationRun,
            {
                "cell_id": r.cell_id,
                "side": r.side,
                "run": r.run,
                "build_id": r.build_id,
                "result": r.result,
            },
            table="confirmation_run",
            row=r.id,
            column="result",
        )
        for r in rows
    )


# Each stored row read through the shapes its columns must have: a value that does not
# fit names its table, row and column (farm.store.columns), never a traceback.


def _sweep_build_rows(session: Session, sweep_id: int) -> Sequence[BuildRow]:
    return session.exec(
        select(BuildRow)
        .join(SweepBuildRow)
        .where(SweepBuildRow.sweep_id == sweep_id)
        .order_by(col(BuildRow.build_id))
    ).all()


def sweep_builds(session: Session, sweep_id: int) -> dict[str, str]:
    """Engine -> build id of the builds sweep ``sweep_id`` ran (its cells not read)."""
    return {row.engine: row.build_id for row in _sweep_build_rows(session, sweep_id)}


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


def _build(row: BuildRow) -> BuildInfo:
    at: dict[str, Any] = {"table": "build", "row": row.build_id}
    values = {
        **row.model_dump(),
        "pins": read_column(tuple[str, ...], row.pins, column="pins", **at),
        "patches": read_column(tuple[str, ...], row.patches, column="patches", **at),
    }
    return BuildInfo.model_validate(values)


def _server_cell(row: CellRow) -> ServerCell:
    return server_cell(
        row.family, row.axes, row.planned_graph_mode, row.remaps, row.variants, row=row.id
    )


def _cell_result(row: CellRow, variants: tuple[VariantResult, ...]) -> CellResult | None:
    if row.status == "planned":
        return None
    at: dict[str, Any] = {"table": "cell", "row": row.id}
    # argv and effective are the JSON columns, read through their shapes; the plain
    # columns' errors are named by the store's row scan (farm.store.db.damaged_rows).
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


@contextmanager
def _unit_of_work(session: Session) -> Iterator[None]:
    """Commit what the block wrote, or roll it back so the session stays usable."""
    try:
        yield
        session.commit()
    except BaseException:
        session.rollback()
        raise


def _require_sweep(session: Session, sweep_id: int, lock: bool = False) -> SweepRow:
    sweep = session.get(SweepRow, sweep_id, with_for_update=lock or None)
    if sweep is None:
        raise StoreError(f"no sweep {sweep_id}; `farm sweeps` lists them")
    return sweep


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def dialect_insert(session: Session) -> Any:
    """The store's dialect's ``insert`` (it has ``on_conflict_do_update`` / ``_nothing``)."""
    dialect = _dialect(session)
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise StoreError(f"unsupported database dialect {dialect!r}")  # pragma: no cover


def _db_now(session: Session) -> datetime:
    """The store's clock: leases compare heartbeats that drivers on other hosts wrote."""
    return session.exec(select(sa.func.current_timestamp(type_=UTCDateTime()))).one()


def _utc(value: datetime, field: str, cell_id: str) -> datetime:
    if value.tzinfo is None:
        raise StoreError(
            f"cell {cell_id}: {field}={value.isoformat()} has no time zone; the runner "
            "must record timestamps as datetime.now(UTC)"
        )
    return value.astimezone(UTC)


class BuildLocation(BaseModel):
    """A build as it exists on one node: the Ray node id, its host and the folder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    build_id: str
    node_id: str
    host: str
    env_dir: str


def record_build_location(session: Session, location: BuildLocation) -> None:
    """Record (or refresh) that ``location.node_id`` holds the build at ``env_dir``.

    Raises StoreError when the build itself was never recorded (``record_build``).
    """
    with _unit_of_work(session):
        if session.get(BuildRow, location.build_id) is None:
            raise StoreError(
                f"build {location.build_id} is not in the store; record_build it first"
            )
        row = session.get(BuildLocationRow, (location.build_id, location.node_id))
        if row is None:
            row = BuildLocationRow(**location.model_dump(), recorded_at=datetime.now(UTC))
        else:
            row.host = location.host
            row.env_dir = location.env_dir
            row.recorded_at = datetime.now(UTC)
        session.add(row)


def build_locations(session: Session, build_id: str) -> list[BuildLocation]:
    """Every node known to hold ``build_id``, by node id."""
    rows = session.exec(
        select(BuildLocationRow)
        .where(BuildLocationRow.build_id == build_id)
        .order_by(col(BuildLocationRow.node_id))
    ).all()
    return [BuildLocation.model_validate(r.model_dump(exclude={"recorded_at"})) for r in rows]


def median_cell_durations(
    session: Session, cells: Iterable[ServerCell], last: int = 20
) -> dict[str, float]:
    """Median wall seconds of each cell's last ``last`` successful runs in any sweep.

    Runs count when they have the cell's server-level comparable key
    (:mod:`farm.comparable`), so a nightly whose version moved still finds its
    history. Cells without history are left out.
    """
    wanted = {c.key.fingerprint: c.cell_id for c in cells}
    if not wanted:
        return {}
    rows = session.exec(
        select(CellRow.fingerprint, CellRow.started_at, CellRow.finished_at)
        .where(CellRow.status == "ok", col(CellRow.fingerprint).in_(wanted))
        .order_by(col(CellRow.id).desc())
    ).all()
    seconds: dict[str, list[float]] = defaultdict(list)
    for key, started, finished in rows:
        if started and finished and len(seconds[key]) < last:
            seconds[key].append((finished - started).total_seconds())
    return {wanted[k]: _median(v) for k, v in seconds.items() if v}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _id(value: int | None) -> int:
    # Primary keys are None only before the first flush; every caller flushes first.
    assert value is not None, "row has no primary key yet"
    return value

"""Sweeps summed up without reading their cells: the sweep lists of ``farm sweeps``
(:class:`SweepSummary`, cell counts by status) and what a sweep's servers cost
(:class:`SweepCost`), each one aggregate query."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from farm.frozen import Frozen
from farm.records import SequentialRecord
from farm.store.base import _id
from farm.store.columns import read_column
from farm.store.tables import CellRow, ConfirmationRunRow, SweepRow, VariantRunRow

__all__ = ["SweepCost", "SweepSummary", "job_sweeps", "list_sweeps", "sweep_cost"]


class SweepSummary(Frozen):
    """One line of ``farm report``'s sweep list: a sweep and how its cells ended."""

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


class SweepCost(Frozen):
    """What a sweep's servers cost (farm.records.CellResult.device_s), summed over its
    cells: start-up and generation time, and device time (each NPU a server held)."""

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

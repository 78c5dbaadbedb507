"""Stored cells a PR run may reuse as its baseline: those of sweeps that ran one build.

Typed records out (:class:`farm.workflows.pr.StoredBaselineCell`); the pure choice of
which cells to reuse is :func:`farm.workflows.pr.select_baseline`.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from farm.results.baseline import StoredBaselineCell
from farm.store.cells import load_sweep
from farm.store.tables import CellRow, SweepBuildRow

__all__ = ["cells_of_build"]

# Sweeps read whole at most: the newest few that ran the build are all a PR needs.
_MAX_SWEEPS = 10


def cells_of_build(
    session: Session, build_id: str, engine: str, since: datetime
) -> list[StoredBaselineCell]:
    """The cells of engine ``engine`` in the newest sweeps that ran build ``build_id``
    and have an ok cell of that engine finished at or after ``since``; newest sweep
    first. A build row is shared by every sweep that used it, so a sweep counts when
    it links the build and its cells carry the engine's name."""
    ids = session.exec(
        select(SweepBuildRow.sweep_id)
        .join(CellRow, col(CellRow.sweep_id) == col(SweepBuildRow.sweep_id))
        .where(
            SweepBuildRow.build_id == build_id,
            CellRow.engine == engine,
            CellRow.status == "ok",
            col(CellRow.finished_at) >= since,
        )
        .distinct()
        .order_by(col(SweepBuildRow.sweep_id).desc())
        .limit(_MAX_SWEEPS)
    ).all()
    out: list[StoredBaselineCell] = []
    for sweep_id in ids:
        record = load_sweep(session, sweep_id)
        out += [
            StoredBaselineCell(sweep_id=sweep_id, build_id=build_id, stored=stored)
            for stored in record.cells
            if stored.cell.engine == engine
        ]
    return out

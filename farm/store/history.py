"""A job's history across sweeps: its earlier sweeps read whole, the per-key AL series
from the stored summaries, and the cells' median durations (for scheduling)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlmodel import Session, col, select

from farm.comparable import ComparableKey
from farm.plan import ServerCell
from farm.records import SweepRecord
from farm.store.base import _id
from farm.store.cells import load_sweep
from farm.store.requests import history_series as requests_history_series
from farm.store.tables import CellRow, SweepRow

if TYPE_CHECKING:
    from farm.analysis.history import HistoryPoint

__all__ = ["history_series", "history_sweeps", "job_history_series", "median_cell_durations"]


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

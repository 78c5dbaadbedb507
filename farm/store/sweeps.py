"""Sweeps and their leases: create a sweep with its planned cells, claim it for a
driver, keep the lease alive with heartbeats, finish or reopen it.

The lease compares heartbeats by the store's clock (drivers on other hosts write
them); writes commit their own unit of work (:mod:`farm.store.base`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from farm import __version__
from farm.errors import FarmError
from farm.frozen import Frozen
from farm.plan import Plan
from farm.records import SWEEP_STATUSES, SweepStatus
from farm.store.base import _id, _require_sweep, _unit_of_work
from farm.store.cells import _cell_row
from farm.store.tables import ExcludedCellRow, SweepRow, UTCDateTime

__all__ = [
    "SweepInUseError",
    "SweepLease",
    "claim_sweep",
    "create_sweep",
    "finish_sweep",
    "heartbeat",
    "latest_job_sweep_id",
    "latest_sweep_id",
    "reopen_sweep",
    "sweep_job",
    "sweep_job_status",
]


class SweepLease(Frozen):
    """Who holds (or last held) a sweep: the driver's ``host:pid`` and its last heartbeat."""

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


def latest_job_sweep_id(session: Session, job: str) -> int | None:
    """Id of ``job``'s most recently created sweep, or None when it has none."""
    return session.exec(select(sa.func.max(SweepRow.id)).where(SweepRow.job == job)).one()


def sweep_job_status(session: Session, sweep_id: int) -> tuple[str, str]:
    """The job name and status of sweep ``sweep_id``, without reading its cells."""
    row = _require_sweep(session, sweep_id)
    return row.job, row.status


def sweep_job(session: Session, sweep_id: int) -> tuple[str, str]:
    """The job name of sweep ``sweep_id`` and the job text stored with it (credentials
    masked when stored), without reading its cells."""
    row = _require_sweep(session, sweep_id)
    return row.job, row.job_yaml


def _db_now(session: Session) -> datetime:
    """The store's clock: leases compare heartbeats that drivers on other hosts wrote."""
    return session.exec(select(sa.func.current_timestamp(type_=UTCDateTime()))).one()

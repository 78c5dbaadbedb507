"""Alerts in SQL: one row per alert key, upserted by every sweep that shows it.

Typed records in and out (:mod:`farm.notify.alert`); ``AlertRow`` never leaves this
module. Lifecycle of an alert::

    open --acknowledge--> acknowledged --resolve--> resolved
      \\--------------------resolve-------------------^     |
      ^------ raised again by a *newer* sweep --------------/

Raising a key that is open or acknowledged updates it (latest sweep, figures); an
acknowledged alert stays acknowledged. A resolved alert re-opens only when the
raising sweep is newer than the last sweep that showed it: re-analysing an old sweep
does not undo a resolution. Delivery is recorded (``notified_at``): an alert is sent
once per opening, and again only after it re-opens; a failed delivery stays pending.
Every function takes an explicit ``Session`` and commits its own unit of work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, col, select

from farm.errors import StoreError
from farm.notify.alert import (
    ALERT_STATES,
    SEVERITIES,
    AlertCandidate,
    AlertDetails,
    AlertRecord,
    AlertState,
)
from farm.store.repository import _require_sweep, _unit_of_work
from farm.store.tables import UTCDateTime, _Table

__all__ = [
    "AlertRow",
    "acknowledge",
    "get_alert",
    "list_alerts",
    "mark_notified",
    "pending_notifications",
    "raise_alerts",
    "resolve",
]


def _one_of(column: str, values: Sequence[str]) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({allowed})", name=column)


class AlertRow(_Table, table=True):
    """One alert; ``key`` is unique, so concurrent sweeps cannot duplicate it.

    The sweep references have no ON DELETE action: deleting a sweep that an alert
    cites fails instead of silently dropping the alert.
    """

    __tablename__ = "alert"
    __table_args__ = (
        sa.UniqueConstraint("key"),
        _one_of("state", ALERT_STATES),
        _one_of("severity", SEVERITIES),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str
    kind: str
    metric: str | None = None
    state: str = Field(index=True)
    severity: str
    summary: str = Field(sa_type=sa.Text)
    details: dict[str, Any] = Field(sa_type=sa.JSON)
    first_sweep_id: int = Field(foreign_key="sweep.id")
    last_sweep_id: int = Field(foreign_key="sweep.id")
    opened_sweep_id: int = Field(foreign_key="sweep.id")
    occurrences: int
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    acknowledged_by: str | None = None
    note: str | None = Field(default=None, sa_type=sa.Text)
    notified_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


def raise_alerts(
    session: Session, sweep_id: int, candidates: Sequence[AlertCandidate]
) -> list[AlertRecord]:
    """Insert or update one alert per candidate key; return them in candidate order.

    Candidates repeating a key are merged (the first wins). Raises StoreError when
    there is no sweep ``sweep_id``; nothing is written then. Safe to call again for the
    same sweep: nothing is duplicated and ``occurrences`` does not grow.
    """
    unique = list({c.key: c for c in reversed(candidates)}.values())[::-1]
    for attempt in range(2):
        try:
            return _raise(session, sweep_id, unique)
        except IntegrityError as exc:
            # Another process inserted one of these keys between our read and write;
            # the retry reads its row and updates it.
            if attempt:
                raise StoreError(
                    f"cannot record alerts of sweep {sweep_id}: {str(exc.orig).strip()}"
                ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _raise(
    session: Session, sweep_id: int, candidates: Sequence[AlertCandidate]
) -> list[AlertRecord]:
    now = datetime.now(UTC)
    with _unit_of_work(session):
        _require_sweep(session, sweep_id)
        keys = [c.key for c in candidates]
        existing = {
            r.key: r for r in session.exec(select(AlertRow).where(col(AlertRow.key).in_(keys)))
        }
        rows = []
        for c in candidates:
            row = existing.get(c.key)
            if row is None:
                row = _new_row(c, sweep_id, now)
            else:
                _update_row(row, c, sweep_id, now)
            session.add(row)
            rows.append(row)
        session.flush()
        records = [_record(r) for r in rows]
    return records


def _new_row(c: AlertCandidate, sweep_id: int, now: datetime) -> AlertRow:
    return AlertRow(
        key=c.key,
        kind=c.kind,
        metric=c.metric,
        state="open",
        severity=c.severity,
        summary=c.summary,
        details=c.details.model_dump(mode="json"),
        first_sweep_id=sweep_id,
        last_sweep_id=sweep_id,
        opened_sweep_id=sweep_id,
        occurrences=1,
        created_at=now,
        updated_at=now,
    )


def _update_row(row: AlertRow, c: AlertCandidate, sweep_id: int, now: datetime) -> None:
    newer = sweep_id > row.last_sweep_id
    if row.state == "resolved" and not newer:
        return
    if row.state == "resolved":
        row.state = "open"
        row.opened_sweep_id = sweep_id
        row.acknowledged_by = None
        row.notified_at = None
    if newer or sweep_id < row.first_sweep_id:
        row.occurrences += 1
    if sweep_id >= row.last_sweep_id:
        # The latest evidence describes the alert.
        row.severity = c.severity
        row.summary = c.summary
        row.details = c.details.model_dump(mode="json")
        row.metric = c.metric
    row.first_sweep_id = min(row.first_sweep_id, sweep_id)
    row.last_sweep_id = max(row.last_sweep_id, sweep_id)
    row.updated_at = now


def get_alert(session: Session, alert_id: int) -> AlertRecord:
    """One alert by id; StoreError when there is none."""
    return _record(_require_alert(session, alert_id))


def list_alerts(
    session: Session, state: AlertState | None = None, limit: int | None = None
) -> list[AlertRecord]:
    """Alerts, most recently updated first; only those in ``state`` when given."""
    query = select(AlertRow).order_by(col(AlertRow.updated_at).desc(), col(AlertRow.id).desc())
    if state is not None:
        if state not in ALERT_STATES:
            raise ValueError(f"state must be one of {ALERT_STATES}, not {state!r}")
        query = query.where(AlertRow.state == state)
    if limit is not None:
        query = query.limit(limit)
    return [_record(r) for r in session.exec(query)]


def pending_notifications(session: Session) -> list[AlertRecord]:
    """Open alerts not delivered since they were (re-)opened, oldest first: new ones,
    re-opened ones, and ones whose delivery failed before."""
    query = (
        select(AlertRow)
        .where(AlertRow.state == "open", col(AlertRow.notified_at).is_(None))
        .order_by(col(AlertRow.id))
    )
    return [_record(r) for r in session.exec(query)]


def mark_notified(session: Session, alert_ids: Sequence[int]) -> None:
    """Record that these alerts were delivered (now), so they are not sent again."""
    if not alert_ids:
        return
    with _unit_of_work(session):
        session.exec(
            sa.update(AlertRow)
            .where(col(AlertRow.id).in_(list(alert_ids)))
            .values(notified_at=datetime.now(UTC))
        )


def acknowledge(session: Session, alert_id: int, who: str, note: str | None = None) -> AlertRecord:
    """Mark an open (or already acknowledged) alert as seen by ``who``.

    An acknowledged alert that later sweeps raise again stays acknowledged and is not
    notified again. Raises StoreError for an unknown or resolved alert.
    """
    with _unit_of_work(session):
        row = _require_alert(session, alert_id)
        if row.state == "resolved":
            raise StoreError(
                f"alert {alert_id} is resolved; a newer sweep that shows it again re-opens it"
            )
        row.state = "acknowledged"
        row.acknowledged_by = who
        if note is not None:
            row.note = note
        row.updated_at = datetime.now(UTC)
        session.add(row)
        session.flush()
        record = _record(row)
    return record


def resolve(session: Session, alert_id: int, note: str | None = None) -> AlertRecord:
    """Close an open or acknowledged alert. Raises StoreError for an unknown or
    already resolved alert."""
    with _unit_of_work(session):
        row = _require_alert(session, alert_id)
        if row.state == "resolved":
            raise StoreError(f"alert {alert_id} is already resolved")
        row.state = "resolved"
        if note is not None:
            row.note = note
        row.updated_at = datetime.now(UTC)
        session.add(row)
        session.flush()
        record = _record(row)
    return record


def _require_alert(session: Session, alert_id: int) -> AlertRow:
    row = session.get(AlertRow, alert_id)
    if row is None:
        raise StoreError(f"no alert {alert_id}; `farm alerts list` lists alerts")
    return row


def _record(row: AlertRow) -> AlertRecord:
    assert row.id is not None, "alert row has no primary key yet"
    return AlertRecord.model_validate(
        {
            **row.model_dump(exclude={"details"}),
            "id": row.id,
            "details": AlertDetails.model_validate(row.details),
        }
    )

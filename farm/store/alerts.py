"""Alerts in SQL: one row per alert key, upserted by every sweep that shows it.

Typed records in and out (:mod:`farm.results.alerts`); ``AlertRow`` never leaves this
module. Lifecycle of an alert (states: :mod:`farm.results.alerts`)::

    untriaged --triage--> acknowledged | downstream     (open)
        |  \\--triage--> invalid | fixed                 (closed by a person)
        |  \\--a newer sweep compares it clean--> recovered   (closed by the farm)
        ^------ raised again by a *newer* sweep, from any closed state

Raising a key that is open updates it (latest sweep, figures) and keeps its triage;
when the newer evidence has a new cause (:func:`farm.results.alerts.news_of`) the
alert is notified again with what changed. A closed alert re-opens only when the
raising sweep is newer than the last sweep that showed it: re-analysing an old sweep
does not undo a triage. Delivery is recorded (``notified_at``): an alert is sent once
per opening, per new cause and on recovery; a failed delivery stays pending. Every
function takes an explicit ``Session`` and commits its own unit of work.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, col, select

from farm.errors import StoreError
from farm.results.alerts import (
    ALERT_STATES,
    CLOSED_STATES,
    OPEN_STATES,
    SEVERITIES,
    TRIAGE_STATES,
    AlertCandidate,
    AlertDetails,
    AlertRecord,
    AlertState,
    news_of,
)
from farm.store.base import _require_sweep, _unit_of_work
from farm.store.columns import read_column
from farm.store.tables import UTCDateTime, _Table

__all__ = [
    "AlertRow",
    "acknowledge",
    "get_alert",
    "list_alerts",
    "mark_notified",
    "pending_notifications",
    "raise_alerts",
    "recover_alerts",
    "resolve",
    "settle_early_alerts",
    "triage",
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
    triaged_by: str | None = None
    triaged_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    note: str | None = Field(default=None, sa_type=sa.Text)
    link: str | None = Field(default=None, sa_type=sa.Text)
    notified_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    news: str | None = Field(default=None, sa_type=sa.Text)
    recovered_sweep_id: int | None = Field(default=None, foreign_key="sweep.id")


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
        state="untriaged",
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
    closed = row.state in CLOSED_STATES
    if closed and not newer:
        return
    if closed:
        row.state = "untriaged"
        row.opened_sweep_id = sweep_id
        row.triaged_by = row.triaged_at = row.link = row.note = None
        row.notified_at = None
        row.news = None
        row.recovered_sweep_id = None
    elif newer:
        before = AlertDetails.model_validate(row.details)
        change = news_of(before, c.details)
        if change is not None:
            row.news = change
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
    session: Session,
    states: Collection[AlertState] | None = None,
    limit: int | None = None,
) -> list[AlertRecord]:
    """Alerts, most recently updated first; only those in ``states`` when given."""
    query = select(AlertRow).order_by(col(AlertRow.updated_at).desc(), col(AlertRow.id).desc())
    if states is not None:
        unknown = set(states) - set(ALERT_STATES)
        if unknown:
            raise ValueError(f"states must be among {ALERT_STATES}, not {sorted(unknown)}")
        query = query.where(col(AlertRow.state).in_(list(states)))
    if limit is not None:
        query = query.limit(limit)
    return [_record(r) for r in session.exec(query)]


def pending_notifications(session: Session) -> list[AlertRecord]:
    """Alerts not delivered since they last had news, oldest first: new and re-opened
    ones, open ones with a new cause, recovered ones, told ones withdrawn, and ones
    whose delivery failed
    before (:attr:`AlertRecord.needs_notification`)."""
    query = (
        select(AlertRow)
        .where(
            col(AlertRow.notified_at).is_(None),
            sa.or_(
                col(AlertRow.state).in_(("untriaged", "recovered")),
                sa.and_(
                    col(AlertRow.state).in_((*OPEN_STATES, "withdrawn")),
                    col(AlertRow.news).is_not(None),
                ),
            ),
        )
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
            .values(notified_at=datetime.now(UTC), news=None)
        )


def told_during(session: Session, sweep_id: int) -> list[AlertRecord]:
    """Alerts sweep ``sweep_id`` raised that were delivered since it started: what a
    night has told the channels so far. StoreError when there is no such sweep."""
    started = _require_sweep(session, sweep_id).started_at
    query = select(AlertRow).where(
        col(AlertRow.last_sweep_id) == sweep_id, col(AlertRow.notified_at) >= started
    )
    return [_record(r) for r in session.exec(query)]


def recover_alerts(
    session: Session, sweep_id: int, checked: Collection[tuple[str, str]], raised: Collection[str]
) -> list[AlertRecord]:
    """Close as ``recovered`` every open alert that sweep ``sweep_id`` (newer than the
    alert's last) compared again, by its check and key label in ``checked``, without
    raising it (its key not in ``raised``). Returns them; they are pending delivery
    (a recovery is notified once)."""
    if not checked:
        return []
    now = datetime.now(UTC)
    recovered = []
    with _unit_of_work(session):
        query = select(AlertRow).where(
            col(AlertRow.state).in_(OPEN_STATES), col(AlertRow.last_sweep_id) < sweep_id
        )
        for row in session.exec(query):
            if _compared_again(row, checked) and row.key not in raised:
                _recover(row, sweep_id, now)
                session.add(row)
                recovered.append(row)
        session.flush()
        records = [_record(r) for r in recovered]
    return records


def _compared_again(row: AlertRow, checked: Collection[tuple[str, str]]) -> bool:
    return (row.kind, AlertDetails.model_validate(row.details).cell.label) in checked


def _recover(row: AlertRow, sweep_id: int, now: datetime) -> None:
    row.state = "recovered"
    row.recovered_sweep_id = sweep_id
    row.news = f"recovered: sweep {sweep_id} compared it again and found no drop"
    row.notified_at = None
    row.updated_at = now


def settle_early_alerts(
    session: Session, sweep_id: int, checked: Collection[tuple[str, str]], raised: Collection[str]
) -> list[AlertRecord]:
    """At night ``sweep_id``'s end, the alerts its early per-cell checks raised that its
    verdict does not (their keys not in ``raised``): one the night opened is closed as
    ``withdrawn`` (pending delivery when it was told, so the channels hear it withdrawn;
    closed without a word when it never was); one open before the night, refreshed by an
    early check, is ``recovered`` when the verdict compared it again (its check and key
    label in ``checked``), as :func:`recover_alerts` would have. Returns them."""
    now = datetime.now(UTC)
    settled = []
    with _unit_of_work(session):
        query = select(AlertRow).where(
            col(AlertRow.state).in_(OPEN_STATES), col(AlertRow.last_sweep_id) == sweep_id
        )
        for row in session.exec(query):
            if row.key in raised:
                continue
            if row.opened_sweep_id == sweep_id and row.state == "untriaged":
                told = row.notified_at is not None
                row.state = "withdrawn"
                row.news = (
                    f"withdrawn: the verdict on sweep {sweep_id} did not confirm this early alert"
                    if told
                    else None
                )
                row.notified_at = None
                row.updated_at = now
            elif _compared_again(row, checked):
                _recover(row, sweep_id, now)
            else:
                continue
            session.add(row)
            settled.append(row)
        session.flush()
        records = [_record(r) for r in settled]
    return records


def triage(
    session: Session,
    alert_id: int,
    state: AlertState,
    who: str,
    reason: str | None = None,
    link: str | None = None,
    *,
    reclose: bool = True,
) -> AlertRecord:
    """Set alert ``alert_id``'s triage state (one of ``TRIAGE_STATES``) with who, why
    and a link (the bug, PR or bisection), and when. A closed alert may be re-triaged
    to another closed state, not re-opened by hand: a newer sweep that shows it again
    re-opens it; with ``reclose`` False, not re-triaged at all once closed. Raises
    StoreError for an unknown alert or a triage refused so."""
    if state not in TRIAGE_STATES:
        raise ValueError(f"state must be one of {TRIAGE_STATES}, not {state!r}")
    with _unit_of_work(session):
        row = _require_alert(session, alert_id)
        if row.state in CLOSED_STATES and state in OPEN_STATES:
            raise StoreError(
                f"alert {alert_id} is {row.state}; a newer sweep that shows it again re-opens it"
            )
        if row.state in CLOSED_STATES and not reclose:
            raise StoreError(f"alert {alert_id} is already {row.state}")
        now = datetime.now(UTC)
        row.state = state
        row.triaged_by = who
        row.triaged_at = now
        if reason is not None:
            row.note = reason
        if link is not None:
            row.link = link
        row.news = None  # triaged: whatever was news has been seen
        row.updated_at = now
        session.add(row)
        session.flush()
        record = _record(row)
    return record


def acknowledge(session: Session, alert_id: int, who: str, note: str | None = None) -> AlertRecord:
    """``triage(..., "acknowledged")``: someone is on it; it is not notified again
    unless its cause changes."""
    return triage(session, alert_id, "acknowledged", who, note)


def resolve(
    session: Session, alert_id: int, note: str | None = None, who: str | None = None
) -> AlertRecord:
    """``triage(..., "fixed")``. Raises StoreError for an unknown or closed alert."""
    return triage(session, alert_id, "fixed", who or "-", note, reclose=False)


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
            "details": read_column(
                AlertDetails, row.details, table="alert", row=row.id, column="details"
            ),
        }
    )

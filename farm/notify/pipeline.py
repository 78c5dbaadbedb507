"""The check-alert-notify stage: checks on a stored sweep -> alerts in the store ->
notifications to the configured channels.

`farm alerts check` calls :func:`check_and_notify`; so does a scheduled run after its
sweep. Imported as ``farm.notify.pipeline`` (not re-exported by ``farm.notify``: it
needs the store, and the store imports ``farm.notify``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict
from sqlmodel import Session

from farm.analysis.checks import check_sweep
from farm.analysis.history import analyze_histories
from farm.analysis.summary import patched_bases
from farm.analysis.verdicts import CheckConfig
from farm.notify.alert import AlertRecord
from farm.notify.candidates import alert_candidates_from_history, alert_candidates_from_report
from farm.notify.http import NotifyError
from farm.notify.registry import Notifier, configured_notifiers, send_all
from farm.store.alerts import mark_notified, pending_notifications, raise_alerts
from farm.store.repository import history_series, load_sweep

__all__ = ["AlertCheck", "check_and_notify", "send_pending"]


class AlertCheck(BaseModel):
    """What one check-alert-notify pass did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep_id: int
    comparisons: int
    findings: int
    raised: tuple[AlertRecord, ...] = ()  # every alert the sweep raised or refreshed
    fresh: tuple[AlertRecord, ...] = ()  # of those, the ones not yet notified
    sent: tuple[AlertRecord, ...] = ()  # pending alerts handed to the channels (any sweep)
    channels: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()  # one per failed channel, secrets masked

    @property
    def delivered(self) -> bool:
        """True when no channel failed (the sent alerts are marked notified)."""
        return not self.errors


def check_and_notify(
    session: Session,
    sweep_id: int,
    *,
    base_of: Mapping[str, str] | None = None,
    history: int = 0,
    config: CheckConfig | None = None,
    notifiers: Sequence[Notifier] | None = None,
) -> AlertCheck:
    """Run the checks on stored sweep ``sweep_id``, record alerts, notify pending ones.

    ``base_of`` maps patched engines to their base builds (default: inferred from the
    builds); ``history`` > 1 also looks for change points over that many sweeps of the
    job. ``notifiers`` default to the configured channels (``FARM_NOTIFY_*``); pass
    ``()`` to notify nobody. A failed channel leaves every alert pending: the next
    pass sends again, a duplicate in the channels that worked rather than silence.
    Raises StoreError (store), NotifyError (invalid channel settings).
    """
    record = load_sweep(session, sweep_id)
    report = check_sweep(record, base_of or patched_bases(record.builds), config or CheckConfig())
    candidates = alert_candidates_from_report(report, record)
    if history > 1:
        # Earlier sweeps from their per-variant summaries: no request is read.
        series = history_series(session, record, history)
        candidates += alert_candidates_from_history(analyze_histories(series), sweep_id)
    alerts = raise_alerts(session, sweep_id, candidates)
    channels = list(configured_notifiers() if notifiers is None else notifiers)
    pending, errors = send_pending(session, channels)
    return AlertCheck(
        sweep_id=sweep_id,
        comparisons=len(report.verdicts),
        findings=len(report.findings),
        raised=tuple(alerts),
        fresh=tuple(a for a in alerts if a.needs_notification),
        sent=tuple(pending),
        channels=tuple(n.name for n in channels),
        errors=tuple(str(e) for e in errors),
    )


def send_pending(
    session: Session, channels: Sequence[Notifier]
) -> tuple[list[AlertRecord], list[NotifyError]]:
    """Send every alert not yet delivered (whichever check raised it) to ``channels``;
    marked delivered only when every channel took them. The alerts sent and the
    channels' errors."""
    pending = pending_notifications(session) if channels else []
    errors = send_all(channels, pending)
    if pending and not errors:
        mark_notified(session, [a.id for a in pending])
    return pending, errors

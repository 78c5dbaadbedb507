"""`farm alerts check`'s step: judge a stored sweep as a nightly does
(:func:`farm.workflows.nightly.steps.judge_stored`), raise the alerts of its findings,
send the pending ones. Stores no verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict
from sqlmodel import Session

from farm.analysis.judgement import Judgement
from farm.goldens import GoldenCheck
from farm.notify.delivery import send_pending
from farm.notify.registry import Notifier, configured_notifiers
from farm.results.alerts import AlertRecord
from farm.store.alerts import (
    raise_alerts,
)
from farm.workflows.nightly.steps import Baseline, judge_stored, recover_compared

__all__ = ["AlertCheck", "check_alerts"]


class AlertCheck(BaseModel):
    """What one check-alert-notify pass (``farm alerts check``) did."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    sweep_id: int
    judgement: Judgement
    raised: tuple[AlertRecord, ...] = ()  # every alert the sweep raised or refreshed
    recovered: tuple[AlertRecord, ...] = ()  # open alerts the sweep compared clean
    fresh: tuple[AlertRecord, ...] = ()  # of those, the ones not yet notified
    sent: tuple[AlertRecord, ...] = ()  # pending alerts handed to the channels (any sweep)
    channels: tuple[str, ...] = ()
    delivered_to: tuple[str, ...] = ()  # the channels that took the sent alerts
    errors: tuple[str, ...] = ()  # one per failed channel, secrets masked

    @property
    def comparisons(self) -> int:
        return self.judgement.comparisons

    @property
    def findings(self) -> int:
        """How many regressions were found (failed cells are not counted)."""
        return len(self.judgement.regressions)

    @property
    def delivered(self) -> bool:
        """True when no channel failed (the sent alerts are marked notified)."""
        return not self.errors


def check_alerts(
    session: Session,
    sweep_id: int,
    *,
    baseline: Baseline = "last-good",
    base_of: Mapping[str, str] | None = None,
    history: int = 0,
    notifiers: Sequence[Notifier] | None = None,
    goldens: Sequence[GoldenCheck] = (),
) -> AlertCheck:
    """Judge stored sweep ``sweep_id`` (:func:`judge_stored`), record its alerts, notify
    pending ones. Stores no verdict: a nightly's verdict is the nightly's.

    ``notifiers`` default to the configured channels (``FARM_NOTIFY_*``); pass ``()``
    to notify nobody. A failed channel leaves every alert pending: the next pass sends
    again, a duplicate in the channels that worked rather than silence. Raises
    StoreError (store), NotifyError (invalid channel settings).
    """
    night = judge_stored(
        session,
        sweep_id,
        baseline=baseline,
        history=history,
        base_of=base_of,
        goldens=goldens,
    )
    alerts = raise_alerts(session, sweep_id, night.alerts)
    recovered = recover_compared(session, sweep_id, night)
    channels = list(configured_notifiers() if notifiers is None else notifiers)
    pending, took, errors = send_pending(session, channels)
    return AlertCheck(
        sweep_id=sweep_id,
        judgement=night.judgement,
        raised=tuple(alerts),
        recovered=tuple(recovered),
        fresh=tuple(a for a in alerts if a.needs_notification),
        sent=tuple(pending),
        channels=tuple(n.name for n in channels),
        delivered_to=tuple(took),
        errors=tuple(str(e) for e in errors),
    )

"""`farm alerts check`'s step: judge a stored sweep as a nightly does
(:func:`farm.workflows.nightly.steps.judge_stored`), raise the alerts of its findings,
send the pending ones. Stores no verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict
from sqlmodel import Session

from farm.analysis.judgement import Judgement
from farm.errors import FarmError, SpecError
from farm.frozen import Frozen
from farm.notify.delivery import send_pending
from farm.notify.registry import Notifier, configured_notifiers
from farm.results.alerts import AlertRecord
from farm.spec.goldens import GoldenCheck
from farm.store.alerts import (
    raise_alerts,
)
from farm.workflows.nightly.steps import Baseline, judge_stored, recover_compared

__all__ = ["AlertCheck", "JudgedAs", "check_alerts", "judged_as_nightly"]


class AlertCheck(Frozen):
    """What one check-alert-notify pass (``farm alerts check``) did."""

    # ``judgement`` is a plain dataclass, taken as it is rather than validated.
    model_config = ConfigDict(arbitrary_types_allowed=True)

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


@dataclass(frozen=True)
class JudgedAs:
    """What `alerts check` takes from the sweep's job, as `farm nightly` would."""

    history: int
    goldens: tuple[GoldenCheck, ...]
    source: str  # where the settings came from
    unchecked_goldens: int = 0  # goldens the stored job names that cannot be read

    def describe(self) -> str:
        text = f"judged as farm nightly does: history {self.history} sweep(s) ({self.source})"
        if self.goldens:
            text += f", {len(self.goldens)} golden check(s)"
        if self.unchecked_goldens:
            text += (
                f"; the job names {self.unchecked_goldens} golden file(s), not checked "
                "without --job FILE"
            )
        return text


def judged_as_nightly(
    session: Session, sweep_id: int, job_file: Path | None, history: int | None
) -> JudgedAs:
    """The history and goldens of the sweep's job: from ``job_file`` (FarmError when it
    is another job's), else from the job text stored with the sweep (its goldens'
    paths were relative to a file the store does not know: they are named, not read);
    ``history`` given wins."""
    from farm.spec import read_job
    from farm.spec.files import parse_job
    from farm.spec.goldens import job_goldens
    from farm.store.sweeps import sweep_job

    job, stored_yaml = sweep_job(session, sweep_id)
    goldens: tuple[GoldenCheck, ...] = ()
    unchecked = 0
    if job_file is not None:
        checked = read_job(job_file)
        if checked.spec.name != job:
            raise FarmError(
                f"--job {job_file}: that is job {checked.spec.name!r}; sweep {sweep_id} "
                f"is of job {job!r}"
            )
        configured, goldens = checked.spec.nightly.history, job_goldens(checked)
        source = f"nightly.history of {job_file}"
    else:
        try:
            spec = parse_job(stored_yaml, f"sweep {sweep_id}'s job")
        except SpecError:  # a job text the farm of today cannot read: nothing taken
            configured = 0
            source = "its stored job text cannot be read; give --job FILE or --history"
        else:
            configured, unchecked = spec.nightly.history, len(spec.goldens)
            source = "nightly.history of the job stored with the sweep"
    if history is not None:
        configured, source = history, "--history"
    return JudgedAs(history=configured, goldens=goldens, source=source, unchecked_goldens=unchecked)

"""The I/O around a nightly's verdict: read the store, judge, raise alerts, store the
verdict, notify, publish the report folder.

:func::func:`check_landed_cell` raises and sends a cell's alerts as soon as the cell is
stored, while the night still runs; :func:`check_night` is the whole check of a stored
sweep, once: a sweep whose nightly
verdict is already stored is not judged, alerted or notified again (a rerun of the
same night changes nothing). Order of the writes: alerts (idempotent per sweep), then
the verdict (unique per sweep and kind), then the notifications of pending alerts
(each marked when delivered). A driver killed between two of them leaves nothing
that a rerun would duplicate: alerts are upserted, an alert not delivered stays
pending and the next check (any sweep's, or ``farm alerts check``) sends it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import ConfigDict
from sqlmodel import Session

from farm.analysis.alert_rules import cell_alert_keys
from farm.analysis.check_rules import CheckReport
from farm.analysis.judgement import Judgement
from farm.analysis.noise import (
    NoiseRule,
    QuarantineRule,
    key_noise,
    look_calibration,
    quarantined,
)
from farm.analysis.rules import night_rules
from farm.analysis.summary import patched_bases, summarize_sweep
from farm.comparable import ComparableKey
from farm.errors import FarmError, OutputError
from farm.frozen import Frozen
from farm.notify.delivery import deliver, send_pending
from farm.notify.registry import Notifier, configured_notifiers
from farm.records import SweepRecord
from farm.report.html import render_html, render_verdict_index
from farm.results.alerts import AlertRecord
from farm.results.verdict import SweepVerdict
from farm.runner import ReferenceRun, reference_runs
from farm.spec.goldens import GoldenCheck
from farm.store.alerts import (
    mark_notified,
    raise_alerts,
    recover_alerts,
    settle_early_alerts,
    told_during,
)
from farm.store.cells import load_sweep
from farm.store.history import history_series, job_history_series
from farm.store.summaries import SweepCost, job_sweeps, sweep_cost
from farm.store.sweeps import sweep_job, sweep_job_status
from farm.store.verdicts import get_verdict, job_verdicts, record_verdict, verdict_outcomes
from farm.workflows.common import CellStored, Progress, run_stored, store_session, write_page
from farm.workflows.nightly.decide import (
    EarlierNight,
    NightJudgement,
    aa_builds_differ,
    judge_night,
    last_good_night,
)
from farm.workflows.nightly.spread import store_night_spread

if TYPE_CHECKING:
    from farm.orchestrate.driver import SweepOptions, SweepOutcome
    from farm.spec import JobSpec

__all__ = [
    "Baseline",
    "CellAlerts",
    "NightlyCheck",
    "check_aa_night",
    "check_landed_cell",
    "check_night",
    "earlier_nights",
    "flaky_keys",
    "judge_stored",
    "last_good_id",
    "night_runner",
    "publish_night",
    "recover_compared",
    "sequential_references",
    "sweep_status",
]

# What a stored sweep is judged against: the job's last good night (as the nightly
# does), a given sweep (by id, or read already), or nothing.
Baseline = Literal["last-good"] | int | SweepRecord | None


class NightlyCheck(Frozen):
    """What one check of a night did; ``judged`` is False when its verdict was stored
    before (nothing was raised or sent then)."""

    # ``judgement`` is a plain dataclass, taken as it is rather than validated.
    model_config = ConfigDict(arbitrary_types_allowed=True)

    verdict: SweepVerdict
    judged: bool
    cost: SweepCost | None = None
    judgement: Judgement | None = None
    raised: tuple[AlertRecord, ...] = ()
    recovered: tuple[AlertRecord, ...] = ()  # open alerts this night compared clean
    # Early per-cell alerts of this night that its verdict did not confirm.
    withdrawn: tuple[AlertRecord, ...] = ()
    sent: tuple[AlertRecord, ...] = ()
    channels: tuple[str, ...] = ()
    delivered_to: tuple[str, ...] = ()  # the channels that took the sent alerts
    errors: tuple[str, ...] = ()
    # The key spread could not be stored (the verdict is; a rerun stores it).
    spread_error: str | None = None


def recover_compared(session: Session, sweep_id: int, night: NightJudgement) -> list[AlertRecord]:
    """Close the open alerts this sweep compared again without raising them."""
    raised = {c.key for c in night.alerts}
    return recover_alerts(session, sweep_id, night.judgement.checked, raised)


def earlier_nights(session: Session, job: str, sweep_id: int) -> list[EarlierNight]:
    outcomes = verdict_outcomes(session, job, "nightly", sweep_id)
    aa = verdict_outcomes(session, job, "aa", sweep_id)
    return [
        EarlierNight(sweep_id=s.id, status=s.status, verdict=outcomes.get(s.id), aa=s.id in aa)
        for s in job_sweeps(session, job, before=sweep_id)
    ]


def last_good_id(session: Session, sweep_id: int) -> int | None:
    """The last good night before night ``sweep_id`` (its cells are not read)."""
    job, _ = sweep_job(session, sweep_id)
    return last_good_night(sweep_id, earlier_nights(session, job, sweep_id))


def sequential_references(
    session: Session, sweep_id: int, history: int = 0, noise: NoiseRule | None = None
) -> dict[ComparableKey, ReferenceRun]:
    """The variants of night ``sweep_id``'s last good night, by comparable key: what its
    workloads with ``sequential`` looks are paired with. Empty on a job's first night.
    With ``history`` (> 1 sweeps, as the night will be judged) and ``noise``, each key
    with enough nights carries the calibrated rule its night will be judged by
    (:func:`farm.analysis.noise.look_calibration`), so that its looks decide by it."""
    good = last_good_id(session, sweep_id)
    if good is None:
        return {}
    references = reference_runs((good, stored) for stored in load_sweep(session, good).cells)
    if history <= 1 or noise is None:
        return references
    job, _ = sweep_job(session, sweep_id)
    series = job_history_series(session, job, sweep_id, history)
    spread = key_noise(series, sweep_id, good, noise)
    return {
        key: ref.model_copy(update={"calibration": look_calibration(spread.get(key), noise)})
        for key, ref in references.items()
    }


def sweep_status(session: Session, job: str, sweep_id: int) -> str | None:
    """The status of sweep ``sweep_id`` of ``job``, from its row alone (no cell
    is read); None when the sweep is another job's. StoreError when there is no such
    sweep."""
    name, status = sweep_job_status(session, sweep_id)  # StoreError when there is none
    return status if name == job else None


def night_runner(
    job: JobSpec,
    job_text: str,
    options: SweepOptions,
    *,
    history: int,
    progress: Progress,
    then: str,
    told: Callable[[SweepOutcome], None] | None = None,
) -> Callable[[int | None, CellStored], int]:
    """What runs the night's sweep (None) or finishes sweep N, telling each stored cell,
    and returns its id: ``options`` with the sweep to resume and, when a workload looks
    sequentially, the last good night's runs to pair with under each key's calibrated
    rule over the ``history`` sweeps the night is judged with
    (:func:`sequential_references`). ``progress``, ``told`` and ``then``: as
    :func:`farm.workflows.common.run_stored`."""
    looks = any(w.sequential is not None for w in job.workloads)

    def references(sweep: int) -> dict[ComparableKey, ReferenceRun]:
        with store_session(options.db_url) as session:
            return sequential_references(session, sweep, history, NoiseRule())

    def run(resume: int | None, stored: CellStored) -> int:
        update = {"resume": resume, "references": references if looks else None}
        return run_stored(
            job,
            job_text,
            options.model_copy(update=update),
            then=then,
            progress=progress,
            stored=stored,
            told=told,
        )

    return run


def judge_stored(
    session: Session,
    sweep_id: int,
    *,
    baseline: Baseline = "last-good",
    history: int = 0,
    base_of: Mapping[str, str] | None = None,
    goldens: Sequence[GoldenCheck] = (),
    record: SweepRecord | None = None,
) -> NightJudgement:
    """Judge stored sweep ``sweep_id`` as a nightly does, writing nothing: against
    ``baseline`` (``last-good``: the job's last good night), over ``history`` sweeps of
    the job (> 1 to look for change points), patches against ``base_of`` (default:
    inferred from the builds), and against the job's ``goldens``. ``farm nightly``,
    ``farm alerts check`` and the published pages all judge through here. Raises
    StoreError (store), FarmError when ``base_of`` names an engine the sweep did not
    run. ``record``: the sweep, when the caller read it already."""
    record = record if record is not None else load_sweep(session, sweep_id)
    if base_of:
        ran = {c.cell.engine for c in record.cells}
        unknown = sorted({n for pair in base_of.items() for n in pair} - ran)
        if unknown:
            raise FarmError(
                f"--base-of: sweep {sweep_id} ran no engine {', '.join(map(repr, unknown))} "
                f"(it ran {', '.join(sorted(ran)) or 'none'})"
            )
    if baseline == "last-good":
        baseline = last_good_night(sweep_id, earlier_nights(session, record.job, sweep_id))
    if isinstance(baseline, int):
        baseline = load_sweep(session, baseline)
    rules = night_rules(
        base_of=base_of or patched_bases(record.builds),
        quarantine=flaky_keys(session, record.job, record.sweep_id),
        goldens=goldens,
    )
    return judge_night(
        record,
        last_good=baseline,
        history=history_series(session, record, history) if history > 1 else None,
        rules=rules,
    )


def flaky_keys(
    session: Session, job: str, before: int | None = None, rule: QuarantineRule | None = None
) -> dict[str, float]:
    """The keys of nightly ``job`` whose verdicts flipped too often before sweep
    ``before`` (None: all of its nights so far; :func:`farm.analysis.noise.quarantined`),
    with their flip rates: known before a night or a PR runs. Reads the job's last
    ``rule.window`` verdicts and per-variant summaries only."""
    rule = rule or QuarantineRule()
    verdicts = {
        v.sweep_id: v
        for v in job_verdicts(session, job, "nightly", limit=rule.window + 1)
        if before is None or v.sweep_id < before
    }
    if len(verdicts) < rule.min_nights:
        return {}
    last = max(verdicts) if before is None else before
    series = job_history_series(session, job, last, rule.window + 1)
    judged: dict[int, set[str]] = {}
    for key, points in series.items():
        for p in points:
            judged.setdefault(p.sweep_id, set()).add(key.label)
    nights = [
        (
            frozenset(judged.get(sweep_id, ())),
            frozenset(
                f.key.label for f in verdict.findings if f.key is not None and f.source != "cells"
            ),
        )
        for sweep_id, verdict in sorted(verdicts.items())
    ]
    return quarantined(nights, rule)


def check_night(
    session: Session,
    sweep_id: int,
    *,
    history: int,
    notifiers: Sequence[Notifier] | None = None,
    goldens: Sequence[GoldenCheck] = (),
    record: SweepRecord | None = None,
    baseline: Baseline = "last-good",
) -> NightlyCheck:
    """Judge stored sweep ``sweep_id`` as a nightly once; raise, store, notify.

    ``history``: how many of the job's sweeps (this one included) the change-point
    checks read; ``notifiers`` default to the configured channels (``FARM_NOTIFY_*``),
    ``()`` notifies nobody; ``goldens``: the job's (:func:`farm.spec.goldens.job_goldens`);
    ``record``: the sweep, when read already; ``baseline``: the last good night, when
    read already. Raises StoreError (store), NotifyError (invalid channel settings).
    """
    if get_verdict(session, sweep_id, "aa") is not None:
        raise FarmError(
            f"sweep {sweep_id} is an A/A night (its verdict is stored as one): "
            "`farm nightly JOB --aa --resume ID` shows it"
        )
    stored = get_verdict(session, sweep_id, "nightly")
    cost = sweep_cost(session, sweep_id)
    if stored is not None:
        return _judged_before(session, stored, cost, history, record)
    channels = list(configured_notifiers() if notifiers is None else notifiers)
    night = judge_stored(
        session, sweep_id, baseline=baseline, history=history, goldens=goldens, record=record
    )
    raised = raise_alerts(session, sweep_id, night.alerts)
    recovered = recover_compared(session, sweep_id, night)
    settled = settle_early_alerts(
        session, sweep_id, night.judgement.checked, {c.key for c in night.alerts}
    )
    recovered += [a for a in settled if a.state == "recovered"]
    verdict, new = record_verdict(session, night.verdict)
    if not new:
        # Another driver judged this night first: it raises and sends, not us.
        return NightlyCheck(verdict=verdict, judged=False, cost=cost)
    pending, took, errors = send_pending(session, channels)
    return NightlyCheck(
        verdict=verdict,
        judged=True,
        cost=cost,
        judgement=night.judgement,
        raised=tuple(raised),
        recovered=tuple(recovered),
        withdrawn=tuple(a for a in settled if a.state == "withdrawn"),
        sent=tuple(pending),
        channels=tuple(n.name for n in channels),
        delivered_to=tuple(took),
        errors=tuple(str(e) for e in errors),
        spread_error=store_night_spread(session, sweep_id, history, record=record),
    )


def _judged_before(
    session: Session,
    stored: SweepVerdict,
    cost: SweepCost,
    history: int,
    record: SweepRecord | None = None,
) -> NightlyCheck:
    """A night whose verdict is stored: that verdict, and its key spread stored if the
    first run could not."""
    spread_error = store_night_spread(
        session, stored.sweep_id, history, only_if_missing=True, record=record
    )
    return NightlyCheck(verdict=stored, judged=False, cost=cost, spread_error=spread_error)


def check_aa_night(
    session: Session,
    sweep_id: int,
    *,
    history: int,
    goldens: Sequence[GoldenCheck] = (),
    record: SweepRecord | None = None,
) -> NightlyCheck:
    """Judge stored sweep ``sweep_id`` as an A/A night once: against the job's last
    good night, by :func:`judge_stored` as every night; its verdict stored with kind
    ``aa`` (its findings are false alarms), nothing raised, recovered or sent, and the
    key spread stored. Raises FarmError when the sweep ran other builds than that
    night or there is none (nothing stored: the sweep stays unjudged), or the sweep
    was judged as a nightly; StoreError (store)."""
    if get_verdict(session, sweep_id, "nightly") is not None:
        raise FarmError(f"sweep {sweep_id} was judged as a nightly: it is not an A/A night")
    cost = sweep_cost(session, sweep_id)
    stored = get_verdict(session, sweep_id, "aa")
    if stored is not None:
        return _judged_before(session, stored, cost, history, record)
    good = last_good_id(session, sweep_id)
    if good is None:
        raise FarmError(f"sweep {sweep_id}: --aa repeats the last good night; the job has none")
    baseline = load_sweep(session, good)
    night = judge_stored(
        session, sweep_id, baseline=baseline, history=history, goldens=goldens, record=record
    )
    differ = aa_builds_differ(
        night.judgement.builds, {b.engine: b.build_id for b in baseline.builds}, good
    )
    if differ is not None:
        raise FarmError(
            f"sweep {sweep_id}: {differ}; it stays unjudged (`farm nightly JOB --resume "
            f"{sweep_id}` judges it as a real night)"
        )
    verdict, new = record_verdict(session, night.judgement.verdict("aa"))
    return NightlyCheck(
        verdict=verdict,
        judged=new,
        cost=cost,
        judgement=night.judgement if new else None,
        spread_error=(
            store_night_spread(session, sweep_id, history, record=record) if new else None
        ),
    )


class CellAlerts(Frozen):
    """What the check of one cell stored during a night did (:func:`check_landed_cell`)."""

    cell_id: str
    raised: tuple[AlertRecord, ...] = ()  # the cell's alerts, raised or refreshed
    sent: tuple[AlertRecord, ...] = ()  # handed to the channels now
    held: tuple[AlertRecord, ...] = ()  # of a cause told earlier this night: sent at its end
    delivered_to: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    sent_after_s: float | None = None  # from the cell's end to the channels' answer
    failed: str | None = None  # the check could not run; the night's end checks again


def check_landed_cell(
    session: Session,
    sweep_id: int,
    cell_id: str,
    *,
    notifiers: Sequence[Notifier] | None = None,
    baseline: Baseline = "last-good",
    history: int = 0,
    goldens: Sequence[GoldenCheck] = (),
) -> CellAlerts:
    """Raise the alerts of ``cell_id``, just stored in running sweep ``sweep_id``, and
    send the new ones whose cause this night has not told yet.

    The cells stored so far are judged as the night's end will judge them
    (:func:`judge_stored` with the night's ``history`` depth and ``goldens``: the same
    rules, calibration and quarantine); only the findings on ``cell_id`` raise. What
    the night's verdict does not confirm, its end withdraws
    (:func:`farm.store.alerts.settle_early_alerts`).
    An alert of a cause already told this night waits for the night's end, where
    :func:`check_night` raises every alert again (nothing duplicates: alerts are
    upserted per key, a delivered one is not sent again) and sends what is pending as
    one message per cause. Writes no verdict and recovers nothing. Raises StoreError
    (store), NotifyError (invalid channel settings).
    """
    night = judge_stored(session, sweep_id, baseline=baseline, history=history, goldens=goldens)
    keys = cell_alert_keys(night.judgement, cell_id)
    mine = [c for c in night.alerts if c.key in keys]
    if not mine:
        return CellAlerts(cell_id=cell_id)
    raised = raise_alerts(session, sweep_id, mine)
    told = {a.cause for a in told_during(session, sweep_id)}
    fresh = [a for a in raised if a.needs_notification]
    now = [a for a in fresh if a.cause not in told]
    channels = list(configured_notifiers() if notifiers is None else notifiers)
    took, errors = deliver(channels, now) if channels and now else ([], [])
    if now and channels and not errors:
        mark_notified(session, [a.id for a in now])
    return CellAlerts(
        cell_id=cell_id,
        raised=tuple(raised),
        sent=tuple(now) if channels else (),
        held=tuple(a for a in fresh if a.cause in told),
        delivered_to=tuple(took),
        errors=tuple(str(e) for e in errors),
    )


def publish_night(
    session: Session,
    check: NightlyCheck,
    folder: Path,
    *,
    history: int = 14,
    record: SweepRecord | None = None,
) -> list[Path]:
    """Write ``sweep-<id>.html`` (the report with its verdict), ``latest.html`` (when
    this is the job's newest judged night) and ``index.html`` (the job's nights with
    their verdicts) into ``folder`` (created), from the night's judgement (judged again,
    writing nothing, when ``check`` carries none; ``record``: the sweep, when read
    already). Returns the paths written; raises
    OutputError when the folder cannot be written, StoreError (store).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the publish folder {folder}: {exc.strerror}") from None
    verdict = check.verdict
    judgement = check.judgement
    if judgement is None:
        judgement = judge_stored(
            session, verdict.sweep_id, history=history, record=record
        ).judgement
    if record is None:
        record = load_sweep(session, verdict.sweep_id)
    page = render_html(
        record,
        summarize_sweep(record),
        judgement.within or CheckReport(sweep_id=record.sweep_id, verdicts=(), notes=()),
        judgement.series,
        verdict=verdict,
        cost=(check.cost or sweep_cost(session, verdict.sweep_id)).describe(),
    )
    own = folder / f"sweep-{record.sweep_id}.html"
    write_page(own, page)
    written = [own]
    nights = job_verdicts(session, record.job, "nightly", limit=500)
    if nights and nights[0].sweep_id == record.sweep_id:
        write_page(folder / "latest.html", page)
        written.append(folder / "latest.html")
    published = [v for v in nights if (folder / f"sweep-{v.sweep_id}.html").exists()]
    write_page(folder / "index.html", render_verdict_index(record.job, published))
    written.append(folder / "index.html")
    return written

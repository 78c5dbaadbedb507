"""`farm nightly` as one workflow: run (or finish) the job's sweep with the early
per-cell checks beside it, judge it once, raise, notify, publish.

:func:`run_nightly` is a short driver over the steps of :mod:`farm.workflows.nightly.steps`;
the CLI reads the job into a :class:`NightlyRequest`, hands the I/O it owns (the sweep's
progress display, the console) as :class:`NightlyDeps`, and prints the
:class:`NightlyOutcome`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from sqlmodel import Session

from farm.analysis.confirm import ConfirmRule
from farm.errors import FarmError, OutputError
from farm.masking import mask_secrets
from farm.notify.delivery import EXIT_UNDELIVERED
from farm.notify.registry import Notifier
from farm.records import SweepRecord
from farm.spec.goldens import GoldenCheck
from farm.store.builds import sweep_builds
from farm.store.cells import load_sweep
from farm.store.sweeps import latest_job_sweep_id
from farm.store.verdicts import get_verdict
from farm.workflows.common import CellStored
from farm.workflows.nightly.confirm import ConfirmNight, confirm_night
from farm.workflows.nightly.decide import (
    aa_builds_differ,
    last_good_night,
)
from farm.workflows.nightly.steps import (
    Baseline,
    CellAlerts,
    NightlyCheck,
    check_aa_night,
    check_landed_cell,
    check_night,
    earlier_nights,
    last_good_id,
    publish_night,
    sweep_status,
)

__all__ = [
    "CellStored",
    "EarlyChecks",
    "NightlyDeps",
    "NightlyOutcome",
    "NightlyRequest",
    "run_nightly",
]


# Statuses of a sweep whose every cell ran: nothing left for --resume to run.
_FINISHED = ("ok", "failed")


@dataclass(frozen=True)
class NightlyRequest:
    """What `farm nightly` was asked: the job's name, the store, the sweep to resume
    (an id, ``latest`` of the job, or None for a new sweep), the history checks' depth,
    whether to notify, the report folder, the goldens the job names, and whether the
    night is an A/A night (``--aa``: the last good night's builds again, judged as
    every night, its findings false alarms: nothing alerted or notified)."""

    job: str
    url: str
    history: int
    resume: int | Literal["latest"] | None = None
    notify: bool = True
    folder: Path | None = None
    goldens: tuple[GoldenCheck, ...] = ()
    aa: bool = False


def _ignore(checked: CellAlerts) -> None:
    pass


def _not_shown(record: SweepRecord) -> None:
    pass


@dataclass(frozen=True)
class NightlyDeps:
    """The I/O a nightly is handed: ``run_sweep`` runs a new sweep (None) or finishes
    one, calling back as each cell is stored, and returns its id; ``check_resume``
    refuses a sweep another job or slice started; ``judged`` is told the check as soon
    as the verdict exists, ``cell_checked`` each stored cell's early check, ``swept``
    the sweep this run ran, as read once for its verdict."""

    open_session: Callable[[str], AbstractContextManager[Session]]
    run_sweep: Callable[[int | None, CellStored], int]
    check_resume: Callable[[int], None]
    judged: Callable[[NightlyCheck], None]
    cell_checked: Callable[[CellAlerts], None] = _ignore
    swept: Callable[[SweepRecord], None] = _not_shown
    notifiers: Sequence[Notifier] | None = None  # None: the channels FARM_NOTIFY_* sets
    # An A/A night's builds before it runs (engine -> build id, None: unresolved), held
    # to the last good night's; None: checked once the sweep is stored only.
    planned_builds: Callable[[], Mapping[str, str | None]] | None = None
    # Reruns a night's suspicious cells before its judgement (farm.workflows.nightly.
    # confirm); None: the night confirms nothing.
    confirm: ConfirmNight | None = None
    confirm_rule: ConfirmRule | None = None  # None: the default (farm.analysis.confirm)


@dataclass(frozen=True)
class NightlyOutcome:
    """What the night did: its check (verdict, alerts, notifications), pages written."""

    check: NightlyCheck
    pages: tuple[Path, ...] = ()
    page_error: str | None = None  # the pages could not be written (the verdict is stored)

    @property
    def exit_status(self) -> int:
        """:data:`~farm.notify.delivery.EXIT_UNDELIVERED` when a channel failed, else the
        verdict's status; 2 when a clean night's pages could not be written."""
        if self.check.errors:
            return EXIT_UNDELIVERED
        return self.check.verdict.exit_status or (2 if self.page_error else 0)


def run_nightly(request: NightlyRequest, deps: NightlyDeps) -> NightlyOutcome:
    """Run (or finish) the job's sweep, confirm its suspicious cells
    (:func:`confirm_night`), judge it once, raise, notify, publish. A night
    already judged is not run or judged again. FarmError for a sweep to resume that does
    not exist or is not this job's, or results that were not stored. Each cell's
    alerts are raised and sent as the cell is stored (:func:`check_landed_cell`). An
    A/A night (``request.aa``) raises and sends nothing (:func:`check_aa_night`);
    FarmError, before anything runs, when its planned builds are not the last good
    night's."""
    notifiers = deps.notifiers if request.notify else ()
    kind: Literal["nightly", "aa"] = "aa" if request.aa else "nightly"
    # The last good night does not change while the night runs: read once.
    last_good: dict[int, SweepRecord | None] = {}

    def check_cell(sweep: int, cell_id: str, ended: datetime) -> None:
        try:
            with deps.open_session(request.url) as session:
                if sweep not in last_good:
                    good = last_good_id(session, sweep)
                    last_good[sweep] = load_sweep(session, good) if good is not None else None
                checked = check_landed_cell(
                    session,
                    sweep,
                    cell_id,
                    notifiers=notifiers,
                    baseline=last_good[sweep],
                    history=request.history,
                    goldens=request.goldens,
                )
        except Exception as exc:  # early and best effort: never sinks the sweep
            failed = mask_secrets(f"{type(exc).__name__}: {exc}")
            checked = CellAlerts(cell_id=cell_id, failed=failed)
        if checked.sent:
            after = (datetime.now(UTC) - ended).total_seconds()
            checked = checked.model_copy(update={"sent_after_s": after})
        deps.cell_checked(checked)

    # An A/A night's findings are false alarms: no early alert either.
    with EarlyChecks(None if request.aa else check_cell) as landed:
        sweep_id, ran, judged = _run_or_resume(request, deps, kind, landed)
    baseline: Baseline = last_good.get(sweep_id, "last-good")
    # An A/A night's findings are false alarms as they stand: nothing to confirm.
    record = None
    if not judged and not request.aa and deps.confirm is not None:
        record = confirm_night(
            request.url,
            sweep_id,
            deps.confirm,
            history=request.history,
            goldens=request.goldens,
            baseline=baseline,
            rule=deps.confirm_rule,
        )
    return _judge_and_publish(request, deps, sweep_id, ran, judged, notifiers, baseline, record)


def _judge_and_publish(
    request: NightlyRequest,
    deps: NightlyDeps,
    sweep_id: int,
    ran: bool,
    judged: bool,
    notifiers: Sequence[Notifier] | None,
    baseline: Baseline,
    record: SweepRecord | None = None,
) -> NightlyOutcome:
    """Judge the night once (``judged``: its verdict was stored before), tell
    ``deps.judged``, write its pages. The sweep is read once here (or is ``record``, as
    the confirmations read it when they stored nothing) and handed to every step that
    reads it (shown when this run ``ran`` it, judged, its key spread, its page); a
    night judged before is read only if its spread or page is missing."""
    pages: list[Path] = []
    page_error: str | None = None
    with deps.open_session(request.url) as session:
        if record is None and not judged:
            record = load_sweep(session, sweep_id)
        if ran and record is not None:
            deps.swept(record)
        if request.aa:
            check = check_aa_night(
                session, sweep_id, history=request.history, goldens=request.goldens, record=record
            )
        else:
            check = check_night(
                session,
                sweep_id,
                history=request.history,
                notifiers=notifiers,
                goldens=request.goldens,
                record=record,
                baseline=baseline,
            )
        deps.judged(check)
        folder = request.folder
        # A night judged before whose page was never written (the folder failed then)
        # gets its page now.
        if folder is not None and (
            check.judged or not (folder / f"sweep-{sweep_id}.html").exists()
        ):
            try:
                pages = publish_night(
                    session, check, folder, history=request.history, record=record
                )
            except OutputError as exc:
                page_error = str(exc)
    return NightlyOutcome(check=check, pages=tuple(pages), page_error=page_error)


def _run_or_resume(
    request: NightlyRequest,
    deps: NightlyDeps,
    kind: Literal["nightly", "aa"],
    landed: CellStored,
) -> tuple[int, bool, bool]:
    """Run the night's sweep, or finish the one ``--resume`` names unless it is finished
    or judged; its id, whether it ran now, and whether its verdict was stored before.
    A sweep's status is a status query (:func:`sweep_status`): no cell is read."""
    sweep_id = _resume_id(request, deps)
    if sweep_id is None:
        _check_aa_builds(request, deps, None)
        return deps.run_sweep(None, landed), True, False
    with deps.open_session(request.url) as session:
        status = sweep_status(session, request.job, sweep_id)
        judged = get_verdict(session, sweep_id, kind) is not None
    if not judged:
        deps.check_resume(sweep_id)
    if status not in _FINISHED and not judged:
        _check_aa_builds(request, deps, sweep_id)
        return deps.run_sweep(sweep_id, landed), True, False
    return sweep_id, False, judged


class EarlyChecks:
    """The early per-cell checks, beside the sweep (a worker thread and a queue): landing
    a cell only queues it, so the next cell starts without waiting for judging or chat.
    Leaving the context waits for the queued checks, so the night's end settles every
    early alert (:func:`check_night`). ``check`` None: a landed cell is not checked."""

    def __init__(self, check: CellStored | None) -> None:
        self._check = check
        self._queue: queue.SimpleQueue[tuple[int, str, datetime] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def __enter__(self) -> CellStored:
        return self.landed

    def landed(self, sweep: int, cell_id: str, ended: datetime) -> None:
        if self._check is None:
            return
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="early-checks", daemon=True)
            self._worker.start()
        self._queue.put((sweep, cell_id, ended))

    def _work(self) -> None:
        assert self._check is not None
        while (item := self._queue.get()) is not None:
            self._check(*item)

    def __exit__(self, *exc: object) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()


def _check_aa_builds(request: NightlyRequest, deps: NightlyDeps, sweep_id: int | None) -> None:
    """Before an A/A night runs (a new sweep, or the rest of ``sweep_id``): its planned
    builds must be the last good night's. FarmError saying which differ, or that the
    job has no good night to repeat."""
    if not request.aa or deps.planned_builds is None:
        return
    with deps.open_session(request.url) as session:
        if sweep_id is None:
            newest = latest_job_sweep_id(session, request.job)
            sweep_id = newest + 1 if newest is not None else 1  # as if the next night
        good = last_good_night(sweep_id, earlier_nights(session, request.job, sweep_id))
        if good is None:
            raise FarmError(
                f"--aa repeats the job's last good night, and job {request.job!r} has none: "
                "run `farm nightly` first"
            )
        then = sweep_builds(session, good)
    differ = aa_builds_differ(deps.planned_builds(), then, good)
    if differ is not None:
        raise FarmError(differ)


def _resume_id(request: NightlyRequest, deps: NightlyDeps) -> int | None:
    """The sweep ``--resume`` names: ``latest`` is the job's newest sweep."""
    if request.resume != "latest":
        return request.resume
    with deps.open_session(request.url) as session:
        newest = latest_job_sweep_id(session, request.job)
    if newest is None:
        raise FarmError(f"--resume latest: the store holds no sweep of job {request.job!r}")
    return newest

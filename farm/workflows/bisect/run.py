"""`farm bisect` as one workflow: the ends (given, a stored bisection's or an alert's),
the job for their slice, the search set up, run step by step, then the answer sent to
the chat channels and posted to a pull request.

The CLI parses the options into a :class:`BisectRequest`, hands the I/O it owns (the
job file's checks, the sweep runner with its progress display, the console) as
:class:`BisectDeps`, and prints the :class:`BisectOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session

from farm.notify.delivery import EXIT_UNDELIVERED
from farm.notify.registry import Notifier, send_notice_all
from farm.report.markdown import render_bisection
from farm.report.notice import bisection_notice
from farm.results.bisection import Bisection
from farm.spec import JobSpec
from farm.workflows.bisect.ends import BisectEnds, complete_ends, stored_ends
from farm.workflows.bisect.setup import prepare_bisect
from farm.workflows.bisect.steps import BisectRun, LineSink, SweepRunner, run_bisection
from farm.workflows.common import post_pr_comment

__all__ = ["BisectDeps", "BisectOutcome", "BisectRequest", "run_bisect"]


@dataclass(frozen=True)
class BisectRequest:
    """What `farm bisect` was asked: the ends as far as given (engine, refs, slice, a
    bisection to resume, an alert), the store, the build cache, whether to send the
    answer to the chat channels, and the PR (OWNER/REPO#N) to post it to."""

    ends: BisectEnds
    url: str
    cache_dir: Path
    notify: bool = False
    post_github: str | None = None


def _not_told(*_: object) -> None:
    pass


@dataclass(frozen=True)
class BisectDeps:
    """The I/O a bisection is handed: the store session, the job file read and checked
    for a slice (``read_job``), the runner of one step's sweep, the console's lines,
    the chat channels (read before anything is measured), and who is told the answer
    (``found``), what the channels did (``sent``) and the posted comment (``posted``)."""

    open_session: Callable[[str], AbstractContextManager[Session]]
    read_job: Callable[[Mapping[str, str]], JobSpec]
    runner: SweepRunner
    say: LineSink
    channels: Sequence[Notifier] = ()
    found: Callable[[BisectRun], None] = _not_told
    sent: Callable[[Bisection, Sequence[Notifier], Sequence[str]], None] = _not_told
    posted: Callable[[str, str], None] = _not_told


@dataclass(frozen=True)
class BisectOutcome:
    """The run and whether every channel took its answer."""

    run: BisectRun
    delivered: bool = True

    @property
    def exit_status(self) -> int:
        """0 found, 3 inconclusive, EXIT_UNDELIVERED when a channel failed."""
        if not self.delivered:
            return EXIT_UNDELIVERED
        return 0 if self.run.bisection.status == "found" else 3


def run_bisect(request: BisectRequest, deps: BisectDeps) -> BisectOutcome:
    """Find the first bad commit between the ends; send and post the answer. Raises
    FarmError (bad input, a step's results not stored), StoreError (store)."""
    ends, alert = stored_ends(request.ends, lambda: deps.open_session(request.url))
    spec = deps.read_job(ends.only)
    engine, good, bad = complete_ends(spec, ends, alert)
    setup = prepare_bisect(spec, engine, good, bad, ends.only, request.cache_dir)
    result = run_bisection(
        setup,
        db_url=request.url,
        runner=deps.runner,
        cache_dir=request.cache_dir,
        say=deps.say,
        resume=request.ends.resume,
    )
    deps.found(result)
    delivered = True
    if request.notify:
        errors = (
            send_notice_all(deps.channels, bisection_notice(result.bisection))
            if (deps.channels)
            else []
        )
        deps.sent(result.bisection, deps.channels, [str(e) for e in errors])
        delivered = not errors
    if request.post_github is not None:
        ref, link = post_pr_comment(request.post_github, render_bisection(result.bisection))
        deps.posted(str(ref), link)
    return BisectOutcome(run=result, delivered=delivered)

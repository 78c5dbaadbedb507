"""`farm pr` as one workflow: prepare, plan the baseline, run, judge, report, post.

:func:`run_pr` is a short driver over named steps; the CLI parses the options into a
:class:`PrRequest`, hands the I/O it owns (running a sweep with its progress display,
the console, the store session, the GitHub client) as :class:`PrDeps`, and prints the
:class:`PrOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlmodel import Session

from farm.analysis.confirm import ConfirmRule
from farm.analysis.judgement import JudgeRules
from farm.analysis.risk import touched_parts
from farm.masking import mask_secrets
from farm.notify.github import GitHubClient, PullRequestRef
from farm.orchestrate.driver import plan_job
from farm.plan import ServerCell
from farm.records import CellResult
from farm.report.pr_comment import render_pr_progress
from farm.runner import reference_runs
from farm.spec import JobSpec
from farm.spec.goldens import GoldenCheck
from farm.store import normalize_url
from farm.workflows.nightly.confirm import ConfirmNight
from farm.workflows.pr.confirm import confirm_pr
from farm.workflows.pr.decide import comment_marker, pr_job
from farm.workflows.pr.order import (
    FailFast,
    PrProgress,
    PrSweepPlan,
    calibrated_references,
    likely_first,
    past_regressions,
)
from farm.workflows.pr.steps import (
    BaseAt,
    PrBaseline,
    PrCheck,
    PrSetup,
    check_pr,
    plan_baseline,
    pr_judge_rules,
    prepare_pr,
    publish_pr,
    report_name,
    write_pr_report,
)

__all__ = ["PrDeps", "PrOutcome", "PrRequest", "run_pr"]

Say = Callable[..., None]
GitHubTarget = tuple[GitHubClient, PullRequestRef]


@dataclass(frozen=True)
class PrRequest:
    """What `farm pr` was asked: the job, the PR, the base, where to publish, and the
    goldens the job names (:func:`farm.spec.goldens.job_goldens`)."""

    spec: JobSpec
    engine: str
    number: int
    url: str
    only: dict[str, str]
    max_age: timedelta
    cache_dir: Path
    source: str | None = None
    base_at: BaseAt = "branch"
    folder: Path | None = None
    publish_url: str | None = None
    goldens: tuple[GoldenCheck, ...] = ()
    fail_fast: bool = False


@dataclass(frozen=True)
class PrDeps:
    """The I/O a PR run is handed: ``run_sweep`` runs a PR's sweep (its order, looks
    and fail-fast stop as planned) and returns its id; ``github`` the
    client and PR to post to (None: nothing is posted); ``judged`` is told the check
    as soon as the verdict exists (before GitHub is told); ``confirm`` what reruns the
    PR sweep's suspicious cells, given the sweep's job (:mod:`farm.workflows.pr.confirm`;
    None: nothing is confirmed)."""

    say: Say
    run_sweep: Callable[[PrSweepPlan], int]
    open_session: Callable[[str], AbstractContextManager[Session]]
    github: Callable[[PrSetup], GitHubTarget | None]
    judged: Callable[[PrCheck, PrSetup], None]
    confirm: Callable[[JobSpec], ConfirmNight] | None = None


@dataclass(frozen=True)
class PrOutcome:
    """What the PR run did: the check (its verdict), the report written, the comment
    posted (link, created or updated, the commit status set)."""

    check: PrCheck
    setup: PrSetup
    report: Path | None = None
    posted: tuple[str, bool, str | None] | None = None
    sha: str | None = None

    @property
    def exit_status(self) -> int:
        return self.check.judgement.verdict.exit_status


def run_pr(request: PrRequest, deps: PrDeps) -> PrOutcome:
    """Validate a pull request: build the candidate, reuse or run the base cells,
    confirm the suspicious candidate cells (:func:`confirm_pr`), judge the pairs,
    write the report, post the verdict. FarmError for bad input (nothing
    written), a sweep whose results are not stored, or GitHub refusing."""
    setup = prepare_pr(
        request.spec,
        request.engine,
        request.number,
        source=request.source,
        cache_dir=request.cache_dir,
        say=deps.say,
        base_at=request.base_at,
    )
    github = deps.github(setup)
    sha = _head_sha(github, setup, deps.say)
    baseline, job = _plan_sweep(request, setup, deps)
    rules = _rules(request, setup, deps)
    post = _progress_poster(github, setup, deps.say)
    sweep_id = deps.run_sweep(_sweep_plan(request, setup, deps, baseline, job, rules, post))
    if deps.confirm is not None:
        confirm_pr(request.url, sweep_id, setup, baseline, deps.confirm(job), rules=rules)
    report_url = (
        # The comment and the status are public: a credential in the URL is masked.
        mask_secrets(f"{request.publish_url.rstrip('/')}/{report_name(request.number, sweep_id)}")
        if request.publish_url and request.folder
        else None
    )
    report = None
    with deps.open_session(request.url) as session:
        check = check_pr(session, sweep_id, setup, baseline, rules=rules, report_url=report_url)
        deps.judged(check, setup)
        if request.folder is not None:
            report = write_pr_report(session, check, request.folder)
            deps.say(f"report: {report}")
    posted = None
    if github is not None:
        posted = publish_pr(github[0], github[1], check, setup, sha=sha, report_url=report_url)
    return PrOutcome(check=check, setup=setup, report=report, posted=posted, sha=sha)


def _head_sha(github: GitHubTarget | None, setup: PrSetup, say: Say) -> str | None:
    """The commit the status goes on: the one built, else GitHub's head of the PR (a
    refused token, or one whose own login cannot be read, stops the run here, before
    anything is built)."""
    sha = setup.head_sha
    if github is None:
        return sha
    info = github[0].get_pull(github[1])
    github[0].own_login()  # and a token whose own comments cannot be told apart
    if sha is not None and info.head_sha != sha:
        say(
            ("note:", "yellow"),
            f" GitHub's head of PR #{setup.number} is {info.head_sha[:12]}, the farm "
            f"built {sha[:12]} (a stale mirror?): the status goes on the commit built",
            err=True,
        )
    return sha or info.head_sha


def _plan_sweep(request: PrRequest, setup: PrSetup, deps: PrDeps) -> tuple[PrBaseline, JobSpec]:
    """The stored base cells to reuse and the PR sweep's job (the candidate's cells and
    the base cells not reused)."""
    spec, number = request.spec, request.number
    planned = plan_job(pr_job(spec, setup.base, setup.candidate, number), request.only)
    base_cells = [c for c in planned.cells if c.engine == setup.base.name]
    if _no_store_yet(request.url):  # the first run creates it, as `farm run` does
        baseline = plan_baseline(None, setup, base_cells, max_age=request.max_age)
    else:
        with deps.open_session(request.url) as session:
            baseline = plan_baseline(session, setup, base_cells, max_age=request.max_age)
    reused_ids = {c.cell_id for c in baseline.selection.reused}
    reused: list[ServerCell] = [c for c in base_cells if c.cell_id in reused_ids]
    deps.say(
        f"PR #{number}: candidate {setup.candidate.name} ({setup.candidate_label}); "
        f"base {setup.base.name} ({setup.base_label}): {len(reused_ids)} cell(s) reused "
        f"from sweep(s) {', '.join(map(str, baseline.selection.sweep_ids)) or '-'}, "
        f"{len(baseline.selection.missing)} to run"
    )
    return baseline, pr_job(spec, setup.base, setup.candidate, number, reused)


ProgressPoster = Callable[[PrProgress, bool], None]


def _progress_poster(
    github: GitHubTarget | None, setup: PrSetup, say: Say
) -> ProgressPoster | None:
    """What writes the PR's comment as its cells land (None: nothing is posted)."""
    if github is None:
        return None
    client, ref = github
    marker = comment_marker(setup.job, setup.base.name)

    def post(progress: PrProgress, stopping: bool) -> None:
        body = render_pr_progress(
            marker=marker,
            number=setup.number,
            engine=setup.base.name,
            finished=progress.finished,
            total=progress.total,
            failed=progress.failed,
            regressed=progress.regressed,
            stopping=stopping,
        )
        try:
            client.upsert_comment(ref, marker, body)
        except Exception as exc:  # best effort, as the sweep runs: never sinks it
            say(f"PR comment not updated as cells finish: {mask_secrets(str(exc))}")

    return post


def _rules(request: PrRequest, setup: PrSetup, deps: PrDeps) -> JudgeRules:
    """The PR's rules, made once before its sweep: its fail-fast, its confirmations and
    its verdict judge by the same ones (the keys calibrated over ``nightly.history``
    nights, confirmed by ``nightly.confirm_runs`` reruns)."""
    if _no_store_yet(request.url):
        return pr_judge_rules(None, setup, request.goldens)
    nightly = request.spec.nightly
    confirm = ConfirmRule(runs=nightly.confirm_runs, budget_s=nightly.confirm_budget_s)
    with deps.open_session(request.url) as session:
        return pr_judge_rules(
            session, setup, request.goldens, history=nightly.history, confirm=confirm
        )


def _sweep_plan(
    request: PrRequest,
    setup: PrSetup,
    deps: PrDeps,
    baseline: PrBaseline,
    job: JobSpec,
    rules: JudgeRules,
    post: ProgressPoster | None = None,
) -> PrSweepPlan:
    """The sweep's order (likeliest regressions first), the stored runs the candidate's
    looks pair with (the reused base cells: known before it runs; base cells run in the
    same sweep are not, and the candidate runs whole; each noisy key's looks under its
    calibrated rule) and what is told of each landed
    cell: the PR's comment, updated (``post``), and, fail-fast, its stop."""
    references = calibrated_references(
        reference_runs(
            ((c.sweep_id, c.stored) for c in baseline.reused),
            {setup.base.name: setup.candidate.name},
        ),
        rules,
        setup.base.name,
    )
    regressed = []
    if not _no_store_yet(request.url):
        with deps.open_session(request.url) as session:
            regressed = past_regressions(session, request.spec.name, request.number)
    cells = plan_job(job, request.only).cells
    first = likely_first(cells, regressed, setup.touched)
    if first:
        parts = touched_parts(setup.touched)
        why = [f"{len(regressed)} past regression(s) of the job"] if regressed else []
        if parts:
            why.append(f"the {len(setup.touched)} file(s) it changes ({', '.join(parts)})")
        deps.say(f"order: {' and '.join(why)} put {first[0]} first")
    if not request.fail_fast and post is None:
        return PrSweepPlan(job=job, references=references, first=first)
    progress = PrProgress(
        FailFast(setup.base.name, setup.candidate.name, [c.stored for c in baseline.reused], rules),
        total=len(cells),
    )

    def landed(cell: ServerCell, result: CellResult) -> str | None:
        reason = progress(cell, result)
        stop = reason if request.fail_fast else None
        if post is not None:
            post(progress, stop is not None)
        return stop

    return PrSweepPlan(job=job, references=references, first=first, stop_after=landed)


def _no_store_yet(url: str) -> bool:
    """True for a SQLite store whose file does not exist (it has no baseline yet)."""
    parsed = sa.make_url(normalize_url(url))
    database = parsed.database or ""
    return parsed.get_backend_name() == "sqlite" and bool(database) and not Path(database).exists()

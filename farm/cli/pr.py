"""`farm pr`: validate an engine pull request in one command, verdict on GitHub.

Exit status: 0 clean, 1 regression, 2 bad input (or GitHub/store unreachable),
3 cells failed but no regression. The stages are imported inside the command: this
module loads only typer, rich and the CLI's common parts.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.common import (
    DbOption,
    OnlyOption,
    RayOption,
    confirm_reruns,
    db_url,
    fail,
    home,
    open_session,
    parse_pairs,
    say,
)
from farm.cli.inputs import STORE_ID
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.notify.github import GitHubClient, PullRequestRef
    from farm.spec import JobSpec
    from farm.workflows.pr.order import PrSweepPlan
    from farm.workflows.pr.run import PrDeps, PrOutcome
    from farm.workflows.pr.steps import PrCheck, PrSetup

__all__ = ["pr_app"]

pr_app = typer.Typer(rich_markup_mode="markdown")


class _BaseAt(StrEnum):
    """``--base``: farm.workflows.pr.steps.BaseAt as typer's choices."""

    branch = "branch"
    merge_base = "merge-base"


def _github(
    repo: str | None, setup: PrSetup, number: int, post: bool
) -> tuple[GitHubClient, PullRequestRef] | None:
    """The client and the PR to post to, or None when nothing is posted (said why).
    FarmError when posting is asked for but cannot be done (no token, a bad repo)."""
    from farm.notify.github import PullRequestRef, parse_repo
    from farm.workflows.common import github_client

    if not post:
        return None
    if repo is None:
        # The repository the PR belongs to, when it is on github.com.
        from farm.workflows.pr.decide import replaced_overlay

        overlay = replaced_overlay(setup.base)
        source = (
            next(o for o in setup.base.overlays if o.package == overlay).source
            if overlay
            else setup.base.source
        )
        repo = getattr(source, "repo", None)
        try:
            owner, name = parse_repo(repo or "")
        except ValueError:
            say(
                ("note:", "yellow"),
                " not posting to GitHub: no repository (give --repo OWNER/REPO or set "
                "GITHUB_REPOSITORY; --no-post to silence this)",
                err=True,
            )
            return None
    else:
        try:
            owner, name = parse_repo(repo)
        except ValueError as exc:
            raise FarmError(f"--repo: {exc}") from None
    client = github_client(
        f"GITHUB_TOKEN is not set: it is needed to comment on {owner}/{name}#{number} "
        "and set its status (or run with --no-post)"
    )
    return client, PullRequestRef(owner=owner, repo=name, number=number)


def _check_posting(repo: str | None) -> None:
    """FarmError when posting is asked for and cannot be done whatever the PR: no
    GITHUB_TOKEN, or a --repo / GITHUB_REPOSITORY that is no OWNER/REPO."""
    from farm.notify.github import parse_repo
    from farm.settings import get_settings

    if get_settings().github.token is None:
        raise FarmError(
            "GITHUB_TOKEN is not set: it is needed to comment on the PR and set its status "
            "(or run with --no-post)"
        )
    if repo is not None:
        try:
            parse_repo(repo)
        except ValueError as exc:
            raise FarmError(f"--repo: {exc}") from None


def _job_text(job: JobSpec, source: Path) -> str:
    import yaml

    data = job.model_dump(mode="json", exclude={"base_dir"})
    return f"# farm pr: derived from {source}\n" + yaml.safe_dump(data, sort_keys=False)


def _run(plan: PrSweepPlan, job_file: Path, url: str, only: dict[str, str], ray: str | None) -> int:
    """Run the PR sweep; its id. FarmError when some result was not stored."""
    from farm.cli.run import print_outcome
    from farm.cli.run_events import console_events
    from farm.orchestrate.driver import SweepOptions
    from farm.workflows.common import run_stored

    options = SweepOptions(
        db_url=url,
        ray_address=ray,
        only=only,
        home=home(),
        references=lambda _: plan.references,
        first=plan.first,
        stop_after=plan.stop_after,
    )
    return run_stored(
        plan.job,
        _job_text(plan.job, job_file),
        options,
        then="the PR cannot be judged; store them (`farm spool flush`) and run `farm pr` again",
        progress=console_events,
        told=lambda outcome: print_outcome(outcome, url),
    )


def _runner(
    job_file: Path, url: str, only: dict[str, str], ray: str | None
) -> Callable[[PrSweepPlan], int]:
    return lambda plan: _run(plan, job_file, url, only, ray)


def _deps(
    run: Callable[[PrSweepPlan], int],
    repo: str | None,
    number: int,
    post: bool,
    ray: str | None,
) -> PrDeps:
    """What the PR workflow is handed: the console, the sweep runner with its progress
    display, the store session, the GitHub client (None when nothing is posted), the
    confirmation reruns on Ray."""
    from farm.workflows.nightly.confirm import ConfirmNight
    from farm.workflows.pr.run import PrDeps

    def confirm(job: JobSpec) -> ConfirmNight:
        return ConfirmNight(
            open_session=open_session,
            reruns=confirm_reruns(job, ray),
            said=lambda line: say(("confirmation:", "cyan"), f" {line}"),
        )

    return PrDeps(
        say=say,
        run_sweep=run,
        open_session=open_session,
        github=lambda setup: _github(repo, setup, number, post),
        judged=_print_check,
        confirm=confirm,
    )


def _print_check(check: PrCheck, setup: PrSetup) -> None:
    v = check.judgement.verdict
    say((v.headline(), "green" if v.outcome == "clean" else "red"))
    for f in v.findings:
        say(("  " + f.source, "bold"), f" {f.check}: {f.summary}")
    for d in setup.dropped:
        say(("  patch dropped", "yellow"), f" {d.describe()}")
    if check.cost is not None:
        say(check.cost.describe())


_Source = Annotated[
    str | None,
    typer.Option(help="build the candidate from this ref, tree or wheel, not the PR head"),
]

_Base = Annotated[
    _BaseAt,
    typer.Option(
        help="compare with the tip of the branch the job names, or with the commit the "
        "PR branched from (git merge-base; its base cells usually run in the sweep)",
    ),
]

_Repo = Annotated[
    str | None,
    typer.Option(
        help="OWNER/REPO of the PR; default: GITHUB_REPOSITORY, else the repository of "
        "the source it replaces",
    ),
]

_PublishUrl = Annotated[
    str | None,
    typer.Option(help="URL the publish folder is served at; default: FARM_PUBLISH_URL"),
]


@pr_app.command()
def pr(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    engine: Annotated[str, typer.Option(help="the job's engine the PR is for")],
    pr_number: Annotated[int, typer.Option("--pr", help="pull request number", parser=STORE_ID)],
    source: _Source = None,
    base: _Base = _BaseAt.branch,
    only: OnlyOption = None,
    baseline_max_age: Annotated[
        str, typer.Option(help="reuse stored base cells younger than this (s, m, h, d, w)")
    ] = "7d",
    db: DbOption = None,
    ray_address: RayOption = None,
    repo: _Repo = None,
    post: Annotated[bool, typer.Option(help="comment on the PR and set its status")] = True,
    publish: Annotated[
        Path | None, typer.Option(help="write the HTML report here; default: nightly.publish")
    ] = None,
    publish_url: _PublishUrl = None,
    fail_fast: Annotated[
        bool,
        typer.Option(
            help="stop starting cells at the first candidate cell confirmed below its base "
            "(the likeliest regressions, by the job's past ones, start first)"
        ),
    ] = False,
) -> None:
    """Validate pull request N of an engine: build the engine with the PR head, run its
    cells beside the base's missing cells, compare them pairwise with the base (stored
    cells of the same build reused), and post the verdict to the PR.

    The base is the engine as the job names it (the tip of its branch), or with
    ``--base merge-base`` the commit the PR branched from, so changes merged into the
    branch since then are not counted as the PR's.

    One comment per PR and job, updated on each run; the commit status
    ``mtp-farm/JOB`` on the PR head. Exit status: 0 clean, 1 regression, 2 bad input
    or GitHub unreachable, 3 cells failed but no regression.
    """
    from farm.cli.outputs import check_publish_folder
    from farm.cli.preflight import check_job
    from farm.settings import get_settings
    from farm.spec.goldens import job_goldens
    from farm.workflows.pr.decide import parse_age
    from farm.workflows.pr.run import PrRequest, run_pr

    pairs = parse_pairs(only, "--only", "AXIS=VALUE")
    try:
        if "engine" in pairs:
            raise FarmError("--only engine=...: farm pr runs the engine --engine names")
        max_age, url = parse_age(baseline_max_age), db_url(db)
        repo = repo or get_settings().github.repository
        checked = check_job(job_file, pairs, on_this_machine=ray_address is None)[0]
        spec = checked.spec
        folder = publish or (Path(spec.nightly.publish) if spec.nightly.publish else None)
        # What can refuse the run after the sweep is checked before the PR is fetched.
        if folder is not None:
            check_publish_folder(folder, "--publish" if publish else "nightly.publish")
        if post:
            _check_posting(repo)
        request = PrRequest(
            spec=spec,
            engine=engine,
            number=pr_number,
            url=url,
            only=pairs,
            max_age=max_age,
            cache_dir=home() / "cache",
            source=source,
            base_at="merge-base" if base is _BaseAt.merge_base else "branch",
            folder=folder,
            publish_url=publish_url or get_settings().github.publish_url,
            goldens=job_goldens(checked),
            fail_fast=fail_fast,
        )
        run = _runner(job_file, url, pairs, ray_address)
        outcome = run_pr(request, _deps(run, repo, pr_number, post, ray_address))
    except FarmError as exc:
        raise fail(exc) from None
    _print_outcome(outcome)
    raise typer.Exit(outcome.exit_status)


def _print_outcome(outcome: PrOutcome) -> None:
    if outcome.posted is not None:
        link, created, state = outcome.posted
        say(f"{'commented' if created else 'updated the comment'}: {link}")
        if state:
            say(f"status mtp-farm/{outcome.setup.job} on {outcome.sha}: {state}")

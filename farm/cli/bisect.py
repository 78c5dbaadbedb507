"""`farm bisect`: find the commit that dropped acceptance between a good and a bad build.

Exit status: 0 the first bad commit was found, 3 inconclusive (the reason is printed),
4 a notification channel failed (``--notify``; the bisection is stored; as `farm
nightly` and `farm alerts check`), 2 bad input
(or the store unreachable). The stages are imported inside the command: this module
loads only typer, rich and the CLI's common parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.common import (
    DbOption,
    OnlyOption,
    RayOption,
    db_url,
    fail,
    home,
    parse_pairs,
    say,
)
from farm.cli.inputs import STORE_ID
from farm.errors import FarmError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from farm.comparable import ComparableKey
    from farm.notify.registry import Notifier
    from farm.results.bisection import Bisection
    from farm.runner import ReferenceRun
    from farm.spec import JobSpec
    from farm.workflows.bisect.steps import BisectRun, SweepRunner

__all__ = ["bisect_app"]

bisect_app = typer.Typer(rich_markup_mode="markdown")


def _runner(url: str, only: dict[str, str], ray: str | None) -> SweepRunner:
    """Runs one step's sweep with the console's progress; its sweep id."""
    from farm.cli.run_events import console_events
    from farm.orchestrate.driver import SweepOptions
    from farm.workflows.common import run_stored

    def run(job: JobSpec, text: str, pairs: Mapping[ComparableKey, ReferenceRun]) -> int:
        # The step job already excludes every cell but the step's: --only is not needed.
        options = SweepOptions(
            db_url=url,
            ray_address=ray,
            home=home(),
            references=(lambda _sweep: pairs) if pairs else None,
        )
        return run_stored(
            job,
            text,
            options,
            then="store them (`farm spool flush`) and run `farm bisect --resume` again",
            progress=console_events,
        )

    del only  # the planned cells already carry the --only slice
    return run


def _print_result(run: BisectRun) -> None:
    b = run.bisection
    colour = "green" if b.status == "found" else "yellow"
    say((f"bisection {b.id}: {b.headline()}", colour))
    if b.status == "found" and b.first_bad is not None:
        pr = b.commits[b.first_bad].pr  # None for a release
        if pr is not None:
            say(f"  pull request: #{pr}")
    if b.status == "inconclusive" and b.first_bad is not None and b.last_good is not None:
        for i in range(b.last_good + 1, b.first_bad + 1):
            say(f"  candidate: {b.commits[i].describe()}")
    skipped = [s for s in b.steps if s.verdict == "skip"]
    for s in skipped:
        say(f"  skipped {b.commits[s.position].describe()}: {s.reason[:400]}")
    say(
        f"this run: {run.builds} build(s), {run.cells} cell(s), {run.wall_s:.0f} s wall, "
        f"{run.engine_s:.0f} s engine; bisection total: {len(b.steps)} step(s), "
        f"{b.builds_run} build(s), {b.cells_run} cell(s), {b.wall_s:.0f} s wall"
    )
    if saved := run.looks_saved():
        say(f"  {saved}")


def _channels(notify: bool) -> list[Notifier]:
    """The configured notification channels when ``notify`` (none otherwise); read
    before anything is measured, so a bad ``FARM_NOTIFY_*`` setting fails at once
    (NotifyError)."""
    if not notify:
        return []
    from farm.notify.registry import configured_notifiers

    return configured_notifiers()


def _sent(b: Bisection, channels: Sequence[Notifier], errors: Sequence[str]) -> None:
    """What the channels did with the answer of ``b``, each error on standard error.
    With no channel: a warning naming the ``FARM_NOTIFY_*`` URL variables."""
    from farm.notify.registry import ENV_VARS

    if not channels:
        urls = ", ".join(name for name in ENV_VARS if name.endswith("_URL"))
        say(
            (f"--notify: no notification channel is configured (set {urls}): not sent", "yellow"),
            err=True,
        )
        return
    for err in errors:
        say(("notification failed:", "red"), f" {err}", err=True)
    if errors:
        say(
            f"bisection {b.id} is stored (`farm report --bisection {b.id}` shows it); run "
            "the same `farm bisect ... --notify` again to send it: nothing is measured again",
            err=True,
        )
    else:
        say(f"sent to {', '.join(n.name for n in channels)}")


def _check_pr_ref(post_github: str | None) -> None:
    """``--post-github``: refused before anything runs when it names no PR."""
    if post_github is None:
        return
    from farm.notify.github import parse_pr_ref

    try:
        parse_pr_ref(post_github)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--post-github") from None


def _posted(ref: str, link: str) -> None:
    from rich.text import Text

    from farm.cli.common import err_console

    err_console.print(Text(f"posted to {ref}: {link}"))


@bisect_app.command()
def bisect(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    engine: Annotated[str | None, typer.Option(help="the job's engine to bisect")] = None,
    good: Annotated[str | None, typer.Option(help="a ref without the drop")] = None,
    bad: Annotated[str | None, typer.Option(help="a ref with the drop")] = None,
    only: OnlyOption = None,
    from_alert: Annotated[
        int | None,
        typer.Option(
            help="take the engine, the cell and the two builds from this alert",
            parser=STORE_ID,
        ),
    ] = None,
    resume: Annotated[
        int | None,
        typer.Option(help="continue this stored bisection from its steps", parser=STORE_ID),
    ] = None,
    db: DbOption = None,
    ray_address: RayOption = None,
    post_github: Annotated[
        str | None,
        typer.Option(help="OWNER/REPO#N: post the result as a comment (needs GITHUB_TOKEN)"),
    ] = None,
    notify: Annotated[
        bool,
        typer.Option("--notify", help="send the answer to the chat channels set in FARM_NOTIFY_*"),
    ] = False,
) -> None:
    """Find the first commit (or release) between --good and --bad that dropped acceptance.

    The candidates are the first-parent commits of the engine's git overlay (or its own
    git source); for a PyPI overlay (or engine) without git, the releases between the
    two versions on the package index pip is configured with (pre-releases only when
    an end is one). The ends are measured first (stored cells of the same build
    reused); then each step builds the midpoint (layered on the cached base for an
    overlay), runs only the cells whose AL fell between the ends, and judges it
    against both ends. A step that does not build or run is skipped. Every step is
    stored: a second run, or --resume ID, continues without measuring it again.
    --notify sends the answer (found or inconclusive) to every channel set in
    FARM_NOTIFY_* (Slack, Feishu, WeCom, webhook); one failing does not stop the others.

    Exit status: 0 found, 3 inconclusive, 4 a channel failed (--notify; the bisection
    is stored), 2 bad input.
    """
    from farm.cli.preflight import check_job
    from farm.workflows.bisect.ends import BisectEnds
    from farm.workflows.bisect.run import BisectDeps, BisectRequest, run_bisect
    from farm.workflows.common import store_session

    pairs = parse_pairs(only, "--only", "AXIS=VALUE")
    _check_pr_ref(post_github)
    on_this_machine = ray_address is None
    try:
        url = db_url(db)
        request = BisectRequest(
            ends=BisectEnds(engine, good, bad, pairs, resume=resume, from_alert=from_alert),
            url=url,
            cache_dir=home() / "cache",
            notify=notify,
            post_github=post_github,
        )
        deps = BisectDeps(
            open_session=store_session,
            read_job=lambda only: check_job(job_file, only, on_this_machine)[0].spec,
            runner=_runner(url, pairs, ray_address),
            say=say,
            channels=_channels(notify),
            found=_print_result,
            sent=_sent,
            posted=_posted,
        )
        outcome = run_bisect(request, deps)
    except FarmError as exc:
        raise fail(exc) from None
    raise typer.Exit(outcome.exit_status)

"""`farm nightly`: run a job's sweep, judge it once, alert, notify, publish.

Exit status: 0 clean, 1 regression (alerts raised), 2 bad input or store
unreachable, 3 cells failed but no regression, 4 a channel did not take the alerts
(as `farm alerts check`), 5 an A/A night (``--aa``) found false alarms, 130 / 143
stopped by SIGINT / SIGTERM before the night was judged (the sweep is stored
interrupted; ``--resume latest`` finishes and judges it). The stages are imported inside the
command: this module loads only typer, rich and the CLI's common parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from farm.cli.common import (
    DbOption,
    OnlyOption,
    RayOption,
    confirm_reruns,
    db_url,
    fail,
    home,
    parse_pairs,
    say,
)
from farm.cli.inputs import LIMIT
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.plan import Plan
    from farm.spec import JobFile
    from farm.workflows.nightly.run import NightlyDeps, NightlyRequest
    from farm.workflows.nightly.steps import CellAlerts, NightlyCheck

__all__ = ["nightly_app"]

nightly_app = typer.Typer(rich_markup_mode="markdown")


def _resume(value: str | None) -> int | Literal["latest"] | None:
    """``--resume``: a sweep id, or ``latest`` for the job's newest sweep."""
    if value is None:
        return None
    if value == "latest":
        return "latest"
    from farm.bounds import parse_stored_int

    try:
        return parse_stored_int(value, what="a sweep id")
    except ValueError as exc:
        raise typer.BadParameter(f"{exc}, or 'latest'", param_hint="--resume") from None


def _print_cell_alerts(checked: CellAlerts) -> None:
    """A cell's alerts as they were raised, while the night runs."""
    if checked.failed is not None:
        say(
            ("alerts of " + checked.cell_id, "yellow"),
            f" not checked yet ({checked.failed}); the night's end checks them",
        )
        return
    if checked.sent:
        took = ", ".join(checked.delivered_to) or "no channel"
        after = ""
        if checked.sent_after_s is not None:
            after = f" {checked.sent_after_s:.1f} s after the cell ended"
        say((f"alert sent ({took}){after}:", "red"), f" {checked.sent[0].summary}")
        for alert in checked.sent[1:]:
            say(f"  and: {alert.summary}")
    if checked.held:
        held = len(checked.held)
        say(f"{held} alert(s) of {checked.cell_id}: of a cause told tonight, sent at the end")
    for error in checked.errors:
        say(("alert not delivered:", "red"), f" {error}; the night's end sends it again", err=True)


def _print_check(check: NightlyCheck) -> None:
    v = check.verdict
    style = "green" if v.outcome == "clean" else "red"
    say((v.headline(), style))
    false_alarms = v.false_alarms
    for f in v.findings:
        if f in false_alarms:
            say(("  false alarm", "yellow"), f" ({f.source}) {f.shown_check}: {f.summary}")
        else:
            say(("  " + f.source, "bold"), f" {f.shown_check}: {f.summary}")
    if check.cost is not None:
        say(check.cost.describe())
    comparison = check.judgement.comparison if check.judgement is not None else None
    for row in comparison.rows if comparison is not None else ():
        if row.confirmation is not None:
            say(("confirmation:", "cyan"), f" {row.label}: {row.confirmation.describe()}")
    if check.spread_error is not None:
        say(("key spread:", "yellow"), f" {check.spread_error}", err=True)
    if v.kind == "aa":
        say("A/A night: its findings are false alarms of the rule; nothing alerted or sent")
        return
    if not check.judged:
        say("this night was judged before: no alert raised or sent again")
        return
    if check.raised:
        fresh = sum(a.opened_by(v.sweep_id) for a in check.raised)
        say(f"{len(check.raised)} alert(s) raised ({fresh} opened by this night)")
    if check.withdrawn:
        told = sum(a.needs_notification for a in check.withdrawn)
        say(
            f"{len(check.withdrawn)} early alert(s) withdrawn: the verdict did not confirm "
            f"them ({told} told as withdrawn)"
        )
    from farm.notify.delivery import delivery_lines

    for line, good in delivery_lines(len(check.sent), check.delivered_to, check.errors):
        if good:
            say(line)
        else:
            say((line, "red"), err=True)


_Resume = Annotated[
    str | None,
    typer.Option(help="finish sweep N (or 'latest' of this job), then check it if not yet"),
]
_History = Annotated[
    int | None,
    typer.Option(help="sweeps for the history checks; default: nightly.history", parser=LIMIT),
]
_Publish = Annotated[
    Path | None, typer.Option(help="report folder; default: nightly.publish of the job")
]
_Notify = Annotated[bool, typer.Option(help="send new alerts to the channels set in FARM_NOTIFY_*")]
_AA = Annotated[
    bool,
    typer.Option(
        "--aa",
        help="an A/A night: the last good night's builds again (refused when they differ); "
        "its findings are false alarms, never alerted or sent; exit 5 when there is one",
    ),
]


def _planned_builds(job: JobFile, cells_of: set[str]) -> dict[str, str | None]:
    """Engine -> the build id the night would run (None: its source is unresolved)."""
    from farm.builds.venv import plan_builds

    return {
        b.engine: b.build_id
        for b in plan_builds([e for e in job.spec.engines if e.name in cells_of])
    }


def _check_outputs(request: NightlyRequest, publish_option: bool) -> None:
    """Everything the night needs after the sweep, checked before it: the report
    folder and the channels (a bad FARM_NOTIFY_* fails here, not after judging)."""
    from farm.cli.outputs import check_publish_folder

    if request.folder is not None:
        check_publish_folder(request.folder, "--publish" if publish_option else "nightly.publish")
    if request.notify:
        from farm.notify.registry import configured_notifiers

        configured_notifiers()


def _deps(
    job: JobFile,
    job_file: Path,
    planned: Plan,
    only: dict[str, str],
    ray: str | None,
    request: NightlyRequest,
) -> NightlyDeps:
    """What the nightly workflow is handed: the store, the sweep runner with the
    console's progress view, the resume check against the job file, what prints."""
    from farm.analysis.confirm import ConfirmRule
    from farm.cli.reports import show_sweep
    from farm.cli.run import print_outcome_lines
    from farm.cli.run_events import console_events
    from farm.orchestrate.driver import SweepOptions
    from farm.workflows.common import check_resume, store_session
    from farm.workflows.nightly.confirm import ConfirmNight
    from farm.workflows.nightly.run import NightlyDeps
    from farm.workflows.nightly.steps import night_runner

    url = request.url
    options = SweepOptions(db_url=url, ray_address=ray, only=only, home=home())
    run_sweep = night_runner(
        job.spec,
        job_file.read_text(),
        options,
        history=request.history,
        progress=console_events,
        then="the night cannot be judged; once the store is back, "
        f"`farm nightly {job_file} --resume {{sweep}}` stores, finishes and checks it",
        told=print_outcome_lines,
    )
    return NightlyDeps(
        open_session=store_session,
        run_sweep=run_sweep,
        check_resume=lambda sweep: check_resume(job, planned, only, url, sweep),
        judged=_print_check,
        cell_checked=_print_cell_alerts,
        swept=lambda record: show_sweep(record, f"sweep {record.sweep_id} ({record.job})"),
        planned_builds=(
            (lambda: _planned_builds(job, {c.engine for c in planned.cells}))
            if request.aa
            else None
        ),
        confirm=ConfirmNight(
            open_session=store_session,
            reruns=confirm_reruns(job.spec, ray),
            said=lambda line: say(("confirmation:", "cyan"), f" {line}"),
        ),
        confirm_rule=ConfirmRule(
            runs=job.spec.nightly.confirm_runs, budget_s=job.spec.nightly.confirm_budget_s
        ),
    )


@nightly_app.command()
def nightly(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    db: DbOption = None,
    only: OnlyOption = None,
    ray_address: RayOption = None,
    resume: _Resume = None,
    history: _History = None,
    publish: _Publish = None,
    notify: _Notify = True,
    aa: _AA = False,
) -> None:
    """Run the job's sweep, then judge it: within-sweep checks, every cell against the
    same cell of the job's last good night, history checks over the last N sweeps.

    Raises deduplicated alerts, notifies, writes the report folder and prints one line
    per finding. Exit status: 0 clean, 1 regression, 2 bad input or store unreachable,
    3 cells failed but no regression, 4 a notification channel failed (the alerts stay
    pending), 5 an A/A night (--aa) found false alarms, 130 / 143 interrupted by
    SIGINT / SIGTERM (not judged: --resume latest finishes it). A night already judged
    is not judged again.
    """
    from farm.cli.preflight import check_job
    from farm.spec.goldens import job_goldens
    from farm.workflows.nightly.run import NightlyRequest, run_nightly

    pairs = parse_pairs(only, "--only", "AXIS=VALUE")
    try:
        url = db_url(db)
        checked, planned = check_job(job_file, pairs, on_this_machine=ray_address is None)
        spec = checked.spec
        asked = _resume(resume)
        request = NightlyRequest(
            job=spec.name,
            url=url,
            history=spec.nightly.history if history is None else history,
            resume=asked,
            notify=notify and not aa,  # an A/A night tells no channel anything
            folder=publish or (Path(spec.nightly.publish) if spec.nightly.publish else None),
            goldens=job_goldens(checked),
            aa=aa,
        )
        _check_outputs(request, publish is not None)
        deps = _deps(checked, job_file, planned, pairs, ray_address, request)
        outcome = run_nightly(request, deps)
        if outcome.pages and request.folder is not None:
            say(f"report: {outcome.pages[0]} (index: {request.folder / 'index.html'})")
        if outcome.page_error is not None:
            # The verdict is stored: its status is what the scheduler acts on.
            say(
                ("error:", "red"),
                f" {outcome.page_error}; the verdict is stored "
                f"({outcome.check.verdict.outcome}); the next `farm nightly --resume "
                f"{outcome.check.verdict.sweep_id}` writes the page",
                err=True,
            )
    except FarmError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt as exc:
        # Not click's "Aborted!" and exit 1, which a scheduler would read as a regression.
        say(
            (f"interrupted ({exc or 'signal SIGINT'}):", "red"),
            f" the night is not judged; `farm nightly {job_file} --resume latest` "
            "finishes and judges it",
            err=True,
        )
        raise typer.Exit(143 if "SIGTERM" in str(exc) else 130) from None
    raise typer.Exit(outcome.exit_status)

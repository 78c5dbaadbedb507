"""`farm nightly`: run a job's sweep, judge it once, alert, notify, publish.

Exit status: 0 clean, 1 regression (alerts raised), 2 bad input or store
unreachable, 3 cells failed but no regression, 130 / 143 stopped by SIGINT / SIGTERM
before the night was judged (the sweep is stored interrupted; ``--resume latest``
finishes and judges it). The stages are imported inside the
command: this module loads only typer, rich and the CLI's common parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.common import DbOption, db_url, fail, home, open_session, parse_pairs, say
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.spec import JobFile
    from farm.workflows.pipeline import NightlyCheck

__all__ = ["nightly_app"]

nightly_app = typer.Typer(rich_markup_mode="markdown")

# Statuses of a sweep whose every cell ran: nothing left for --resume to run.
_FINISHED = ("ok", "failed")


def _resume_id(value: str | None, job: str, url: str) -> int | None:
    """``--resume``: a sweep id, or ``latest`` for the job's newest sweep."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    if value != "latest":
        raise typer.BadParameter(
            f"{value!r}: expected a sweep id or 'latest'", param_hint="--resume"
        )
    from farm import store

    with open_session(url) as session:
        ids = [s.id for s in store.list_sweeps(session, limit=500) if s.job == job]
    if not ids:
        raise FarmError(f"--resume latest: the store holds no sweep of job {job!r}")
    return ids[0]


def _stored_state(url: str, sweep_id: int) -> tuple[str, bool]:
    """(status of sweep ``sweep_id``, whether its nightly verdict is stored)."""
    from farm import store
    from farm.store.verdicts import get_verdict

    with open_session(url) as session:
        status = store.load_sweep(session, sweep_id).status
        return status, get_verdict(session, sweep_id, "nightly") is not None


def _run(
    job: JobFile,
    job_file: Path,
    url: str,
    only: dict[str, str],
    ray: str | None,
    resume: int | None,
) -> int:
    """Run (or finish) the sweep; its id. FarmError when some result was not stored."""
    from farm.cli.run import run_stored
    from farm.sweep import SweepOptions

    options = SweepOptions(db_url=url, ray_address=ray, only=only, home=home(), resume=resume)
    return run_stored(
        job.spec,
        job_file.read_text(),
        options,
        then="the night cannot be judged; once the store is back, "
        f"`farm nightly {job_file} --resume {{sweep}}` stores, finishes and checks it",
    )


def _print_check(check: NightlyCheck) -> None:
    v = check.verdict
    style = "green" if v.outcome == "clean" else "red"
    say((v.headline(), style))
    for f in v.findings:
        say(("  " + f.source, "bold"), f" {f.check}: {f.summary}")
    if not check.judged:
        say("this night was judged before: no alert raised or sent again")
        return
    if check.raised:
        fresh = sum(a.opened_by(v.sweep_id) for a in check.raised)
        say(f"{len(check.raised)} alert(s) raised ({fresh} opened by this night)")
    if check.sent:
        say(f"sent {len(check.sent)} alert(s) to {', '.join(check.channels)}")
    for err in check.errors:
        say(("notification failed:", "red"), f" {err}", err=True)


@nightly_app.command()
def nightly(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    db: DbOption = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="AXIS=VALUE; repeatable")] = None,
    ray_address: Annotated[str | None, typer.Option(help="join this Ray cluster")] = None,
    resume: Annotated[
        str | None,
        typer.Option(help="finish sweep N (or 'latest' of this job), then check it if not yet"),
    ] = None,
    history: Annotated[
        int | None, typer.Option(help="sweeps for the history checks; default: nightly.history")
    ] = None,
    publish: Annotated[
        Path | None, typer.Option(help="report folder; default: nightly.publish of the job")
    ] = None,
    notify: Annotated[
        bool, typer.Option(help="send new alerts to the channels set in FARM_NOTIFY_*")
    ] = True,
) -> None:
    """Run the job's sweep, then judge it: within-sweep checks, every cell against the
    same cell of the job's last good night, history checks over the last N sweeps.

    Raises deduplicated alerts, notifies, writes the report folder and prints one line
    per finding. Exit status: 0 clean, 1 regression, 2 bad input or store unreachable,
    3 cells failed but no regression, 130 / 143 interrupted by SIGINT / SIGTERM (not
    judged: --resume latest finishes it). A night already judged is not judged again.
    """
    from farm.cli.preflight import check_job, check_resume

    pairs = parse_pairs(only, "--only", "AXIS=VALUE")
    try:
        url = db_url(db)
        checked, planned = check_job(job_file, pairs, on_this_machine=ray_address is None)
        spec = checked.spec
        n_history = spec.nightly.history if history is None else history
        folder = (
            publish
            if publish is not None
            else (Path(spec.nightly.publish) if spec.nightly.publish else None)
        )
        sweep_id = _resume_id(resume, spec.name, url)
        if sweep_id is not None:
            status, judged = _stored_state(url, sweep_id)
            if not judged:
                check_resume(checked, planned, pairs, url, sweep_id)
            if status not in _FINISHED and not judged:
                sweep_id = _run(checked, job_file, url, pairs, ray_address, sweep_id)
        else:
            sweep_id = _run(checked, job_file, url, pairs, ray_address, None)
        check = _judge(url, sweep_id, n_history, notify, folder)
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
    raise typer.Exit(check.verdict.exit_status)


def _judge(
    url: str, sweep_id: int, history: int, notify: bool, folder: Path | None
) -> NightlyCheck:
    from farm.workflows.pipeline import check_night, publish_night

    with open_session(url) as session:
        check = check_night(session, sweep_id, history=history, notifiers=None if notify else ())
        _print_check(check)
        if folder is not None and check.judged:
            written = publish_night(session, check.verdict, folder, history=history)
            say(f"report: {written[0]} (index: {folder / 'index.html'})")
    return check

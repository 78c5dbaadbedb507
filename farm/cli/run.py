"""`farm run|plan|selftest`: plan a job, run its sweep with a live view, self-test."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.common import (
    DbOption,
    OnlyOption,
    RayOption,
    console,
    db_url,
    fail,
    home,
    open_session,
    parse_pairs,
    say,
)
from farm.cli.inputs import STORE_ID
from farm.cli.preflight import check_job
from farm.cli.reports import show_sweep
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.orchestrate.driver import SweepOptions, SweepOutcome
    from farm.spec import JobSpec

__all__ = ["run_app"]

run_app = typer.Typer(rich_markup_mode="markdown")


def _only(values: list[str] | None) -> dict[str, str]:
    return parse_pairs(values, "--only", "AXIS=VALUE")


def _run_with_progress(job: JobSpec, job_text: str, options: SweepOptions) -> SweepOutcome:
    # Imported here, as in every command below: the sweep, the engines, Ray, the store
    # and the analysis load when a command needs them, not when `farm --help` starts.
    from farm.cli.run_events import console_events
    from farm.orchestrate.driver import run_sweep

    with console_events() as events:
        return run_sweep(job, job_text, options, events)


def print_outcome_lines(outcome: SweepOutcome) -> None:
    """What happened to the results: flushed, still spooled, not saved."""
    for line in outcome.flushed:
        say(f"flushed to the store (spooled earlier): {line}")
    if outcome.spooled:
        say(
            (f"{len(outcome.spooled)} result(s) still spooled", "yellow"),
            " (the store refused them): " + ", ".join(outcome.spooled) + "; `farm spool flush` "
            "stores them once the store is back (the next `farm run` does too)",
        )
    if outcome.unsaved:
        say(
            (f"{len(outcome.unsaved)} result(s) not saved", "red"),
            " (neither the store nor the spool took them): "
            + ", ".join(outcome.unsaved)
            + f"; `farm run JOB --resume {outcome.sweep_id}` runs them again",
        )


def print_outcome(outcome: SweepOutcome, url: str) -> None:
    """What happened to the results, then the stored sweep as a matrix."""
    from farm.store.cells import load_sweep

    print_outcome_lines(outcome)
    try:
        with open_session(url) as session:
            record = load_sweep(session, outcome.sweep_id)
        show_sweep(record, f"sweep {outcome.sweep_id} ({record.job})")
    except FarmError as exc:
        say((f"cannot show sweep {outcome.sweep_id}:", "yellow"), f" {exc}")


@run_app.command()
def run(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    db: DbOption = None,
    only: OnlyOption = None,
    ray_address: RayOption = None,
    dry_run: Annotated[bool, typer.Option(help="plan and stop")] = False,
    resume: Annotated[
        int | None,
        typer.Option(help="finish sweep N: run only its cells not yet stored", parser=STORE_ID),
    ] = None,
) -> None:
    """Run a sweep: build engines, run every cell on Ray, store every result.

    Everything a run reads is checked first (as `farm plan` does); nothing is written
    when a check fails.
    """
    from farm.orchestrate.driver import SweepOptions

    try:
        # Without --ray-address the cells run in a local cluster: on this machine.
        checked, planned = check_job(job_file, _only(only), on_this_machine=ray_address is None)
        job = checked.spec
        if resume is not None:
            from farm.workflows.common import check_resume

            check_resume(checked, planned, _only(only), db_url(db), resume)
        if dry_run:
            _print_plan(job, only)
            return
        options = SweepOptions(
            db_url=db_url(db),
            ray_address=ray_address,
            only=_only(only),
            home=home(),
            resume=resume,
        )
        outcome = _run_with_progress(job, job_file.read_text(), options)
    except FarmError as exc:
        raise fail(exc) from None
    print_outcome(outcome, options.db_url)
    if outcome.failed:
        say((f"{len(outcome.failed)} cell(s) failed:", "red"), " " + ", ".join(outcome.failed))
        raise typer.Exit(1)
    say((f"all {len(outcome.ok)} cells ok", "green"), f"; `farm report {outcome.sweep_id}`")


@run_app.command()
def selftest(
    job_file: Annotated[Path, typer.Argument(help="self-test job")] = Path("jobs/selftest.yaml"),
    db: DbOption = None,
    only: OnlyOption = None,
) -> None:
    """Run the clean build, each canary and the clean build again; show where each differs.

    Exits 1 when a canary is not caught or the clean repeat is flagged.
    """
    from farm.analysis import summarize_sweep
    from farm.analysis.by_context import verdict_context_clauses
    from farm.orchestrate.driver import SweepOptions
    from farm.report.figures import fmt
    from farm.report.findings import render_findings
    from farm.report.table import render_matrix
    from farm.store.cells import load_sweep
    from farm.workflows.selftest.decide import analyze_selftest

    try:
        job = check_job(job_file, _only(only), on_this_machine=True)[0].spec
        options = SweepOptions(db_url=db_url(db), only=_only(only), home=home())
        outcome = _run_with_progress(job, job_file.read_text(), options)
        with open_session(options.db_url) as session:
            record = load_sweep(session, outcome.sweep_id)
    except FarmError as exc:
        raise fail(exc) from None
    rows = summarize_sweep(record)
    console.print(render_matrix(f"self-test sweep {record.sweep_id}", rows))
    report = analyze_selftest(record, job)
    if report.checks.regressions:
        console.print(render_findings(report.checks))
    for finding in report.own_findings:
        say((finding.check, "bold"), f" {finding.summary}")
    healthy = True
    by_context = verdict_context_clauses(report.checks.verdicts)
    for effect in report.effects:
        kind = "canary " + ",".join(effect.added_patches) if effect.expects_drop else "clean repeat"
        where = str(effect.attribution) if effect.attribution else "nowhere"
        say(
            (effect.engine, "bold"),
            f" ({kind}) vs {report.reference}: "
            f"{len(effect.regressed)}/{len(effect.cells)} variants dropped; {where}",
        )
        for verdict, clause in zip(report.checks.verdicts, by_context, strict=True):
            if clause and verdict.candidate.engine == effect.engine and verdict.position is None:
                say(f"  {verdict.candidate.label}: {clause}")
        if not effect.as_expected:
            healthy = False
            say(("  expected " + ("a drop" if effect.expects_drop else "no drop"), "red"))
            # What its variants ran under: a batch-dependent bug needs shared batches.
            for r in rows:
                if r.engine == effect.engine and r.label:
                    say(
                        f"    {r.label}: AL {fmt(r.mean_acceptance_length, 2)}, "
                        f"{fmt(r.verifies_per_step, 1)} requests verifying per engine step"
                    )
    if outcome.failed or not healthy:
        raise typer.Exit(1)


@run_app.command()
def plan(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    only: OnlyOption = None,
    argv: Annotated[bool, typer.Option(help="print each cell's server argv and env")] = True,
) -> None:
    """List the cells a job would run and why any were excluded or remapped. Runs nothing.

    Exits 2 when a run of the job would fail before an engine starts (a missing model,
    prompt file, wheel or tree; a malformed prompt record; an unknown patch; no cell
    left to run), naming file, line and key.
    """
    try:
        job = check_job(job_file, _only(only), on_this_machine=False)[0].spec
        _print_plan(job, only)
        if argv:
            _print_launches(job, only)
    except FarmError as exc:
        raise fail(exc) from None


def _print_launches(job: JobSpec, only: list[str] | None) -> None:
    """Each cell's exact server command and environment (python, port, NPU ids as placeholders)."""
    from farm.engines import plan_launches
    from farm.inert import terminal
    from farm.masking import mask_argv, mask_env
    from farm.orchestrate.driver import plan_job

    launches = plan_launches(job, plan_job(job, _only(only)), python="<build>/bin/python")
    console.print("server argv and env per cell (port and NPU ids are assigned at run time):")
    for cell_id, launch in launches.items():
        shown = mask_env(launch.env)
        # A job's env values and extra_args are the job author's text: shown, never obeyed.
        env = terminal(" ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items())))
        argv = terminal(shlex.join(mask_argv(launch.argv)))
        console.print(
            f"{cell_id}\n  env: {env or '-'}\n  argv: {argv}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _print_plan(job: JobSpec, only: list[str] | None) -> None:
    """The plan's tables, then each planned engine's build id and source."""
    from farm.builds.venv import plan_builds
    from farm.orchestrate.driver import plan_job
    from farm.report.table import render_plan

    plan = plan_job(job, _only(only))
    planned = {c.engine for c in plan.cells}
    builds = plan_builds([e for e in job.engines if e.name in planned])
    for table in render_plan(plan, {b.engine: b.build_id or "unresolved" for b in builds}):
        console.print(table)
    for b in builds:
        if b.build_id:
            patched = f" + {', '.join(b.patches)}" if b.patches else ""
            say(f"build {b.engine}: {b.build_id} ({b.source}{patched})")
        else:
            say(f"build {b.engine}: ", ("unresolved", "red"), f" {b.error}")

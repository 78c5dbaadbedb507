"""`farm run|plan|selftest`: plan a job, run its sweep with a live view, self-test."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from farm import store
from farm.analysis import summarize_sweep
from farm.builds.environment import mask_argv, mask_env
from farm.builds.venv import plan_builds
from farm.cli.common import (
    DbOption,
    console,
    db_url,
    fail,
    home,
    open_session,
    parse_pairs,
    say,
)
from farm.cli.preflight import check_job, check_resume
from farm.cli.progress import SweepProgress, SweepTally
from farm.cli.reports import show_sweep
from farm.engines import plan_launches
from farm.errors import FarmError
from farm.plan import Plan, ServerCell
from farm.records import BuildInfo, CellResult
from farm.report import render_matrix, render_plan
from farm.report.findings import render_findings
from farm.selftest import analyze_selftest
from farm.spec import JobSpec
from farm.sweep import SweepEvents, SweepOptions, SweepOutcome, plan_job, run_sweep

__all__ = ["run_app"]

run_app = typer.Typer()

OnlyOption = Annotated[list[str] | None, typer.Option("--only", help="AXIS=VALUE; repeatable")]


def _only(values: list[str] | None) -> dict[str, str]:
    return parse_pairs(values, "--only", "AXIS=VALUE")


class _ConsoleEvents(SweepEvents):
    def __init__(self) -> None:
        self.tally = SweepTally()
        self.progress = SweepProgress(self.tally, console=console)
        self.task = self.progress.add_task("cells", total=None)

    def planned(self, plan: Plan, sweep_id: int) -> None:
        say(
            "sweep ",
            (str(sweep_id), "bold"),
            f": {len(plan.cells)} server cells, {plan.variant_count} variants, "
            f"{len(plan.excluded)} excluded",
        )
        self.progress.update(self.task, total=len(plan.cells))
        self.tally.total = len(plan.cells)

    def build_line(self, engine: str, line: str) -> None:
        # Cells start on nodes whose build is ready while others still build, so the
        # build's last line shares the progress bar's line.
        self.progress.update(
            self.task, description=f"cells · building {engine} (first run ~3-5 min): {line[:80]}"
        )

    def build_done(self, engine: str, build: BuildInfo | None, error: str | None) -> None:
        self.progress.update(self.task, description="cells")
        if build:
            say(f"build {engine}: ", ("ready", "green"), f" {build.build_id} ({build.env_dir})")
        else:
            say(f"build {engine}: ", ("failed", "red"), f"\n{error}")

    def build_placed(self, engine: str, node: str, error: str | None) -> None:
        state = ("ready", "green") if error is None else ("failed", "red")
        say(f"build {engine} on {node}: ", state, "" if error is None else f": {error}")

    def cells_started(self, count: int) -> None:
        console.print(f"running {count} cells on Ray (each ~1-3 min on 2 CPU cores)")
        self.progress.start()

    def cell_started(self, cell: ServerCell, node: str) -> None:
        self.tally.started(cell.cell_id, node)
        self.progress.refresh()

    def spooled(self, cell_id: str, where: str) -> None:
        say(("spooled", "yellow"), f" {cell_id} (the store refused it): {where}")

    def notice(self, text: str) -> None:
        say(("note", "yellow"), f" {text}")

    def cell_done(self, cell: ServerCell, result: CellResult) -> None:
        self.tally.done(cell.cell_id, result.status == "ok", result.node)
        self.progress.advance(self.task)
        if result.status == "ok":
            parts = []
            for v in result.variants:
                al = v.counters.mean_acceptance_length
                parts.append(
                    f"{v.thinking}/{v.workload} AL={al:.2f}" if al else f"{v.thinking}/{v.workload}"
                )
            say(
                ("ok", "green"),
                f"     {cell.cell_id} "
                f"(start {result.startup_s or 0:.0f}s, gen {result.generation_s or 0:.0f}s) "
                + ", ".join(parts),
            )
        else:
            say((result.status, "red"), f" {cell.cell_id}: {result.error}")


def _run_with_progress(job: JobSpec, job_file: Path, options: SweepOptions) -> SweepOutcome:
    events = _ConsoleEvents()
    try:
        return run_sweep(job, job_file.read_text(), options, events)
    finally:
        events.progress.stop()


def _print_outcome(outcome: SweepOutcome, url: str) -> None:
    """What happened to the results, then the stored sweep as a matrix."""
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
    try:
        with open_session(url) as session:
            record = store.load_sweep(session, outcome.sweep_id)
        show_sweep(record, f"sweep {outcome.sweep_id} ({record.job})")
    except FarmError as exc:
        say((f"cannot show sweep {outcome.sweep_id}:", "yellow"), f" {exc}")


@run_app.command()
def run(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    db: DbOption = None,
    only: OnlyOption = None,
    ray_address: Annotated[str | None, typer.Option(help="join this Ray cluster")] = None,
    dry_run: Annotated[bool, typer.Option(help="plan and stop")] = False,
    resume: Annotated[
        int | None, typer.Option(help="finish sweep N: run only its cells not yet stored")
    ] = None,
) -> None:
    """Run a sweep: build engines, run every cell on Ray, store every result.

    Everything a run reads is checked first (as `farm plan` does); nothing is written
    when a check fails.
    """
    try:
        # Without --ray-address the cells run in a local cluster: on this machine.
        checked, planned = check_job(job_file, _only(only), on_this_machine=ray_address is None)
        job = checked.spec
        if resume is not None:
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
        outcome = _run_with_progress(job, job_file, options)
    except FarmError as exc:
        raise fail(exc) from None
    _print_outcome(outcome, options.db_url)
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
    try:
        job = check_job(job_file, _only(only), on_this_machine=True)[0].spec
        options = SweepOptions(db_url=db_url(db), only=_only(only), home=home())
        outcome = _run_with_progress(job, job_file, options)
        with open_session(options.db_url) as session:
            record = store.load_sweep(session, outcome.sweep_id)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(render_matrix(f"self-test sweep {record.sweep_id}", summarize_sweep(record)))
    report = analyze_selftest(record, job)
    if report.checks.findings:
        console.print(render_findings(report.checks))
    healthy = True
    for effect in report.effects:
        kind = "canary " + ",".join(effect.patches) if effect.patches else "clean repeat"
        where = str(effect.attribution) if effect.attribution else "nowhere"
        say(
            (effect.engine, "bold"),
            f" ({kind}) vs {report.reference}: "
            f"{len(effect.regressed)}/{len(effect.cells)} variants dropped; {where}",
        )
        caught = bool(effect.regressed)
        if caught != bool(effect.patches):
            healthy = False
            say(("  expected " + ("a drop" if effect.patches else "no drop"), "red"))
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
    launches = plan_launches(job, plan_job(job, _only(only)), python="<build>/bin/python")
    console.print("server argv and env per cell (port and NPU ids are assigned at run time):")
    for cell_id, launch in launches.items():
        shown = mask_env(launch.env)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items()))
        console.print(
            f"{cell_id}\n  env: {env or '-'}\n  argv: {shlex.join(mask_argv(launch.argv))}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _print_plan(job: JobSpec, only: list[str] | None) -> None:
    """The plan's tables, then each planned engine's build id and source."""
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

"""`farm run|plan|selftest`: plan a job, run its sweep with a live view, self-test."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from farm import store
from farm.analysis import summarize_sweep
from farm.builds.venv import plan_builds
from farm.cli.common import DbOption, console, db_url, fail, open_session, parse_pairs
from farm.cli.progress import SweepProgress, SweepTally
from farm.cli.reports import show_sweep
from farm.engines import plan_launches
from farm.errors import FarmError
from farm.plan import Plan, ServerCell
from farm.records import BuildInfo, CellResult
from farm.report import render_matrix, render_plan
from farm.report.findings import render_findings
from farm.selftest import analyze_selftest
from farm.spec import JobSpec, load_job
from farm.sweep import SweepEvents, SweepOptions, SweepOutcome, farm_home, plan_job, run_sweep

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
        console.print(
            f"sweep [bold]{sweep_id}[/bold]: {len(plan.cells)} server cells, "
            f"{plan.variant_count} variants, {len(plan.excluded)} excluded"
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
            console.print(
                f"build {engine}: [green]ready[/green] {build.build_id} ({build.env_dir})"
            )
        else:
            console.print(f"build {engine}: [red]failed[/red]\n{error}")

    def build_placed(self, engine: str, node: str, error: str | None) -> None:
        state = "[green]ready[/green]" if error is None else f"[red]failed[/red]: {error}"
        console.print(f"build {engine} on {node}: {state}", highlight=False)

    def cells_started(self, count: int) -> None:
        console.print(f"running {count} cells on Ray (each ~1-3 min on 2 CPU cores)")
        self.progress.start()

    def cell_started(self, cell: ServerCell, node: str) -> None:
        self.tally.started(cell.cell_id, node)
        self.progress.refresh()

    def spooled(self, cell_id: str, where: str) -> None:
        console.print(f"[yellow]spooled[/yellow] {cell_id} (the store refused it): {where}")

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
            console.print(
                f"[green]ok[/green]     {cell.cell_id} "
                f"(start {result.startup_s or 0:.0f}s, gen {result.generation_s or 0:.0f}s) "
                + ", ".join(parts)
            )
        else:
            console.print(f"[red]{result.status}[/red] {cell.cell_id}: {result.error}")


def _run_with_progress(job: JobSpec, job_file: Path, options: SweepOptions) -> SweepOutcome:
    events = _ConsoleEvents()
    try:
        return run_sweep(job, job_file.read_text(), options, events)
    finally:
        events.progress.stop()


def _print_outcome(outcome: SweepOutcome, url: str) -> None:
    """What happened to the results, then the stored sweep as a matrix."""
    for line in outcome.flushed:
        console.print(f"flushed to the store (spooled earlier): {line}", highlight=False)
    if outcome.spooled:
        console.print(
            f"[yellow]{len(outcome.spooled)} result(s) still spooled[/yellow] (the store "
            "refused them): " + ", ".join(outcome.spooled) + "; `farm spool flush` stores "
            "them once the store is back (the next `farm run` does too)"
        )
    try:
        with open_session(url) as session:
            record = store.load_sweep(session, outcome.sweep_id)
        show_sweep(record, f"sweep {outcome.sweep_id} ({record.job})")
    except FarmError as exc:
        console.print(f"[yellow]cannot show sweep {outcome.sweep_id}:[/yellow] {exc}")


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
    """Run a sweep: build engines, run every cell on Ray, store every result."""
    try:
        job = load_job(job_file)
        if dry_run:
            _print_plan(job, only)
            return
        options = SweepOptions(
            db_url=db_url(db),
            ray_address=ray_address,
            only=_only(only),
            home=farm_home(),
            resume=resume,
        )
        outcome = _run_with_progress(job, job_file, options)
    except FarmError as exc:
        raise fail(exc) from None
    _print_outcome(outcome, options.db_url)
    if outcome.failed:
        console.print(
            f"[red]{len(outcome.failed)} cell(s) failed:[/red] " + ", ".join(outcome.failed)
        )
        raise typer.Exit(1)
    console.print(
        f"[green]all {len(outcome.ok)} cells ok[/green]; `farm report {outcome.sweep_id}`"
    )


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
        job = load_job(job_file)
        options = SweepOptions(db_url=db_url(db), only=_only(only), home=farm_home())
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
        console.print(
            f"[bold]{effect.engine}[/bold] ({kind}) vs {report.reference}: "
            f"{len(effect.regressed)}/{len(effect.cells)} variants dropped; {where}"
        )
        caught = bool(effect.regressed)
        if caught != bool(effect.patches):
            healthy = False
            console.print(
                "[red]  expected " + ("a drop" if effect.patches else "no drop") + "[/red]"
            )
    if outcome.failed or not healthy:
        raise typer.Exit(1)


@run_app.command()
def plan(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)")],
    only: OnlyOption = None,
    argv: Annotated[bool, typer.Option(help="print each cell's server argv and env")] = True,
) -> None:
    """List the cells a job would run and why any were excluded or remapped. Runs nothing."""
    try:
        job = load_job(job_file)
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
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
        console.print(
            f"{cell_id}\n  env: {env or '-'}\n  argv: {shlex.join(launch.argv)}",
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
            console.print(f"build {b.engine}: {b.build_id} ({b.source}{patched})", highlight=False)
        else:
            console.print(f"build {b.engine}: [red]unresolved[/red] {b.error}", highlight=False)

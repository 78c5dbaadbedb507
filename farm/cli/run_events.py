"""How `farm run` and `farm selftest` show a running sweep: a line per build and cell,
the live view of :mod:`farm.cli.progress` beneath.

Imported by those commands when they run, not by `farm --help`: the events are the
sweep's (:class:`farm.orchestrate.driver.SweepEvents`), and the sweep imports Ray.

When standard output is not a terminal (cron, CI, ``> log``) rich shows no live view:
the bar is not drawn and only the plain lines are printed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from farm.axes import axes_text
from farm.cli.common import console, say
from farm.cli.progress import SweepProgress, SweepTally
from farm.orchestrate.driver import SweepEvents
from farm.plan import Plan, ServerCell
from farm.records import BuildInfo, CellResult

__all__ = ["ConsoleEvents", "console_events"]


class ConsoleEvents(SweepEvents):
    """Sweep events printed to the console: one line each, the live view beneath."""

    def __init__(self, stored: Callable[[int, str, datetime], None] | None = None) -> None:
        """``stored``: told (sweep id, cell id, the cell's end) of each result the store
        took, after its line is printed (a nightly's early alerts)."""
        self.tally = SweepTally()
        self.progress = SweepProgress(self.tally, console=console)
        self.task = self.progress.add_task("cells", total=None)
        self.stored = stored
        self.sweep_id: int | None = None
        self.spooled_ids: set[str] = set()

    def planned(self, plan: Plan, sweep_id: int) -> None:
        self.sweep_id = sweep_id
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
        console.print(f"running {count} cells on Ray (each ~0.5-1 min on 2 CPU cores)")
        self.progress.start()

    def cell_started(self, cell: ServerCell, node: str) -> None:
        self.tally.started(cell.cell_id, node)
        self.progress.refresh()

    def spooled(self, cell_id: str, where: str) -> None:
        self.spooled_ids.add(cell_id)
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
                label = axes_text(v.axes)
                parts.append(f"{label} AL={al:.2f}" if al else label)
            say(
                ("ok", "green"),
                f"     {cell.cell_id} "
                f"(start {result.startup_s or 0:.0f}s, gen {result.generation_s or 0:.0f}s) "
                + ", ".join(parts),
            )
        else:
            say((result.status, "red"), f" {cell.cell_id}: {result.error}")
        stored = cell.cell_id not in self.spooled_ids
        if self.stored is not None and self.sweep_id is not None and stored:
            self.stored(self.sweep_id, cell.cell_id, result.finished_at)


@contextmanager
def console_events(
    stored: Callable[[int, str, datetime], None] | None = None,
) -> Iterator[ConsoleEvents]:
    """A sweep's console view (:class:`ConsoleEvents`), stopped when the sweep ends: the
    ``progress`` a workflow runs its sweep with (:func:`farm.workflows.common.run_stored`)."""
    events = ConsoleEvents(stored)
    try:
        yield events
    finally:
        events.progress.stop()

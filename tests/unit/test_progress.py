"""The live view of `farm run`: cells per state and per node."""

from __future__ import annotations

from rich.console import Console

from farm.cli.progress import SweepProgress, SweepTally


def test_tally_counts_cells_per_state_and_node() -> None:
    tally = SweepTally()
    tally.total = 4
    tally.started("c1", "host:aaaa")
    tally.started("c2", "host:bbbb")
    assert (tally.queued, len(tally.running), tally.ok, tally.failed) == (2, 2, 0, 0)
    tally.done("c1", ok=True, node="host:aaaa")
    # Re-run elsewhere after its node died: it counts where it finished.
    tally.done("c2", ok=False, node="host:cccc")
    tally.done("c3", ok=False, node=None)  # failed before it started (no node)
    assert (tally.queued, len(tally.running), tally.ok, tally.failed) == (1, 0, 1, 2)
    assert tally.by_node["host:aaaa"] == {"running": 0, "ok": 1}
    assert tally.by_node["host:bbbb"]["running"] == 0
    assert tally.by_node["host:cccc"]["failed"] == 1


def test_progress_shows_states_and_nodes_under_the_bar() -> None:
    console = Console(record=True, width=120, force_terminal=False)
    tally = SweepTally()
    tally.total = 3
    progress = SweepProgress(tally, console=console)
    task = progress.add_task("cells", total=3)
    tally.started("c1", "vm:1234abcd")
    tally.done("c1", ok=True, node="vm:1234abcd")
    tally.started("c2", "vm:5678ef01")
    progress.advance(task)
    for renderable in progress.get_renderables():
        console.print(renderable)
    text = console.export_text()
    assert "queued 1 · running 1 · ok 1 · failed 0" in text
    assert "vm:1234abcd" in text and "vm:5678ef01" in text

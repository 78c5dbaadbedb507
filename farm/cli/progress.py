"""The live view of `farm run`: a bar, cells per state, and cells per node.

Descriptions and node names are text, never markup: a build's output line or a host
name may hold brackets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rich.console import RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

__all__ = ["SweepProgress", "SweepTally"]


class SweepTally:
    """Cells by state (queued, running, ok, failed) and by node, as events arrive."""

    def __init__(self) -> None:
        self.total = 0
        self.running: dict[str, str] = {}  # cell id -> node
        self.ok = 0
        self.failed = 0
        self.by_node: dict[str, Counter[str]] = {}

    @property
    def queued(self) -> int:
        return max(self.total - len(self.running) - self.ok - self.failed, 0)

    def started(self, cell_id: str, node: str) -> None:
        self.running[cell_id] = node
        self.by_node.setdefault(node, Counter())["running"] += 1

    def done(self, cell_id: str, ok: bool, node: str | None) -> None:
        where = self.running.pop(cell_id, None)
        if where is not None:
            self.by_node[where]["running"] -= 1
        # A cell re-run elsewhere after its node died reports the node it ended on.
        node = node or where
        if node is not None:
            self.by_node.setdefault(node, Counter())["ok" if ok else "failed"] += 1
        if ok:
            self.ok += 1
        else:
            self.failed += 1

    def states(self) -> Text:
        return Text.assemble(
            f"queued {self.queued} · running {len(self.running)} · ",
            (f"ok {self.ok}", "green"),
            " · ",
            (f"failed {self.failed}", "red"),
        )

    def node_table(self) -> Table | None:
        if not self.by_node:
            return None
        table = Table("node", "running", "ok", "failed", box=None, padding=(0, 2))
        for node, counts in sorted(self.by_node.items()):
            table.add_row(Text(node), *(str(counts[k]) for k in ("running", "ok", "failed")))
        return table


class SweepProgress(Progress):
    """A rich progress bar with the tally's states and node table under it."""

    def __init__(self, tally: SweepTally, **kwargs: object) -> None:
        self.tally = tally  # before Progress.__init__, which may render already
        super().__init__(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            **kwargs,  # type: ignore[arg-type]
        )

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        yield self.tally.states()
        table = self.tally.node_table()
        if table is not None:
            yield table

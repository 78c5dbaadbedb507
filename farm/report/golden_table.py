"""The goldens of a case file (or folder) as a terminal table (`farm goldens show`).

Readable at 80 columns: each golden's name, model and source stack in one column and
fold inside it; the per-position figures never fold (a baseline read across two lines
is misread).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from farm.inert import terminal
from farm.spec.goldens import Golden

__all__ = ["render_goldens"]


def _baseline(g: Golden) -> str:
    return " ".join(f"{b:.2f}" for b in g.baseline)


def render_goldens(goldens: Sequence[Golden], title: str) -> Table:
    """One row per golden: its case, model and source; the speculative method and k,
    dataset and batch size; the per-position baseline and its (absolute) threshold."""
    table = Table(title=Text(terminal(title)), title_justify="left", box=box.SIMPLE_HEAD)
    figures = [_baseline(g) for g in goldens]
    table.add_column("golden: case, model, source", overflow="fold", ratio=3)
    table.add_column("method k, dataset, batch", overflow="fold", ratio=2)
    table.add_column("baseline", no_wrap=True, min_width=max(map(cell_len, figures), default=8))
    table.add_column("thr", no_wrap=True, justify="right")
    for g, figure in zip(goldens, figures, strict=True):
        # Every word of a case file is outside text: no escape sequence reaches the
        # terminal (farm.inert.terminal).
        table.add_row(
            Text(f"{terminal(g.label)}\n{terminal(g.model)}\n{terminal(g.where)}"),
            Text(
                f"{terminal(g.method or '-')} k={g.k}\n{terminal(g.dataset)}\nbatch {g.batch_size}"
            ),
            Text(figure),
            Text(f"{g.threshold:.2f}"),
        )
    return table

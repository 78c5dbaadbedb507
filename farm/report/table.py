"""Terminal tables: the plan before a sweep, the measured matrix after it.

Every cell and title is :class:`~rich.text.Text`: names, remaps, reasons and engine
errors hold brackets that rich markup would eat or fail on, whatever the console.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from rich.text import Text

from farm.analysis import VariantSummary
from farm.plan import Plan
from farm.report.figures import (
    FIGURE_HEADINGS,
    matrix_axes,
    matrix_headings,
    row_axes,
    row_figures,
)

__all__ = ["render_matrix", "render_plan"]


def _texts(values: Iterable[str]) -> list[Text]:
    return [Text(v) for v in values]


def render_plan(plan: Plan, build_ids: dict[str, str] | None = None) -> list[Table]:
    """Cells to run (with remaps) and cells excluded (with reasons)."""
    cells = Table(
        title=Text(f"{plan.job}: {len(plan.cells)} server cells, {plan.variant_count} variants")
    )
    cells.add_column("cell", overflow="fold")
    for col in ("build", "graph (planned)", "variants", "remaps"):
        cells.add_column(col, overflow="fold")
    for c in plan.cells:
        cells.add_row(
            *_texts(
                (
                    c.cell_id,
                    (build_ids or {}).get(c.engine, c.engine),
                    c.planned_graph_mode,
                    ", ".join(v.key for v in c.variants),
                    "\n".join(c.remaps) or "-",
                )
            )
        )
    tables = [cells]
    if plan.excluded:
        excluded = Table(title=f"excluded: {len(plan.excluded)}")
        excluded.add_column("axes", overflow="fold")
        excluded.add_column("reason", overflow="fold")
        for e in plan.excluded:
            excluded.add_row(Text(e.label), Text(e.reason))
        tables.append(excluded)
    return tables


def render_matrix(title: str, rows: tuple[VariantSummary, ...]) -> Table:
    """The sweep matrix: one row per variant with acceptance and agreement figures."""
    table = Table(title=Text(title))
    shown = matrix_axes(rows)
    for heading in (*matrix_headings(shown), "status"):
        table.add_column(heading, overflow="fold")
    for heading in FIGURE_HEADINGS:
        # Folded, not cut with an ellipsis: every digit stays in the output.
        table.add_column(
            heading, justify="left" if heading == "per position" else "right", overflow="fold"
        )
    for r in rows:
        status = (
            r.status if not r.failed_requests else f"{r.status} ({r.failed_requests} req failed)"
        )
        if r.error:
            status += f": {r.error[:60]}"
        table.add_row(*_texts((*row_axes(r, shown), status, *row_figures(r))))
    return table

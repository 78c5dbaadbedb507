"""Terminal tables: the plan before a sweep, the measured matrix after it."""

from __future__ import annotations

from rich.table import Table

from farm.analysis import VariantSummary
from farm.plan import Plan
from farm.report.figures import row_axes, row_figures

__all__ = ["render_matrix", "render_plan"]


def render_plan(plan: Plan, build_ids: dict[str, str] | None = None) -> list[Table]:
    """Cells to run (with remaps) and cells excluded (with reasons)."""
    cells = Table(
        title=f"{plan.job}: {len(plan.cells)} server cells, {plan.variant_count} variants"
    )
    cells.add_column("cell", overflow="fold")
    for col in ("build", "graph (planned)", "variants", "remaps"):
        cells.add_column(col)
    for c in plan.cells:
        cells.add_row(
            c.cell_id,
            (build_ids or {}).get(c.engine, c.engine),
            c.planned_graph_mode,
            ", ".join(v.key for v in c.variants),
            "\n".join(c.remaps) or "-",
        )
    tables = [cells]
    if plan.excluded:
        excluded = Table(title=f"excluded: {len(plan.excluded)}")
        excluded.add_column("axes")
        excluded.add_column("reason")
        for e in plan.excluded:
            excluded.add_row(e.label, e.reason)
        tables.append(excluded)
    return tables


def render_matrix(title: str, rows: tuple[VariantSummary, ...]) -> Table:
    """The sweep matrix: one row per variant with acceptance and agreement figures."""
    table = Table(title=title)
    engines = len({r.engine for r in rows}) > 1
    if engines:
        table.add_column("engine")
    for col in (
        "graph",
        "eff.",
        "mtp",
        "swa",
        "think",
        "workload",
        "status",
        "rate",
        "AL",
        "per-position",
        "greedy=",
        "acc",
        "tok/s",
    ):
        table.add_column(col, justify="right" if col in ("rate", "AL", "acc", "tok/s") else "left")
    for r in rows:
        status = (
            r.status if not r.failed_requests else f"{r.status} ({r.failed_requests} req failed)"
        )
        if r.error:
            status += f": {r.error[:60]}"
        axes = row_axes(r)
        table.add_row(*(axes if engines else axes[1:]), status, *row_figures(r))
    return table

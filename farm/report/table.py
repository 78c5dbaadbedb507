"""Terminal tables: the plan before a sweep, the measured matrix after it."""

from __future__ import annotations

from rich.table import Table

from farm.analysis import VariantSummary
from farm.plan import Plan

__all__ = ["render_matrix", "render_plan"]


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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
        greedy = "-" if r.greedy_compared is None else f"{r.greedy_same}/{r.greedy_compared}"
        status = (
            r.status if not r.failed_requests else f"{r.status} ({r.failed_requests} req failed)"
        )
        if r.error:
            status += f": {r.error[:60]}"
        table.add_row(
            *([r.engine] if engines else []),
            r.graph_mode,
            r.effective_graph_mode or "-",
            str(r.mtp_depth),
            r.sliding_window,
            r.thinking or "-",
            r.workload or "-",
            status,
            _f(r.acceptance_rate),
            _f(r.mean_acceptance_length, 2),
            " ".join(f"{p:.2f}" for p in r.per_position) or "-",
            greedy,
            _f(r.accuracy, 2),
            _f(r.output_tokens_per_s, 1),
        )
    return table

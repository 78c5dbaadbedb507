"""Acceptance by prompt-set category (MT-Bench, SPEED-Bench), for the terminal, Markdown
and HTML reports: one row per variant and category, the variants' categories side by
side so a drop confined to one kind of prompt (coding, long context) stands out."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from farm.analysis.summary import VariantSummary
from farm.inert import terminal
from farm.report.figures import fmt

__all__ = ["CATEGORY_HEADINGS", "category_rows", "render_category_table"]

CATEGORY_HEADINGS = ("variant", "category", "requests", "AL", "per position")


def category_rows(summaries: Sequence[VariantSummary]) -> list[tuple[str, ...]]:
    """``CATEGORY_HEADINGS`` rows of every variant that has acceptance by category."""
    rows: list[tuple[str, ...]] = []
    for s in summaries:
        for c in s.categories:
            rows.append(
                (
                    s.label or s.cell_id,
                    c.category,
                    str(c.requests),
                    fmt(c.mean_acceptance_length, 2),
                    " ".join(f"{p:.2f}" for p in c.per_position) or "-",
                )
            )
    return rows


def render_category_table(summaries: Sequence[VariantSummary]) -> Table | None:
    """The rows as a rich table (wrapping the variant's label, so it fits 80 columns),
    or None when no variant has categories."""
    rows = category_rows(summaries)
    if not rows:
        return None
    table = Table(title="acceptance by category", title_justify="left")
    for i, heading in enumerate(CATEGORY_HEADINGS):
        table.add_column(heading, justify="right" if i in (2, 3) else "left", overflow="fold")
    shown = None
    for variant, *figures in rows:
        # Text, not markup: a label's "[think-on.mt-bench]" is no rich style tag; a
        # category comes from a user's file, its control characters shown, not run.
        cells = ("" if variant == shown else variant, *figures)
        table.add_row(*(Text(terminal(c)) for c in cells))
        shown = variant
    return table

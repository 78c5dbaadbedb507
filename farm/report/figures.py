"""How a sweep-matrix row reads, shared by the terminal, Markdown and HTML reports.

One set of column headings for all three: the axes' short names (``farm.axes``),
the effective graph mode beside the requested one, then the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

from farm.analysis import VariantSummary
from farm.axes import AXES, Axis

__all__ = ["FIGURE_HEADINGS", "fmt", "matrix_axes", "matrix_headings", "row_axes", "row_figures"]

FIGURE_HEADINGS = (
    "rate",
    "AL",
    "per position",
    "greedy =",
    "accuracy",
    "tok/s",
    "batch",
    "cache hit",
)
_EFFECTIVE = "effective"


def fmt(x: float | None, digits: int = 3) -> str:
    """A figure to ``digits`` decimals, or ``-`` when there is none."""
    return "-" if x is None else f"{x:.{digits}f}"


def matrix_axes(rows: Sequence[VariantSummary]) -> tuple[str, ...]:
    """The axes shown as columns: every axis, except the job's engine or model list
    when all rows share one (the title names it then) and an axis added later that
    every row holds at its implicit value (the job does not vary it)."""

    def shown(a: Axis) -> bool:
        values = {r.axes.get(a.name) for r in rows}
        if a.source in ("engines", "models"):
            return len(values) > 1
        return a.implicit is None or values - {a.implicit, None} != set()

    return tuple(a.name for a in AXES if shown(a))


def matrix_headings(shown: Sequence[str]) -> tuple[str, ...]:
    """Headings of the axis columns of :func:`row_axes`."""
    out: list[str] = []
    for a in AXES:
        if a.name in shown:
            out.append(a.short or a.name)
            if a.name == "graph_mode":
                out.append(_EFFECTIVE)
    return tuple(out)


def row_axes(r: VariantSummary, shown: Sequence[str]) -> tuple[str, ...]:
    """The row's value of each shown axis (``-`` where it has none), the effective graph
    mode after the requested one."""
    out: list[str] = []
    for a in AXES:
        if a.name in shown:
            out.append(str(r.axes.get(a.name, "-")))
            if a.name == "graph_mode":
                out.append(r.effective_graph_mode or "-")
    return tuple(out)


def row_figures(r: VariantSummary) -> tuple[str, ...]:
    """rate, AL, per position, greedy agreement, accuracy, output tokens per second,
    requests verifying per engine step, prefix cache hit rate."""
    return (
        fmt(r.acceptance_rate),
        fmt(r.mean_acceptance_length, 2),
        " ".join(f"{p:.2f}" for p in r.per_position) or "-",
        "-" if r.greedy_compared is None else f"{r.greedy_same}/{r.greedy_compared}",
        fmt(r.accuracy, 2),
        fmt(r.output_tokens_per_s, 1),
        fmt(r.verifies_per_step, 1),
        fmt(r.prefix_hit_rate, 2),
    )

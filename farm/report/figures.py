"""How a sweep-matrix row reads, shared by the terminal, Markdown and HTML reports."""

from __future__ import annotations

from farm.analysis import VariantSummary

__all__ = ["fmt", "row_axes", "row_figures"]


def fmt(x: float | None, digits: int = 3) -> str:
    """A figure to ``digits`` decimals, or ``-`` when there is none."""
    return "-" if x is None else f"{x:.{digits}f}"


def row_axes(r: VariantSummary) -> tuple[str, ...]:
    """engine, graph, effective graph, MTP depth, window, thinking, workload."""
    return (
        r.engine,
        r.graph_mode,
        r.effective_graph_mode or "-",
        str(r.mtp_depth),
        r.sliding_window,
        r.thinking or "-",
        r.workload or "-",
    )


def row_figures(r: VariantSummary) -> tuple[str, ...]:
    """rate, AL, per position, greedy agreement, accuracy, output tokens per second."""
    return (
        fmt(r.acceptance_rate),
        fmt(r.mean_acceptance_length, 2),
        " ".join(f"{p:.2f}" for p in r.per_position) or "-",
        "-" if r.greedy_compared is None else f"{r.greedy_same}/{r.greedy_compared}",
        fmt(r.accuracy, 2),
        fmt(r.output_tokens_per_s, 1),
    )

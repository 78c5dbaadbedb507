"""Bars, trends and runs as inline SVG: acceptance per draft position, AL per sweep,
AL along one variant's run. Pure: each a self-contained ``<svg>`` string (no scripts,
fonts or external files). The matrix grid is :mod:`farm.report.grid`, drawn by
:mod:`farm.report.heatmap`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from farm.analysis.history import HistoryPoint
from farm.analysis.over_run import ProfileBin
from farm.inert import html_text
from farm.report.svg import CHAR_W, FONT, fit, nice_limit, svg_text, two_lines

__all__ = ["TrendPoint", "bars_svg", "over_run_svg", "trend_points", "trend_svg"]

_SMALL_W = CHAR_W * 11 / 12  # CHAR_W at 11px (a chart's title, class "small")


@dataclass(frozen=True)
class TrendPoint:
    """One sweep's AL for a cell key, with its interval when known."""

    sweep_id: int
    value: float
    low: float | None = None
    high: float | None = None


def bars_svg(
    title: str,
    values: Sequence[float],
    reference: Sequence[float] = (),
    *,
    failed: str | None = None,
    flagged_positions: Sequence[int] = (),
) -> str:
    """Acceptance per draft position as bars (0..1), the reference's as black ticks.

    ``failed`` replaces the bars with that message. Flagged positions (a depth
    invariance finding) are drawn red.
    """
    w, h = 250.0, 132.0
    left, right, top, bottom = 34.0, 8.0, 22.0, 26.0
    pw, ph = w - left - right, h - top - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="bars" role="img" width="{w:.0f}" '
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" style="{FONT}">',
        f"<title>{html_text(title)}</title>",
        svg_text(4, 13, fit(title, w - 8, _SMALL_W), "small", "start"),
    ]
    for frac in (0.0, 0.5, 1.0):
        gy = top + ph * (1 - frac)
        parts.append(
            f'<line x1="{left:.1f}" x2="{left + pw:.1f}" y1="{gy:.1f}" y2="{gy:.1f}" '
            'stroke="#dddddd"/>'
        )
        parts.append(svg_text(left - 4, gy + 4, f"{frac:g}", "tick", "end"))
    if failed is not None or not values:
        parts.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{pw:.1f}" height="{ph:.1f}" '
            'fill="#fff3f7" stroke="#c51b7d" stroke-dasharray="5 3"/>'
        )
        parts.append(svg_text(left + pw / 2, top + ph / 2 + 4, failed or "no data", "v"))
    else:
        slot = pw / len(values)
        bw = min(34.0, slot * 0.7)
        for i, v in enumerate(values):
            bx = left + slot * i + (slot - bw) / 2
            bh = ph * max(0.0, min(1.0, v))
            colour = "#b2182b" if i in flagged_positions else "#4a7fb5"
            parts.append(
                f'<rect class="bar" x="{bx:.1f}" y="{top + ph - bh:.1f}" width="{bw:.1f}" '
                f'height="{bh:.1f}" fill="{colour}"><title>position {i}: {v:.3f}'
                + (f" (reference {reference[i]:.3f})" if i < len(reference) else "")
                + "</title></rect>"
            )
            if bh > 18:
                parts.append(
                    svg_text(bx + bw / 2, top + ph - bh + 13, f"{v:.2f}", "tick", fill="#ffffff")
                )
            else:
                parts.append(svg_text(bx + bw / 2, top + ph - bh - 3, f"{v:.2f}", "tick"))
            if i < len(reference):
                ry = top + ph * (1 - max(0.0, min(1.0, reference[i])))
                parts.append(
                    f'<line class="ref" x1="{bx - 3:.1f}" x2="{bx + bw + 3:.1f}" '
                    f'y1="{ry:.1f}" y2="{ry:.1f}" stroke="#000000" stroke-width="2"/>'
                )
            parts.append(svg_text(bx + bw / 2, h - bottom + 13, str(i), "tick"))
    parts.append(svg_text(left + pw / 2, h - 2, "draft position", "tick"))
    parts.append("</svg>")
    return "".join(parts)


def trend_svg(
    title: str,
    points: Sequence[TrendPoint],
    *,
    current: int | None = None,
    flagged: bool = False,
) -> str:
    """AL per sweep as a line with interval whiskers; sweep ``current`` highlighted."""
    w, h = 330.0, 152.0
    left, right, top, bottom = 46.0, 10.0, 36.0, 30.0
    pw, ph = w - left - right, h - top - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="trend" role="img" width="{w:.0f}" '
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" style="{FONT}">',
        f"<title>{html_text(title)}</title>",
    ]
    for k, line in enumerate(two_lines(title, w - 8)):
        parts.append(svg_text(4, 13 + 14 * k, line, "small", "start"))
    if not points:
        parts.append(svg_text(w / 2, h / 2, "no history", "v"))
        parts.append("</svg>")
        return "".join(parts)
    lows = [p.low if p.low is not None else p.value for p in points]
    highs = [p.high if p.high is not None else p.value for p in points]
    lo, hi = min(lows), max(highs)
    pad = max((hi - lo) * 0.1, 0.02)
    lo, hi = lo - pad, hi + pad

    def sx(i: int) -> float:
        return left + (pw * i / (len(points) - 1) if len(points) > 1 else pw / 2)

    def sy(v: float) -> float:
        return top + ph * (1 - (v - lo) / (hi - lo))

    for v in (lo + pad, hi - pad):
        parts.append(
            f'<line x1="{left:.1f}" x2="{left + pw:.1f}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" '
            'stroke="#dddddd"/>'
        )
        parts.append(svg_text(left - 4, sy(v) + 4, f"{v:.2f}", "tick", "end"))
    for i, p in enumerate(points):
        if p.low is not None and p.high is not None:
            parts.append(
                f'<line x1="{sx(i):.1f}" x2="{sx(i):.1f}" y1="{sy(p.low):.1f}" '
                f'y2="{sy(p.high):.1f}" stroke="#9ab" stroke-width="3"/>'
            )
    path = " ".join(f"{sx(i):.1f},{sy(p.value):.1f}" for i, p in enumerate(points))
    parts.append(f'<polyline points="{path}" fill="none" stroke="#4a7fb5" stroke-width="1.5"/>')
    step = max(1, math.ceil(len(points) / 8))
    for i, p in enumerate(points):
        is_current = p.sweep_id == current
        colour = ("#b2182b" if flagged else "#000000") if is_current else "#4a7fb5"
        interval = (
            f" [{p.low:.3f}, {p.high:.3f}]" if p.low is not None and p.high is not None else ""
        )
        parts.append(
            f'<circle cx="{sx(i):.1f}" cy="{sy(p.value):.1f}" r="{4.5 if is_current else 2.5}" '
            f'fill="{colour}"><title>sweep {p.sweep_id}: AL {p.value:.3f}{interval}</title>'
            "</circle>"
        )
        if i % step == 0 or i == len(points) - 1 or is_current:
            parts.append(svg_text(sx(i), h - bottom + 14, str(p.sweep_id), "tick"))
    parts.append(svg_text(left + pw / 2, h - 3, "sweep", "tick"))
    ym = top + ph / 2
    parts.append(svg_text(12, ym, "AL", "tick", transform=f"rotate(-90 12 {ym:.1f})"))
    parts.append("</svg>")
    return "".join(parts)


def over_run_svg(
    title: str,
    bins: Sequence[ProfileBin],
    *,
    unit: Literal["request", "round"] = "request",
    split_at: int | None = None,
    before_al: float | None = None,
    after_al: float | None = None,
) -> str:
    """AL along one variant's run: one point per stretch of requests (``bins``, from
    :func:`farm.analysis.over_run.run_profile`) or per conversation round (bin ``r - 1``
    .. ``r``), joined; with a collapse, a red line where the later part begins
    (``split_at``, in the bins' units) and dashed lines at the AL before and after it.
    620 px wide: two fit side by side in a 1280 px window."""
    w, h = 620.0, 230.0
    left, right, top, bottom = 50.0, 16.0, 40.0, 34.0
    pw, ph = w - left - right, h - top - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="overrun" role="img" width="{w:.0f}" '
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" style="{FONT}">',
        f"<title>{html_text(title)}</title>",
    ]
    for k, line in enumerate(two_lines(title, w - 8)):
        parts.append(svg_text(4, 13 + 14 * k, line, "small", "start"))
    shown = [b for b in bins if b.al is not None and math.isfinite(b.al)]
    if not shown:
        parts.append(svg_text(w / 2, h / 2, "no acceptance counted", "v"))
        parts.append("</svg>")
        return "".join(parts)
    values = [b.al for b in shown if b.al is not None]
    levels = [v for v in (before_al, after_al) if v is not None]
    hi = max([*values, *levels]) * 1.05
    frame = _Frame(left, top, pw, ph, x_max=max(b.end for b in bins), lo=1.0, hi=hi)
    parts += _value_lines(frame)
    if split_at is not None:
        parts += _split_marks(frame, split_at, unit, before_al, after_al)
    parts += _run_line(frame, shown, unit)
    parts += _run_ticks(frame, bins, unit, h - bottom + 14)
    axis_name = "requests in the order served" if unit == "request" else "conversation round"
    parts.append(svg_text(left + pw / 2, h - 4, axis_name, "tick"))
    ym = top + ph / 2
    parts.append(svg_text(12, ym, "AL", "tick", transform=f"rotate(-90 12 {ym:.1f})"))
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class _Frame:
    """A chart's plotting area (px) and its scales: x from 0 to ``x_max``, y from ``lo``
    to ``hi``; a scale of no extent puts everything in the middle."""

    left: float
    top: float
    width: float
    height: float
    x_max: float
    lo: float
    hi: float

    def x(self, value: float) -> float:
        if not self.x_max:
            return self.left + self.width / 2
        return self.left + self.width * value / self.x_max

    def y(self, value: float) -> float:
        if not self.hi > self.lo:
            return self.top + self.height / 2
        return self.top + self.height * (1 - (value - self.lo) / (self.hi - self.lo))


def _value_lines(frame: _Frame) -> list[str]:
    """Horizontal grid lines at round values from ``lo`` up, each labelled on the left."""
    parts = []
    step = nice_limit((frame.hi - frame.lo) / 4) if frame.hi > frame.lo else 1.0
    tick = frame.lo
    while tick <= frame.hi + 1e-9:
        y = frame.y(tick)
        parts.append(
            f'<line x1="{frame.left:.1f}" x2="{frame.left + frame.width:.1f}" y1="{y:.1f}" '
            f'y2="{y:.1f}" stroke="#dddddd"/>'
        )
        parts.append(svg_text(frame.left - 5, y + 4, f"{tick:.2f}", "tick", "end"))
        tick += step
    return parts


def _split_marks(
    frame: _Frame,
    split_at: int,
    unit: Literal["request", "round"],
    before_al: float | None,
    after_al: float | None,
) -> list[str]:
    """The red line where a collapse begins, named, and the dashed AL levels before and
    after it."""
    x = frame.x(split_at)
    top, bottom = frame.top, frame.top + frame.height
    parts = [
        f'<line class="split" x1="{x:.1f}" x2="{x:.1f}" y1="{top:.1f}" '
        f'y2="{bottom:.1f}" stroke="#b2182b" stroke-width="1.5"/>'
    ]
    said = f"{unit} {split_at + 1}" if unit == "request" else f"round {split_at + 1}"
    anchor = "end" if x > frame.left + frame.width * 0.7 else "start"
    parts.append(
        svg_text(x + (-4 if anchor == "end" else 4), top + 12, said, "mark", anchor, fill="#b2182b")
    )
    for value, x0, x1, word in (
        (before_al, 0.0, float(split_at), "before"),
        (after_al, float(split_at), float(frame.x_max), "after"),
    ):
        if value is None:
            continue
        y = frame.y(value)
        parts.append(
            f'<line class="level" x1="{frame.x(x0):.1f}" x2="{frame.x(x1):.1f}" y1="{y:.1f}" '
            f'y2="{y:.1f}" stroke="#333333" stroke-dasharray="6 4"/>'
        )
        parts.append(
            svg_text(
                (frame.x(x0) + frame.x(x1)) / 2,
                y - 5,
                f"AL {value:.2f} {word}",
                "tick",
                fill="#333333",
            )
        )
    return parts


def _run_line(
    frame: _Frame, shown: Sequence[ProfileBin], unit: Literal["request", "round"]
) -> list[str]:
    """The bins' AL joined at their middles, a point per bin with its stretch and AL."""
    mid = [((b.start + b.end) / 2, b.al) for b in shown]
    path = " ".join(f"{frame.x(x):.1f},{frame.y(v):.1f}" for x, v in mid if v is not None)
    parts = [f'<polyline points="{path}" fill="none" stroke="#4a7fb5" stroke-width="1.5"/>']
    for b in shown:
        assert b.al is not None
        where = f"requests {b.start + 1}-{b.end}" if unit == "request" else f"round {b.end}"
        parts.append(
            f'<circle cx="{frame.x((b.start + b.end) / 2):.1f}" cy="{frame.y(b.al):.1f}" r="2.5" '
            f'fill="#4a7fb5"><title>{html_text(where)}: AL {b.al:.3f}</title></circle>'
        )
    return parts


def _run_ticks(
    frame: _Frame, bins: Sequence[ProfileBin], unit: Literal["request", "round"], y: float
) -> list[str]:
    """The x axis's labels at height ``y``: seven request counts, or the rounds (at most
    about twelve of them, the last always)."""
    total = frame.x_max
    if unit == "request":
        return [
            svg_text(frame.x(total * i / 6), y, f"{total * i / 6:.0f}", "tick") for i in range(7)
        ]
    every = max(1, math.ceil(len(bins) / 12))
    return [
        svg_text(frame.x((b.start + b.end) / 2), y, str(b.end), "tick")
        for i, b in enumerate(bins)
        if i % every == 0 or i == len(bins) - 1
    ]


def trend_points(points: Sequence[HistoryPoint]) -> list[TrendPoint]:
    """Chart points of a :func:`farm.analysis.history.series_from_sweeps` series."""
    return [
        TrendPoint(sweep_id=p.sweep_id, value=p.value, low=_finite(p.low), high=_finite(p.high))
        for p in points
    ]


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None

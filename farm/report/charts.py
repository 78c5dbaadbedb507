"""The sweep matrix as a grid of AL differences, and inline SVG pictures of it. Pure.

:func:`al_grid` lays the spec-on variants of a sweep out as rows = graph mode x MTP
depth x sliding window and columns = thinking x workload x engine (x model when the
sweep has several), each holding its AL minus the AL of its *reference*: eager at the
same other axes (``mode="graph"``), or the base engine at the same other axes
(``mode="engine"``). Where a check judged the same pair, the cell carries the
verdict's interval and whether it regressed. The SVG functions draw a grid, bars and
trends as self-contained ``<svg>`` strings (no scripts, fonts or external files).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from farm.analysis.check_rules import CheckReport, Verdict
from farm.analysis.history import HistoryPoint
from farm.analysis.over_run import ProfileBin
from farm.analysis.summary import VariantSummary
from farm.axes import (
    REQUEST_AXES,
    SERVER_AXES,
    AxisValue,
    axes_text,
    axis,
    explicit,
    speculates,
)
from farm.inert import html_text
from farm.records import CellResult, SweepRecord

__all__ = [
    "GRAPH_ORDER",
    "Grid",
    "GridCell",
    "GridMode",
    "TrendPoint",
    "al_grid",
    "bars_svg",
    "color_for",
    "heatmap_svg",
    "nice_limit",
    "over_run_svg",
    "trend_points",
    "trend_svg",
]

GridMode = Literal["graph", "engine"]
CellKind = Literal["value", "reference", "failed", "missing", "no_reference"]
GRAPH_ORDER = ("eager", "compiled", "piecewise", "full_decode_only", "full")

# ColorBrewer RdBu ends and midpoint: red = lower AL than the reference, blue = higher.
_LOW, _MID, _HIGH = (178, 24, 43), (247, 247, 247), (33, 102, 172)
_FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"
_CHAR_W = 7.0  # average glyph width at 12px, for laying out labels
_SMALL_W = _CHAR_W * 11 / 12  # the same at 11px (a chart's title, class "small")
_LEGEND_W = 520.0


@dataclass(frozen=True)
class GridCell:
    """One variant in the grid; ``difference`` = AL - reference AL."""

    kind: CellKind
    label: str = ""
    al: float | None = None
    reference_al: float | None = None
    difference: float | None = None
    interval: tuple[float, float] | None = None
    flagged: bool = False
    detail: str = ""
    reference_label: str | None = None


@dataclass(frozen=True)
class Grid:
    """Rows x columns of :class:`GridCell`, with what the reference is."""

    mode: GridMode
    reference: str
    row_axis: str
    col_axis: str
    rows: tuple[str, ...]
    cols: tuple[tuple[str, ...], ...]
    cells: tuple[tuple[GridCell, ...], ...]

    @property
    def limit(self) -> float:
        """Half-range of the colour scale: the largest |difference|, rounded up."""
        diffs = [abs(c.difference) for r in self.cells for c in r if c.difference is not None]
        return nice_limit(max(diffs, default=0.0))


@dataclass(frozen=True)
class TrendPoint:
    """One sweep's AL for a cell key, with its interval when known."""

    sweep_id: int
    value: float
    low: float | None = None
    high: float | None = None


def nice_limit(x: float) -> float:
    """The smallest of 0.1, 0.2, 0.25, 0.5 x 10^k that is >= ``x`` (at least 0.1)."""
    x = max(x, 0.1)
    exp = math.floor(math.log10(x))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        value = float(step * 10.0**exp)
        if value >= x - 1e-12:
            return value
    return float(10.0 ** (exp + 1))  # pragma: no cover


def _graph_rank(mode: str) -> tuple[int, str]:
    return (GRAPH_ORDER.index(mode) if mode in GRAPH_ORDER else len(GRAPH_ORDER), mode)


# Which axes lay out the grid: server axes down (graph mode first, the reference axis
# of mode "graph"), request axes and the engine/model lists across.
_ROW_AXES = tuple(a.name for a in SERVER_AXES if a.source == "axes")
_COL_AXES = (
    *(a.name for a in REQUEST_AXES),
    *(a.name for a in SERVER_AXES if a.source != "axes"),
)


@dataclass(frozen=True)
class _Slot:
    """A planned variant: its axis values (planned graph mode) and what it measured."""

    axes: dict[str, AxisValue]
    label: str
    al: float | None
    failed: bool
    error: str

    @property
    def row(self) -> tuple[AxisValue, ...]:
        return tuple(self.axes[k] for k in _ROW_AXES)

    @property
    def col(self) -> tuple[AxisValue, ...]:
        return tuple(self.axes[k] for k in _COL_AXES)

    def moved(self, **values: AxisValue) -> tuple[tuple[AxisValue, ...], tuple[AxisValue, ...]]:
        """(row, col) of the slot with ``values`` in place of its own."""
        axes = {**self.axes, **values}
        return tuple(axes[k] for k in _ROW_AXES), tuple(axes[k] for k in _COL_AXES)


def _slots(sweep: SweepRecord, summaries: Sequence[VariantSummary]) -> list[_Slot]:
    by_label = {s.label: s for s in summaries if s.label}
    out = []
    for stored in sweep.cells:
        c = stored.cell
        failed = stored.result is not None and stored.result.status != "ok"
        for v in c.variants:
            label = c.variant_label(v.axes)
            s = by_label.get(label)
            out.append(
                _Slot(
                    axes=c.variant_key(v.axes).axis_values(),
                    label=label,
                    al=None if failed or s is None else s.mean_acceptance_length,
                    failed=failed,
                    error=_error(stored.result),
                )
            )
    return out


def _row_order(row: tuple[AxisValue, ...]) -> tuple[object, ...]:
    return (_graph_rank(str(row[_ROW_AXES.index("graph_mode")])), *row)


def _labels(names: Sequence[str]) -> str:
    return ", ".join(axis(k).label for k in names)


def al_grid(
    sweep: SweepRecord,
    summaries: Sequence[VariantSummary],
    report: CheckReport | None = None,
    *,
    mode: GridMode = "graph",
    base_engine: str | None = None,
) -> Grid:
    """The AL-difference grid of ``sweep`` (spec-on variants only: MTP 0 has no AL).

    ``base_engine`` (``mode="engine"``) defaults to the sweep's first engine. Failed
    cells are placed in every column of their planned variants; combinations the
    sweep did not plan are ``missing``.
    """
    slots = _slots(sweep, summaries)
    first_seen = {k: list(dict.fromkeys(s.axes[k] for s in slots)) for k in _COL_AXES}
    base = base_engine or str(next(iter(first_seen["engine"]), ""))
    spec_on = [s for s in slots if speculates(int(s.axes["mtp_depth"]))]
    rows = sorted({s.row for s in spec_on}, key=_row_order)
    cols = sorted(
        {s.col for s in spec_on},
        key=lambda c: tuple(first_seen[k].index(v) for k, v in zip(_COL_AXES, c, strict=True)),
    )
    at = {(s.row, s.col): s for s in spec_on}

    def reference_of(s: _Slot) -> _Slot | None:
        return at.get(s.moved(graph_mode="eager") if mode == "graph" else s.moved(engine=base))

    verdicts = _al_verdicts(report)
    findings = _flagged(report)
    cells = tuple(
        tuple(
            _grid_cell(at.get((r, c)), reference_of, mode, base, verdicts, findings) for c in cols
        )
        for r in rows
    )
    # Labels read engine (model when several), then the request axes.
    col_names = [
        k
        for k in (*_COL_AXES[len(REQUEST_AXES) :], *_COL_AXES[: len(REQUEST_AXES)])
        if k != "model" or len(first_seen[k]) > 1
    ]
    col_labels = tuple(
        tuple(
            axis(k).text(v)
            for k in col_names
            for v in (explicit(dict(zip(_COL_AXES, c, strict=True))).get(k),)
            if v is not None
        )
        for c in cols
    )
    held = [k for k in (*_ROW_AXES, *_COL_AXES) if k not in ("graph_mode", "engine", "model")]
    reference = (
        f"eager at the same {_labels(held)} and engine"
        if mode == "graph"
        else f"engine {base} at the same {_labels(['graph_mode', *held])}"
    )
    return Grid(
        mode=mode,
        reference=reference,
        row_axis=" · ".join(axis(k).label for k in _shown_row_axes(rows)),
        col_axis=" · ".join(axis(k).label for k in col_names),
        rows=tuple(axes_text(dict(zip(_ROW_AXES, r, strict=True)), " · ") for r in rows),
        cols=col_labels,
        cells=cells,
    )


def _shown_row_axes(rows: Sequence[tuple[AxisValue, ...]]) -> tuple[str, ...]:
    """The row axes a reader needs named: an axis added later whose every row holds its
    implicit value (the job does not vary it) is left out, as the rows' labels leave
    its value out."""
    return tuple(
        k
        for i, k in enumerate(_ROW_AXES)
        if axis(k).implicit is None or any(r[i] != axis(k).implicit for r in rows)
    )


def _grid_cell(
    slot: _Slot | None,
    reference_of: Callable[[_Slot], _Slot | None],
    mode: GridMode,
    base: str,
    verdicts: dict[tuple[str, str], Verdict],
    findings: dict[str, list[str]],
) -> GridCell:
    if slot is None:
        return GridCell(kind="missing", detail="not planned in this sweep")
    if slot.failed:
        return GridCell(kind="failed", label=slot.label, detail=f"{slot.label}: {slot.error}")
    if slot.al is None:
        return GridCell(kind="missing", label=slot.label, detail=f"{slot.label}: no AL measured")
    flagged = slot.label in findings
    notes = [slot.label, f"AL {slot.al:.3f}", *findings.get(slot.label, [])]
    is_ref = slot.axes["graph_mode"] == "eager" if mode == "graph" else slot.axes["engine"] == base
    if is_ref:
        return GridCell(
            kind="reference",
            label=slot.label,
            al=slot.al,
            flagged=flagged,
            detail="\n".join([*notes, "the reference of this comparison"]),
        )
    ref = reference_of(slot)
    if ref is None or ref.al is None:
        return GridCell(
            kind="no_reference",
            label=slot.label,
            al=slot.al,
            flagged=flagged,
            reference_label=ref.label if ref is not None else None,
            detail="\n".join([*notes, "no reference result (failed or not planned)"]),
        )
    diff = slot.al - ref.al
    v = verdicts.get((slot.label, ref.label))
    interval = (v.difference.low, v.difference.high) if v is not None else None
    ci = f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else ""
    notes.insert(2, f"reference {ref.label}: AL {ref.al:.3f}; difference {diff:+.3f}{ci}")
    return GridCell(
        kind="value",
        label=slot.label,
        al=slot.al,
        reference_al=ref.al,
        difference=diff,
        interval=interval,
        flagged=flagged,
        detail="\n".join(notes),
        reference_label=ref.label,
    )


def _error(result: CellResult | None) -> str:
    if result is None:
        return "not run"
    if not result.error:
        return result.status
    return f"{result.status}: {result.error.splitlines()[0][:160]}"


def _al_verdicts(report: CheckReport | None) -> dict[tuple[str, str], Verdict]:
    """AL verdicts by (candidate label, reference label)."""
    return {
        (v.candidate.label, v.reference.label): v
        for v in (report.verdicts if report else ())
        if v.metric == "mean_acceptance_length"
    }


def _flagged(report: CheckReport | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in report.regressions if report else ():
        out.setdefault(f.candidate.label, []).append(f"FINDING {f.describe()}")
    return out


# --- SVG -------------------------------------------------------------------------------


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    r, g, bl = (round(x + (y - x) * t) for x, y in zip(a, b, strict=True))
    return f"#{r:02x}{g:02x}{bl:02x}"


def color_for(difference: float, limit: float) -> str:
    """Fill colour of a difference on a diverging scale clipped at +-``limit``."""
    t = max(-1.0, min(1.0, difference / limit)) if limit > 0 else 0.0
    return _mix(_MID, _LOW, -t) if t < 0 else _mix(_MID, _HIGH, t)


# Text styles as presentation attributes, so an SVG copied out of the page looks the same.
_TEXT_STYLE = {
    "": {"font-size": "12"},
    "axis": {"font-size": "12", "font-weight": "600", "fill": "#333333"},
    "colhead": {"font-size": "12", "font-weight": "600"},
    "colsub": {"font-size": "11"},
    "rowhead": {"font-size": "12"},
    "tick": {"font-size": "11"},
    "v": {"font-size": "13", "font-weight": "600"},
    "s": {"font-size": "10"},
    "small": {"font-size": "11", "font-weight": "600"},
    "mark": {"font-size": "11", "font-weight": "700"},
}


def _text(
    x: float, y: float, text: str, cls: str = "", anchor: str = "middle", **attrs: str
) -> str:
    style = {"fill": "#1a1a1a", **_TEXT_STYLE.get(cls, {}), **attrs}
    extra = "".join(f' {k}="{html_text(v)}"' for k, v in style.items())
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}{extra}>'
        f"{html_text(text)}</text>"
    )


def _two_lines(text: str, width: float) -> list[str]:
    """``text`` on one line, or split before its ``[`` (a variant label) onto two."""
    if len(text) * _CHAR_W <= width or "[" not in text:
        return [_fit(text, width)]
    head, _, tail = text.partition("[")
    return [_fit(head, width), _fit("[" + tail, width)]


def _fit(text: str, width: float, char_w: float = _CHAR_W) -> str:
    chars = max(3, int(width / char_w))
    return text if len(text) <= chars else text[: chars - 1] + "…"


def heatmap_svg(grid: Grid, title: str = "", uid: str = "hm") -> str:
    """The grid as an SVG heatmap with axis labels, cell labels and a legend.

    Every grid position gets one ``<rect class="cell">``; failed cells are hatched
    and labelled, findings get a thick black border and a corner mark. Hovering a
    cell shows its full label, figures and findings (``<title>``).
    """
    cw, ch = 112.0, 44.0
    n_rows, n_cols = len(grid.rows), len(grid.cols)
    header_lines = max((len(c) for c in grid.cols), default=1)
    # Wide enough for the row names and for the rows' axis label above them, which
    # would otherwise run under the first column's header.
    left = 24 + max(max((len(r) for r in grid.rows), default=10), len(grid.row_axis) + 6) * _CHAR_W
    top = 30 + 15 * header_lines
    width = max(left + cw * n_cols, left + _LEGEND_W) + 16
    grid_bottom = top + ch * n_rows
    height = grid_bottom + 76  # the legend's two rows below the grid
    limit = grid.limit
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" role="img" '
        f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'style="{_FONT}">',
        f"<title>{html_text(title or 'AL difference vs reference')}</title>",
        "<defs>",
        f'<pattern id="{uid}-hatch" width="8" height="8" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="8" height="8" fill="#fff3f7"/>'
        '<line x1="0" y1="0" x2="0" y2="8" stroke="#f1a7c8" stroke-width="2.5"/></pattern>',
        f'<linearGradient id="{uid}-scale" x1="0" x2="1" y1="0" y2="0">'
        f'<stop offset="0" stop-color="{color_for(-1, 1)}"/>'
        f'<stop offset="0.5" stop-color="{color_for(0, 1)}"/>'
        f'<stop offset="1" stop-color="{color_for(1, 1)}"/></linearGradient>',
        "</defs>",
        _text(left, 16, f"columns: {grid.col_axis}", "axis", "start"),
        _text(8, top - 8, f"rows: {grid.row_axis}", "axis", "start"),
    ]
    for j, col in enumerate(grid.cols):
        x = left + cw * j + cw / 2
        for k, line in enumerate(col):
            hy = 30.0 + 15 * (k + 1) - 4
            parts.append(_text(x, hy, _fit(line, cw - 6), "colhead" if k == 0 else "colsub"))
    for i, row in enumerate(grid.rows):
        y = top + ch * i + ch / 2 + 4
        parts.append(_text(left - 8, y, row, "rowhead", "end"))
        for j, cell in enumerate(grid.cells[i]):
            parts.append(_cell_svg(cell, left + cw * j, top + ch * i, cw, ch, limit, uid))
    parts.append(_legend(left, grid_bottom + 22, limit, uid))
    parts.append("</svg>")
    return "".join(parts)


def _cell_svg(
    cell: GridCell, x: float, y: float, w: float, h: float, limit: float, uid: str
) -> str:
    stroke, sw, dash = "#ffffff", 1.5, ""
    main, sub = "", ""
    if cell.kind == "value" and cell.difference is not None:
        fill = color_for(cell.difference, limit)
        main = f"{cell.difference:+.2f}"
        sub = f"{cell.al:.2f} vs {cell.reference_al:.2f}"
    elif cell.kind == "reference":
        fill, stroke, dash = "#ffffff", "#888888", ' stroke-dasharray="4 3"'
        main, sub = "ref", f"AL {cell.al:.2f}" if cell.al is not None else ""
    elif cell.kind == "failed":
        fill, main, sub = f"url(#{uid}-hatch)", "FAILED", "no result"
    elif cell.kind == "no_reference":
        fill = "#f0f0f0"
        main, sub = (f"{cell.al:.2f}" if cell.al is not None else "n/a"), "no reference"
    else:
        fill, main = "#e6e6e6", "not run"
    if cell.flagged:
        stroke, sw, dash = "#000000", 3.0, ""
    dark = (
        cell.kind == "value" and cell.difference is not None and abs(cell.difference) / limit > 0.55
    )
    fg = "#ffffff" if dark else "#1a1a1a"
    out = [
        f'<g class="gridcell {cell.kind}{" flagged" if cell.flagged else ""}">',
        f'<rect class="cell" x="{x + 1:.1f}" y="{y + 1:.1f}" width="{w - 2:.1f}" '
        f'height="{h - 2:.1f}" fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{dash}>'
        f"<title>{html_text(cell.detail)}</title></rect>",
        _text(x + w / 2, y + h / 2 + (0 if sub else 4), main, "v", fill=fg),
    ]
    if sub:
        out.append(_text(x + w / 2, y + h / 2 + 14, sub, "s", fill=fg))
    if cell.flagged:
        out.append(
            f'<path d="M{x + w - 15:.1f},{y + 1:.1f} h14 v14 z" fill="#000000"/>'
            + _text(x + w - 5, y + 11, "!", "mark", fill="#ffffff")
        )
    out.append("</g>")
    return "".join(out)


def _legend(x: float, y: float, limit: float, uid: str) -> str:
    bar_w = 220.0
    parts = [
        '<g class="legend">',
        _text(x, y - 6, "AL difference vs reference (candidate - reference)", "axis", "start"),
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.0f}" height="12" fill="url(#{uid}-scale)" '
        'stroke="#999999" stroke-width="0.5"/>',
    ]
    for frac, value in ((0.0, -limit), (0.5, 0.0), (1.0, limit)):
        tx = x + bar_w * frac
        parts.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{y + 12:.1f}" y2="{y + 16:.1f}" '
            'stroke="#555555"/>'
        )
        parts.append(_text(tx, y + 28, f"{value:+.2f}" if value else "0", "tick"))
    parts.append(_text(x, y + 42, "lower AL", "tick", "start"))
    parts.append(_text(x + bar_w, y + 42, "higher AL", "tick", "end"))
    sx = x + bar_w + 30
    swatches = (
        ("#ffffff", "#888888", "reference", ' stroke-dasharray="4 3"', 1.0),
        (f"url(#{uid}-hatch)", "#ffffff", "failed", "", 1.0),
        ("#e6e6e6", "#ffffff", "not run", "", 1.0),
        ("#f7f7f7", "#000000", "finding (checks)", "", 3.0),
    )
    for k, (fill, stroke, name, dash, sw) in enumerate(swatches):
        cx = sx + (k % 2) * 130
        cy = y + (k // 2) * 22
        parts.append(
            f'<rect x="{cx:.1f}" y="{cy - 2:.1f}" width="18" height="14" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{sw}"{dash}/>'
        )
        parts.append(_text(cx + 24, cy + 9, name, "tick", "start"))
    parts.append("</g>")
    return "".join(parts)


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
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" style="{_FONT}">',
        f"<title>{html_text(title)}</title>",
        _text(4, 13, _fit(title, w - 8, _SMALL_W), "small", "start"),
    ]
    for frac in (0.0, 0.5, 1.0):
        gy = top + ph * (1 - frac)
        parts.append(
            f'<line x1="{left:.1f}" x2="{left + pw:.1f}" y1="{gy:.1f}" y2="{gy:.1f}" '
            'stroke="#dddddd"/>'
        )
        parts.append(_text(left - 4, gy + 4, f"{frac:g}", "tick", "end"))
    if failed is not None or not values:
        parts.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{pw:.1f}" height="{ph:.1f}" '
            'fill="#fff3f7" stroke="#c51b7d" stroke-dasharray="5 3"/>'
        )
        parts.append(_text(left + pw / 2, top + ph / 2 + 4, failed or "no data", "v"))
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
                    _text(bx + bw / 2, top + ph - bh + 13, f"{v:.2f}", "tick", fill="#ffffff")
                )
            else:
                parts.append(_text(bx + bw / 2, top + ph - bh - 3, f"{v:.2f}", "tick"))
            if i < len(reference):
                ry = top + ph * (1 - max(0.0, min(1.0, reference[i])))
                parts.append(
                    f'<line class="ref" x1="{bx - 3:.1f}" x2="{bx + bw + 3:.1f}" '
                    f'y1="{ry:.1f}" y2="{ry:.1f}" stroke="#000000" stroke-width="2"/>'
                )
            parts.append(_text(bx + bw / 2, h - bottom + 13, str(i), "tick"))
    parts.append(_text(left + pw / 2, h - 2, "draft position", "tick"))
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
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" style="{_FONT}">',
        f"<title>{html_text(title)}</title>",
    ]
    for k, line in enumerate(_two_lines(title, w - 8)):
        parts.append(_text(4, 13 + 14 * k, line, "small", "start"))
    if not points:
        parts.append(_text(w / 2, h / 2, "no history", "v"))
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
        parts.append(_text(left - 4, sy(v) + 4, f"{v:.2f}", "tick", "end"))
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
            parts.append(_text(sx(i), h - bottom + 14, str(p.sweep_id), "tick"))
    parts.append(_text(left + pw / 2, h - 3, "sweep", "tick"))
    ym = top + ph / 2
    parts.append(_text(12, ym, "AL", "tick", transform=f"rotate(-90 12 {ym:.1f})"))
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
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" style="{_FONT}">',
        f"<title>{html_text(title)}</title>",
    ]
    for k, line in enumerate(_two_lines(title, w - 8)):
        parts.append(_text(4, 13 + 14 * k, line, "small", "start"))
    shown = [b for b in bins if b.al is not None and math.isfinite(b.al)]
    if not shown:
        parts.append(_text(w / 2, h / 2, "no acceptance counted", "v"))
        parts.append("</svg>")
        return "".join(parts)
    total = max(b.end for b in bins)
    values = [b.al for b in shown if b.al is not None]
    levels = [v for v in (before_al, after_al) if v is not None]
    hi = max([*values, *levels]) * 1.05
    lo = 1.0

    def sx(x: float) -> float:
        return left + pw * x / total if total else left + pw / 2

    def sy(v: float) -> float:
        return top + ph * (1 - (v - lo) / (hi - lo)) if hi > lo else top + ph / 2

    step = nice_limit((hi - lo) / 4) if hi > lo else 1.0
    tick = lo
    while tick <= hi + 1e-9:
        parts.append(
            f'<line x1="{left:.1f}" x2="{left + pw:.1f}" y1="{sy(tick):.1f}" '
            f'y2="{sy(tick):.1f}" stroke="#dddddd"/>'
        )
        parts.append(_text(left - 5, sy(tick) + 4, f"{tick:.2f}", "tick", "end"))
        tick += step
    if split_at is not None:
        x = sx(split_at)
        parts.append(
            f'<line class="split" x1="{x:.1f}" x2="{x:.1f}" y1="{top:.1f}" '
            f'y2="{top + ph:.1f}" stroke="#b2182b" stroke-width="1.5"/>'
        )
        said = f"{unit} {split_at + 1}" if unit == "request" else f"round {split_at + 1}"
        anchor = "end" if x > left + pw * 0.7 else "start"
        parts.append(
            _text(
                x + (-4 if anchor == "end" else 4), top + 12, said, "mark", anchor, fill="#b2182b"
            )
        )
        for value, x0, x1, word in (
            (before_al, 0.0, float(split_at), "before"),
            (after_al, float(split_at), float(total), "after"),
        ):
            if value is None:
                continue
            y = sy(value)
            parts.append(
                f'<line class="level" x1="{sx(x0):.1f}" x2="{sx(x1):.1f}" y1="{y:.1f}" '
                f'y2="{y:.1f}" stroke="#333333" stroke-dasharray="6 4"/>'
            )
            parts.append(
                _text(
                    (sx(x0) + sx(x1)) / 2, y - 5, f"AL {value:.2f} {word}", "tick", fill="#333333"
                )
            )
    mid = [((b.start + b.end) / 2, b.al) for b in shown]
    path = " ".join(f"{sx(x):.1f},{sy(v):.1f}" for x, v in mid if v is not None)
    parts.append(f'<polyline points="{path}" fill="none" stroke="#4a7fb5" stroke-width="1.5"/>')
    for b in shown:
        assert b.al is not None
        where = f"requests {b.start + 1}-{b.end}" if unit == "request" else f"round {b.end}"
        parts.append(
            f'<circle cx="{sx((b.start + b.end) / 2):.1f}" cy="{sy(b.al):.1f}" r="2.5" '
            f'fill="#4a7fb5"><title>{html_text(where)}: AL {b.al:.3f}</title></circle>'
        )
    if unit == "request":
        for i in range(7):
            parts.append(_text(sx(total * i / 6), h - bottom + 14, f"{total * i / 6:.0f}", "tick"))
    else:
        every = max(1, math.ceil(len(bins) / 12))
        for i, b in enumerate(bins):
            if i % every == 0 or i == len(bins) - 1:
                parts.append(_text(sx((b.start + b.end) / 2), h - bottom + 14, str(b.end), "tick"))
    axis_name = "requests in the order served" if unit == "request" else "conversation round"
    parts.append(_text(left + pw / 2, h - 4, axis_name, "tick"))
    ym = top + ph / 2
    parts.append(_text(12, ym, "AL", "tick", transform=f"rotate(-90 12 {ym:.1f})"))
    parts.append("</svg>")
    return "".join(parts)


def trend_points(points: Sequence[HistoryPoint]) -> list[TrendPoint]:
    """Chart points of a :func:`farm.analysis.history.series_from_sweeps` series."""
    return [
        TrendPoint(sweep_id=p.sweep_id, value=p.value, low=_finite(p.low), high=_finite(p.high))
        for p in points
    ]


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None

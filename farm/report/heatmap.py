"""The AL-difference grid (:mod:`farm.report.grid`) as an SVG heatmap: a diverging
colour per cell, failed cells hatched, findings outlined, a legend below. Pure: a
self-contained ``<svg>`` string (no scripts, fonts or external files).
"""

from __future__ import annotations

from farm.inert import html_text
from farm.report.grid import Grid, GridCell
from farm.report.svg import CHAR_W, FONT, fit, svg_text

__all__ = ["color_for", "heatmap_svg"]


# ColorBrewer RdBu ends and midpoint: red = lower AL than the reference, blue = higher.
_LOW, _MID, _HIGH = (178, 24, 43), (247, 247, 247), (33, 102, 172)


_LEGEND_W = 520.0


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    r, g, bl = (round(x + (y - x) * t) for x, y in zip(a, b, strict=True))
    return f"#{r:02x}{g:02x}{bl:02x}"


def color_for(difference: float, limit: float) -> str:
    """Fill colour of a difference on a diverging scale clipped at +-``limit``."""
    t = max(-1.0, min(1.0, difference / limit)) if limit > 0 else 0.0
    return _mix(_MID, _LOW, -t) if t < 0 else _mix(_MID, _HIGH, t)


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
    left = 24 + max(max((len(r) for r in grid.rows), default=10), len(grid.row_axis) + 6) * CHAR_W
    top = 30 + 15 * header_lines
    width = max(left + cw * n_cols, left + _LEGEND_W) + 16
    grid_bottom = top + ch * n_rows
    height = grid_bottom + 76  # the legend's two rows below the grid
    limit = grid.limit
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" role="img" '
        f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'style="{FONT}">',
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
        svg_text(left, 16, f"columns: {grid.col_axis}", "axis", "start"),
        svg_text(8, top - 8, f"rows: {grid.row_axis}", "axis", "start"),
    ]
    for j, col in enumerate(grid.cols):
        x = left + cw * j + cw / 2
        for k, line in enumerate(col):
            hy = 30.0 + 15 * (k + 1) - 4
            parts.append(svg_text(x, hy, fit(line, cw - 6), "colhead" if k == 0 else "colsub"))
    for i, row in enumerate(grid.rows):
        y = top + ch * i + ch / 2 + 4
        parts.append(svg_text(left - 8, y, row, "rowhead", "end"))
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
        svg_text(x + w / 2, y + h / 2 + (0 if sub else 4), main, "v", fill=fg),
    ]
    if sub:
        out.append(svg_text(x + w / 2, y + h / 2 + 14, sub, "s", fill=fg))
    if cell.flagged:
        out.append(
            f'<path d="M{x + w - 15:.1f},{y + 1:.1f} h14 v14 z" fill="#000000"/>'
            + svg_text(x + w - 5, y + 11, "!", "mark", fill="#ffffff")
        )
    out.append("</g>")
    return "".join(out)


def _legend(x: float, y: float, limit: float, uid: str) -> str:
    bar_w = 220.0
    parts = [
        '<g class="legend">',
        svg_text(x, y - 6, "AL difference vs reference (candidate - reference)", "axis", "start"),
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.0f}" height="12" fill="url(#{uid}-scale)" '
        'stroke="#999999" stroke-width="0.5"/>',
    ]
    for frac, value in ((0.0, -limit), (0.5, 0.0), (1.0, limit)):
        tx = x + bar_w * frac
        parts.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{y + 12:.1f}" y2="{y + 16:.1f}" '
            'stroke="#555555"/>'
        )
        parts.append(svg_text(tx, y + 28, f"{value:+.2f}" if value else "0", "tick"))
    parts.append(svg_text(x, y + 42, "lower AL", "tick", "start"))
    parts.append(svg_text(x + bar_w, y + 42, "higher AL", "tick", "end"))
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
        parts.append(svg_text(cx + 24, cy + 9, name, "tick", "start"))
    parts.append("</g>")
    return "".join(parts)

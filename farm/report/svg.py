"""What every SVG chart of the reports is drawn with: the font, label text laid out
and escaped (``svg_text``, ``fit``, ``two_lines``) and a round scale limit
(``nice_limit``). Pure.
"""

from __future__ import annotations

import math

from farm.inert import html_text

__all__ = ["CHAR_W", "FONT", "fit", "nice_limit", "svg_text", "two_lines"]


FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


CHAR_W = 7.0  # average glyph width at 12px, for laying out labels


def nice_limit(x: float) -> float:
    """The smallest of 0.1, 0.2, 0.25, 0.5 x 10^k that is >= ``x`` (at least 0.1)."""
    x = max(x, 0.1)
    exp = math.floor(math.log10(x))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        value = float(step * 10.0**exp)
        if value >= x - 1e-12:
            return value
    return float(10.0 ** (exp + 1))  # pragma: no cover


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


def svg_text(
    x: float, y: float, text: str, cls: str = "", anchor: str = "middle", **attrs: str
) -> str:
    """A ``<text>`` at (``x``, ``y``) in the style of class ``cls`` (attributes over it),
    ``text`` escaped."""
    style = {"fill": "#1a1a1a", **_TEXT_STYLE.get(cls, {}), **attrs}
    extra = "".join(f' {k}="{html_text(v)}"' for k, v in style.items())
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}{extra}>'
        f"{html_text(text)}</text>"
    )


def two_lines(text: str, width: float) -> list[str]:
    """``text`` on one line, or split before its ``[`` (a variant label) onto two."""
    if len(text) * CHAR_W <= width or "[" not in text:
        return [fit(text, width)]
    head, _, tail = text.partition("[")
    return [fit(head, width), fit("[" + tail, width)]


def fit(text: str, width: float, char_w: float = CHAR_W) -> str:
    """``text`` cut to ``width`` px of glyphs ``char_w`` wide, an ellipsis marking the cut."""
    chars = max(3, int(width / char_w))
    return text if len(text) <= chars else text[: chars - 1] + "…"

"""The stylesheet every HTML page of the farm inlines (sweep reports, the verdict index,
bisections): one file each, nothing fetched from outside."""

from __future__ import annotations

__all__ = ["CSS"]

CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 24px auto;
  max-width: 1400px; padding: 0 16px; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #ddd;
  padding-bottom: 4px; } h3 { margin-bottom: 4px; }
.meta { color: #555; } .muted { color: #777; font-size: 0.9em; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 16px 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 110px;
  max-width: 150px; }
.card b { display: block; font-size: 1.5em; } .card.bad { border-color: #b2182b; color: #b2182b; }
.card.good { border-color: #1b7837; color: #1b7837; }
table { border-collapse: collapse; font-size: 0.85em; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.regressed td { background: #fde0dd; } tr.failed td { background: #fff1e6; }
.ok { color: #1b7837; font-weight: 600; } .bad { color: #b2182b; font-weight: 600; }
.rule { background: #f7f7f7; border-left: 4px solid #b2182b; padding: 6px 10px; }
.scroll { overflow-x: auto; } .nowrap { white-space: nowrap; }
.charts { display: flex; flex-wrap: wrap; gap: 6px; }
.chartrow h4 { margin: 12px 0 4px; font-size: 0.95em; }
details summary { cursor: pointer; margin: 8px 0; }
"""

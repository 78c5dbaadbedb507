"""Markdown and HTML reports of synthetic sweeps with a seeded regression."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import cache
from html.parser import HTMLParser

from farm.analysis.alert_rules import alert_candidates
from farm.analysis.check_rules import CheckReport
from farm.analysis.checks import check_sweep
from farm.analysis.compare import compare_sweeps
from farm.analysis.history import (
    HistoryPoint,
    analyze_histories,
    series_from_sweeps,
)
from farm.analysis.judgement import JudgeRules, judge
from farm.analysis.summary import summarize_sweep
from farm.comparable import ComparableKey
from farm.records import SweepRecord
from farm.report.grid import al_grid
from farm.report.heatmap import color_for
from farm.report.html import render_html
from farm.report.markdown import render_comparison, render_markdown
from farm.report.svg import nice_limit
from tests.support.sweeps import FAST, fail_cell, seeded_sweep

FDO_MTP3 = "base.synthetic.full_decode_only.mtp3.swa-on"


@cache
def _case() -> tuple[SweepRecord, CheckReport]:
    sweep = fail_cell(
        seeded_sweep(3),
        "base.synthetic.full_decode_only.mtp1.swa-off",
        "engine server exited with code 1 <before> ready",
    )
    return sweep, check_sweep(sweep, config=FAST)


class StrictHTML(HTMLParser):
    """Fails on any end tag that does not close the innermost open element."""

    VOID = frozenset({"meta", "br", "hr", "img", "input", "link", "col", "wbr", "source"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]} at {self.getpos()}")
        else:
            self.stack.pop()

    def having(self, tag: str, cls: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements if t == tag and cls in (a.get("class") or "").split()]


def _parse(page: str) -> StrictHTML:
    parser = StrictHTML()
    parser.feed(page)
    parser.close()
    assert parser.errors == [], parser.errors[:5]
    assert parser.stack == [], f"unclosed: {parser.stack}"
    return parser


# --- markdown ----------------------------------------------------------------------------


def test_markdown_has_the_verdict_table_grid_and_notes() -> None:
    sweep, report = _case()
    text = render_markdown(sweep, summarize_sweep(sweep), report)
    assert text.startswith("## mtp-farm sweep 1: synthetic (ok)")
    assert "| verdict | check | metric | candidate | reference |" in text
    finding_rows = [
        line for line in text.splitlines() if line.startswith("| regressed | graph_vs_eager | AL |")
    ]
    assert any(f"{FDO_MTP3}[think-off.synthetic]" in r for r in finding_rows), finding_rows
    # every figure comes with its interval
    assert re.search(r"\| -0\.\d{3} \[-0\.\d{3}, -0\.\d{3}\] \|", finding_rows[0])
    # depths 1 and 3 were swept, so ">= 2" shows as "= 3"
    assert "Explained by `graph_mode=full_decode_only AND mtp_depth=3 AND sliding_window=on`" in (
        text
    )
    assert "### AL change vs reference" in text
    grid_row = next(
        line
        for line in text.splitlines()
        if line.startswith("| full_decode_only · mtp3 · swa-on |")
    )
    assert grid_row.count("**!**") == 2  # both thinking modes flagged
    assert "| full_decode_only · mtp1 · swa-off | FAILED | FAILED |" in text
    assert "<details><summary>All" in text and "### Matrix" in text
    assert "failed: engine server exited with code 1 <before> ready" in text


def test_markdown_without_findings_says_so() -> None:
    sweep = seeded_sweep(4, regressed=False)
    report = check_sweep(sweep, config=FAST)
    text = render_markdown(sweep, summarize_sweep(sweep), report)
    assert report.regressions == ()
    assert f"No regression found in {len(report.verdicts)} comparisons." in text
    grid = text[text.index("### AL change vs reference") : text.index("<details>")]
    assert "FAILED" not in grid and "**!**" not in grid.split("marks a finding.")[1]


# --- HTML --------------------------------------------------------------------------------


def test_html_is_well_formed_and_self_contained() -> None:
    sweep, report = _case()
    page = render_html(sweep, summarize_sweep(sweep), report)
    assert page.startswith("<!DOCTYPE html>")
    parsed = _parse(page)
    tags = {t for t, _ in parsed.elements}
    assert {"html", "head", "style", "body", "svg", "table"} <= tags
    assert not tags & {"script", "link", "img", "iframe"}
    assert all("src" not in a and "href" not in a for _, a in parsed.elements)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    # text from the store is escaped, never markup
    assert "&lt;before&gt;" in page and "<before>" not in page


def test_html_heatmap_has_one_rect_per_matrix_cell_and_a_legend() -> None:
    sweep, report = _case()
    summaries = summarize_sweep(sweep)
    grid = al_grid(sweep, summaries, report)
    # rows: {eager, fdo} x {mtp1, mtp3} x {swa on, off}; columns: thinking {off, on}
    assert len(grid.rows) == 8 and len(grid.cols) == 2
    page = render_html(sweep, summaries, report)
    parsed = _parse(page)
    [heatmap] = parsed.having("svg", "heatmap")
    assert heatmap["viewbox"] is not None
    assert len(parsed.having("rect", "cell")) == 8 * 2
    assert len(parsed.having("g", "legend")) == 1
    legend = page[page.index('<g class="legend">') :]
    legend = legend[: legend.index("</g>")]
    for word in ("AL difference vs reference", "lower AL", "higher AL", "reference", "failed"):
        assert word in legend
    assert "rows: graph mode · MTP depth · sliding window" in page
    assert "columns: engine · thinking · workload" in page
    # the failed cell is marked in both thinking columns; the regression is flagged
    assert len(parsed.having("g", "failed")) == 2
    flagged = parsed.having("g", "flagged")
    assert len(flagged) == 2  # full_decode_only x mtp3 x swa-on, both thinking modes
    fdo = next(
        row
        for label, row in zip(grid.rows, grid.cells, strict=True)
        if label == "full_decode_only · mtp3 · swa-on"
    )
    assert all(c.flagged and c.difference is not None and c.difference < -0.2 for c in fdo)
    assert all(c.interval is not None and c.interval[1] < 0 for c in fdo)
    eager = grid.cells[0]
    assert all(c.kind == "reference" for c in eager)


def test_html_per_position_bars_and_failed_charts() -> None:
    sweep, report = _case()
    page = render_html(sweep, summarize_sweep(sweep), report)
    parsed = _parse(page)
    bars = parsed.having("svg", "bars")
    assert len(bars) == 16  # one per grid position that was planned
    assert len(parsed.having("rect", "bar")) == 2 * 2 * (1 * 2 + 3 * 2) - 2 * 1
    assert page.count(">FAILED</text>") == 2 + 2  # heatmap and bar charts
    assert len(parsed.having("line", "ref")) > 0  # reference ticks on non-reference cells


def test_html_trends_with_history() -> None:
    history_sweeps = [seeded_sweep(10 + i, sweep_id=i + 1, regressed=i == 4) for i in range(5)]
    sweep = history_sweeps[-1]
    report = check_sweep(sweep, config=FAST)
    series = series_from_sweeps(history_sweeps, resamples=100)
    page = render_html(sweep, summarize_sweep(sweep), report, series)
    parsed = _parse(page)
    trends = parsed.having("svg", "trend")
    assert len(trends) == len(series) == 2 * 2 * 2 * 2
    assert page.count("<circle") == 5 * len(series)
    # the flagged series come first and their current point is red
    first = page[page.index('class="trend"') :]
    assert FDO_MTP3 in first[: first.index("</svg>")]
    assert 'r="4.5" fill="#b2182b"' in first[: first.index("</svg>")]
    text = render_markdown(sweep, summarize_sweep(sweep), report, series)
    assert "### AL trend per cell" in text and "1..5" in text


def test_several_engines_compare_with_the_base_engine_and_keep_ids_unique() -> None:
    sweep = seeded_sweep(5, engines=("base", "base+fix"), regressed=False)
    report = check_sweep(sweep, {"base+fix": "base"}, config=FAST)
    summaries = summarize_sweep(sweep)
    grid = al_grid(sweep, summaries, report, mode="engine")
    assert len(grid.cols) == 4 and grid.cols[0][0] == "base"
    kinds = {c.kind for row in grid.cells for c in row}
    assert kinds == {"reference", "value"}
    page = render_html(sweep, summaries, report)
    parsed = _parse(page)
    assert len(parsed.having("svg", "heatmap")) == 2  # vs base engine, then graph vs eager
    assert len(parsed.having("rect", "cell")) == 2 * len(grid.rows) * len(grid.cols)
    ids = [a["id"] for _, a in parsed.elements if a.get("id")]
    assert len(ids) == len(set(ids)), ids


def test_colour_scale() -> None:
    assert color_for(0.0, 0.5) == "#f7f7f7"
    assert color_for(-0.5, 0.5) == color_for(-9.0, 0.5) == "#b2182b"
    assert color_for(0.5, 0.5) == "#2166ac"
    assert [nice_limit(x) for x in (0.0, 0.12, 0.2, 0.21, 0.4, 0.7, 3.0)] == [
        0.1,
        0.2,
        0.2,
        0.25,
        0.5,
        1.0,
        5.0,
    ]


# --- alert candidates --------------------------------------------------------------------


def test_alert_candidates_group_findings_and_carry_attribution() -> None:
    sweep, _ = _case()
    candidates = alert_candidates(judge(sweep, rules=JudgeRules(check=FAST)))
    keys = [c.key for c in candidates]
    assert len(keys) == len(set(keys))
    al = [c for c in candidates if c.kind == "graph_vs_eager"]
    assert {c.details.cell.value("mtp_depth") for c in al} == {3}
    assert all(c.details.cell.value("graph_mode") == "full_decode_only" for c in al)
    assert all(
        c.details.attribution is not None
        and c.details.attribution.startswith("graph_mode=full_decode_only AND mtp_depth=3")
        for c in al
    )
    assert all(c.severity == "critical" for c in al)  # a 15% drop in acceptance
    fig = al[0].details.figures[0]
    assert fig.difference.low is not None and fig.difference.high is not None
    assert fig.difference.high < 0 and fig.paired and fig.pairs == 60
    # keys name the cell and the cause, never the sweep or build
    assert al[0].key.startswith("graph_vs_eager:mean_acceptance_length:base(vllm).synthetic.")
    assert "sweep" not in al[0].key
    [failed] = [c for c in candidates if c.kind == "cell_failed"]
    assert "thinking" not in dict(failed.details.cell.axes)
    assert "<before>" in (failed.details.error or "")
    assert failed.key == "cell_failed:-:base(vllm).synthetic.full_decode_only.mtp1.swa-off"
    # the failed cell's alert comes after the within-sweep ones, as before one type
    assert candidates[-1] is failed


# --- two sweeps compared -----------------------------------------------------------------


def test_compare_flags_the_regressed_cells_only() -> None:
    baseline = seeded_sweep(20, sweep_id=1, regressed=False)
    candidate = seeded_sweep(20, sweep_id=2, regressed=True)
    comparison = compare_sweeps(baseline, candidate, config=FAST)
    outcomes = {r.label: r.outcome for r in comparison.rows}
    regressed = {label for label, o in outcomes.items() if o == "regress"}
    assert regressed == {
        f"{FDO_MTP3}[think-off.synthetic]",
        f"{FDO_MTP3}[think-on.synthetic]",
    }
    assert comparison.count("pass") == len(outcomes) - 2
    row = next(r for r in comparison.rows if r.outcome == "regress")
    assert row.paired and row.pairs == 60 and row.difference is not None
    assert row.difference.high < 0 and row.relative is not None and row.relative < -0.05
    text = render_comparison(comparison)
    assert text.startswith("### mtp-farm: sweep 2 (synthetic) vs baseline 1 (synthetic)")
    assert ":x: **AL regressed**: 2 regress, 14 pass." in text
    lines = [line for line in text.splitlines() if line.startswith("| :x: regress |")]
    assert len(lines) == 2 and all(FDO_MTP3 in line for line in lines)
    assert "| outcome | variant | baseline AL | candidate AL | difference (95% CI) |" in text


def test_compare_maps_engine_names_and_reports_unmatched_and_failed() -> None:
    baseline = seeded_sweep(21, sweep_id=1, regressed=False)
    candidate = fail_cell(
        seeded_sweep(21, sweep_id=2, regressed=False, engines=("pr-1234",)),
        "pr-1234.synthetic.eager.mtp1.swa-on",
        "boom",
    )
    unmatched = compare_sweeps(baseline, candidate, config=FAST)
    assert {r.outcome for r in unmatched.rows} == {"unmatched"}
    mapped = compare_sweeps(baseline, candidate, config=FAST, engine_map={"pr-1234": "base"})
    outcomes = [r.outcome for r in mapped.rows]
    assert outcomes.count("failed") == 2 and outcomes.count("regress") == 0
    assert "no AL regression, but some cells failed" in render_comparison(mapped)


def test_history_candidates_only_for_a_recently_confirmed_drop() -> None:
    key = ComparableKey(
        family="vllm",
        engine="nightly",
        model="m",
        graph_mode="full_decode_only",
        mtp_depth=3,
        sliding_window="on",
        thinking="off",
        workload="w",
    )
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    noise = [0.01, -0.012, 0.008, -0.005, 0.011, -0.009, 0.004, -0.007]

    def series(drop_at: int) -> list[HistoryPoint]:
        return [
            HistoryPoint(
                sweep_id=i + 1,
                timestamp=t0 + timedelta(days=i),
                value=(2.6 if i >= drop_at else 3.0) + noise[i],
            )
            for i in range(8)
        ]

    night = seeded_sweep(3, sweep_id=8, regressed=False)
    rules = JudgeRules(check=FAST, within=False)
    [candidate] = alert_candidates(judge(night, history={key: series(6)}, rules=rules))
    assert candidate.kind == "history_change" and candidate.severity == "critical"
    assert candidate.key == f"history_change:mean_acceptance_length:{key}"
    assert "from sweep 7" in candidate.summary
    stale = analyze_histories({key: series(3)})
    assert [c.index for c in stale[0].alerts] == [3]  # found, but confirmed long ago
    assert alert_candidates(judge(night, history={key: series(3)}, rules=rules)) == []


def test_reports_say_what_the_sweep_cost_when_told() -> None:
    sweep, report = _case()
    cost = "cost: 0.42 device-h (12 cells; start-up 6.1 min, generation 19.0 min) <x>"
    text = render_markdown(sweep, summarize_sweep(sweep), report, cost=cost)
    assert "\nCost: 0.42 device-h (12 cells; start-up 6.1 min, generation 19.0 min) <x>.\n" in text
    page = render_html(sweep, summarize_sweep(sweep), report, cost=cost)
    assert "cost: 0.42 device-h" in page and "&lt;x&gt;" in page
    assert "device-h" not in render_markdown(sweep, summarize_sweep(sweep), report)

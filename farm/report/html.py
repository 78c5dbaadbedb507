"""A sweep as one self-contained HTML page: inline CSS and SVG, no scripts, no links
to anything outside the file, so it can be mailed, attached to CI or opened offline.
Pure: returns a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from farm import __version__
from farm.analysis.attribution import attribute, labels_from_report
from farm.analysis.check_rules import CheckReport, CheckVerdict
from farm.analysis.over_run import COLLAPSE_CHECK, round_profile, run_profile
from farm.analysis.summary import VariantSummary
from farm.inert import html_text
from farm.records import SweepRecord
from farm.report.categories import CATEGORY_HEADINGS, category_rows
from farm.report.charts import bars_svg, over_run_svg, trend_points, trend_svg
from farm.report.figures import (
    FIGURE_HEADINGS,
    matrix_axes,
    matrix_headings,
    row_axes,
    row_figures,
)
from farm.report.grid import Grid, GridMode, al_grid
from farm.report.heatmap import heatmap_svg
from farm.report.markdown import (
    BISECTION_HEAD,
    History,
    bisection_rows,
    fmt_interval,
    history_labels,
    metric_label,
    reference_label,
    verdict_status,
)
from farm.report.style import CSS
from farm.results.verdict import Finding, SweepVerdict

if TYPE_CHECKING:
    from farm.results.bisection import Bisection

__all__ = ["render_bisection_html", "render_html", "render_verdict_index"]

_MAX_TRENDS = 80
_MAX_VERDICT_ROWS = 1000


def _e(x: object) -> str:
    # The one way this page shows text (farm.inert.html_text): escaped, no control
    # character, no URL credential (a bisection's repository, a cell's error).
    return html_text(x)


def _label(x: object) -> str:
    """A variant label, escaped, that may wrap after the dots of its cell id and before
    its ``[``: a long ``engine.model.graph.mtpN.swa-on[think-off.workload]`` would
    otherwise widen its table past the page."""
    cell, bracket, rest = str(x).partition("[")
    return _e(cell).replace(".", ".<wbr>") + (f"<wbr>[{_e(rest)}" if bracket else "")


def _table(head: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]], num: set[int]) -> str:
    """``rows``: (tr class, already-escaped cells); columns in ``num`` right-aligned."""
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for cls, cells in rows:
        out.append(f'<tr class="{cls}">' if cls else "<tr>")
        out += [
            f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
            for i, c in enumerate(cells)
        ]
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _verdict_table(verdicts: Sequence[CheckVerdict]) -> str:
    head = (
        "verdict",
        "check",
        "metric",
        "candidate",
        "reference",
        "candidate value",
        "reference value",
        "difference (CI)",
        "min effect",
        "pairing",
    )
    rows = []
    for v in verdicts:
        status = verdict_status(v)
        css = "bad" if v.regressed else "ok"
        rows.append(
            (
                "regressed" if v.regressed else "",
                [
                    f'<span class="{css}">{_e(status)}</span>',
                    _e(v.check),
                    _e(metric_label(v)),
                    _label(v.candidate.label),
                    _e(reference_label(v)),
                    _e(fmt_interval(v.candidate_value)),
                    _e(fmt_interval(v.reference_value)),
                    _e(fmt_interval(v.difference, signed=True)),
                    f"{v.min_effect:.3f}",
                    _e(f"paired n={v.pairs}" if v.paired else "unpaired"),
                ],
            )
        )
    return _table(head, rows, {5, 6, 7, 8})


def render_html(
    sweep: SweepRecord,
    summaries: Sequence[VariantSummary],
    check_report: CheckReport,
    history: History | None = None,
    *,
    base_engine: str | None = None,
    verdict: SweepVerdict | None = None,
    cost: str | None = None,
) -> str:
    """The sweep report as a standalone HTML page.

    Sections: summary cards; findings with the attribution rule; a heatmap of the AL
    change across the matrix (reference: eager for a single engine; the first engine,
    or ``base_engine``, when the sweep has several - then a graph-vs-eager heatmap
    follows); per-position acceptance bars per variant; AL trends per cell key when
    ``history`` is given; the matrix table; the confirmation reruns; notes; every
    verdict. With ``verdict``
    (a nightly's or PR run's, :mod:`farm.results.verdict`), its outcome and findings
    come first. ``cost``: what the sweep's servers cost (``SweepCost.describe``).
    """
    ok = sum(1 for s in sweep.cells if s.result is not None and s.result.status == "ok")
    failed = sum(1 for s in sweep.cells if s.result is not None and s.result.status != "ok")
    parts = _head(sweep, cost)
    if verdict is not None:
        parts.append(_verdict_section(verdict))
    parts.append(_cards(len(sweep.cells), ok, failed, len(summaries), check_report))
    parts.append(_findings(check_report))
    grid, heatmaps = _heatmaps(sweep, summaries, check_report, base_engine)
    parts += heatmaps
    parts.append(_positions(grid, summaries, check_report))
    if verdict is not None:
        parts.append(_over_run(sweep, verdict))
    if history:
        parts.append(_trends(sweep, check_report, history))
    parts.append(_matrix(summaries))
    parts.append(_confirmations(sweep))
    parts.append(_categories(summaries))
    parts.append(_notes(sweep, check_report))
    if check_report.verdicts:
        parts.append(_all_verdicts(check_report))
    parts.append(f'<p class="muted">generated by mtp-farm {_e(__version__)}</p></body></html>')
    return "\n".join(parts)


def _head(sweep: SweepRecord, cost: str | None) -> list[str]:
    """The page's head, title, when the sweep ran, its cost and the builds it ran."""
    title = f"mtp-farm sweep {sweep.sweep_id}: {sweep.job}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">status {_e(sweep.status)} · started '
        f"{sweep.started_at:%Y-%m-%d %H:%M} UTC"
        + (f" · finished {sweep.finished_at:%Y-%m-%d %H:%M} UTC" if sweep.finished_at else "")
        + "</p>",
    ]
    if cost:
        parts.append(f'<p class="meta">{_e(cost)}</p>')
    if sweep.builds:
        items = "".join(
            f"<li><code>{_e(b.engine)}</code>: {_e(b.package)}=={_e(b.version)}"
            + (f" + patches {_e(', '.join(b.patches))}" if b.patches else "")
            + f' <span class="muted">({_e(b.build_id)})</span></li>'
            for b in sweep.builds
        )
        parts.append(f"<ul>{items}</ul>")
    return parts


def _heatmaps(
    sweep: SweepRecord,
    summaries: Sequence[VariantSummary],
    report: CheckReport,
    base_engine: str | None,
) -> tuple[Grid, list[str]]:
    """The matrix's AL grid (against eager for one engine, against the base engine for
    several) and its heatmap, then, for several engines, the graph-vs-eager one."""
    engines = list(dict.fromkeys(s.cell.engine for s in sweep.cells))
    mode: GridMode = "engine" if len(engines) > 1 else "graph"
    grid = al_grid(sweep, summaries, report, mode=mode, base_engine=base_engine)
    parts = [_heatmap_section(grid, "AL change across the matrix", "hm-main")]
    if mode == "engine":
        graph_grid = al_grid(sweep, summaries, report, mode="graph")
        if any(c.kind == "value" for row in graph_grid.cells for c in row):
            parts.append(
                _heatmap_section(graph_grid, "AL change: graph modes vs eager", "hm-graph")
            )
    return grid, parts


def _all_verdicts(report: CheckReport) -> str:
    """Every verdict within the sweep, folded (the first ``_MAX_VERDICT_ROWS``)."""
    shown = report.verdicts[:_MAX_VERDICT_ROWS]
    more = len(report.verdicts) - len(shown)
    return (
        "<h2>All verdicts within the sweep</h2><details><summary>"
        f"{_count(len(report.verdicts), 'comparison')} within the sweep "
        f"({_count(len(report.regressions), 'finding')})</summary>{_verdict_table(shown)}"
        + (f"<p>... and {more} more</p>" if more else "")
        + "</details>"
    )


def _cards(cells: int, ok: int, failed: int, variants: int, report: CheckReport) -> str:
    n = len(report.regressions)
    items = [
        ("", "server cells", f"{cells}"),
        ("good" if ok == cells else "", "cells ok", f"{ok}"),
        ("bad" if failed else "", "cells failed", f"{failed}"),
        ("", "variants", f"{variants}"),
        ("", "comparisons within the sweep", f"{len(report.verdicts)}"),
        ("bad" if n else "good", "findings within the sweep", f"{n}"),
        ("", "notes", f"{len(report.notes)}"),
    ]
    body = "".join(
        f'<div class="card {cls}"><b>{_e(value)}</b>{_e(name)}</div>' for cls, name, value in items
    )
    return f'<div class="cards">{body}</div>'


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _findings(report: CheckReport) -> str:
    """The within-sweep checks' findings (each variant against its reference in the same
    sweep); a verdict's comparisons with other sweeps are in its own section."""
    compared = (
        f"{_count(len(report.verdicts), 'comparison')} of a variant with its reference in "
        "this sweep"
    )
    if not report.regressions:
        return (
            f'<h2>Findings</h2><p class="ok">Within the sweep: no regression found in {compared}.'
            "</p>"
        )
    out = [
        "<h2>Findings</h2>",
        f'<p class="bad">Within the sweep: {_count(len(report.regressions), "finding")} in '
        f"{compared}.</p>",
    ]
    rule = attribute(labels_from_report(report))
    if rule is not None and rule.terms:
        terms = " AND ".join(str(t) for t in rule.terms)
        out.append(
            f'<p class="rule">Explained by <b><code>{_e(terms)}</code></b>: covers '
            f"{rule.regressed_covered}/{rule.regressed_total} regressed variants and "
            f"{rule.clean_covered}/{rule.clean_total} clean ones.</p>"
        )
    out.append(_verdict_table([f for f in report.regressions]))
    return "".join(out)


def _heatmap_section(grid: Grid, heading: str, uid: str) -> str:
    if not grid.rows:
        return f"<h2>{_e(heading)}</h2><p>No speculative-decoding variants in this sweep.</p>"
    return (
        f"<h2>{_e(heading)}</h2>"
        f"<p>Each cell: AL of the variant minus AL of its reference ({_e(grid.reference)}); "
        "below, the two ALs. Hover a cell for the full label, interval and findings. "
        "Speculation-off cells (MTP 0) have no AL and are left out.</p>"
        f'<div class="scroll">{heatmap_svg(grid, heading, uid)}</div>'
    )


def _positions(grid: Grid, summaries: Sequence[VariantSummary], report: CheckReport) -> str:
    by_label = {s.label: s for s in summaries if s.label}
    flagged: dict[str, set[int]] = {}
    for f in report.regressions:
        if f.position is not None:
            flagged.setdefault(f.candidate.label, set()).add(f.position)
    out = [
        "<h2>Acceptance per draft position</h2>",
        "<p>Bars: share of verify steps whose draft at that position was accepted; black "
        "ticks: the reference variant; red bars: a depth-invariance finding.</p>",
    ]
    for row_label, row in zip(grid.rows, grid.cells, strict=True):
        charts = []
        for col, cell in zip(grid.cols, row, strict=True):
            if cell.kind == "missing":
                continue
            # A reference says so first: a long title loses its end, not that.
            title = ("ref: " if cell.kind == "reference" else "") + " · ".join(col)
            if cell.kind == "failed":
                charts.append(bars_svg(title, (), failed="FAILED"))
                continue
            s = by_label.get(cell.label)
            ref = by_label.get(cell.reference_label or "")
            charts.append(
                bars_svg(
                    title,
                    s.per_position if s else (),
                    ref.per_position if ref else (),
                    flagged_positions=sorted(flagged.get(cell.label, ())),
                )
            )
        if charts:
            out.append(
                f'<div class="chartrow"><h4>{_e(row_label)}</h4>'
                f'<div class="charts">{"".join(charts)}</div></div>'
            )
    return "".join(out)


def _over_run(sweep: SweepRecord, verdict: SweepVerdict) -> str:
    """AL along the run of each variant with a ``collapse_over_run`` finding: the
    verdict's split and levels over the variant's stored requests."""
    charts = []
    for f in verdict.findings:
        if f.check != COLLAPSE_CHECK or f.key is None or not f.figures:
            continue
        fig = f.figures[0]
        variant = next(
            (
                v
                for stored in sweep.cells
                if stored.cell.cell_id in f.cells and stored.result is not None
                for v in stored.result.variants
                if stored.cell.variant_key(v.axes) == f.key
            ),
            None,
        )
        if variant is None:
            continue
        split: int | None
        if fig.over == "round":
            bins, split = round_profile(variant.requests), (fig.begins_at or 2) - 1
        else:
            bins, split = run_profile(variant.requests), fig.begins_at
        charts.append(
            over_run_svg(
                f.label or f.cells[0],
                bins,
                unit=fig.over or "request",
                split_at=split,
                before_al=fig.reference_value.estimate,
                after_al=fig.candidate_value.estimate,
            )
        )
    if not charts:
        return ""
    return (
        "<h2>Acceptance over the run</h2>"
        "<p>Variants whose acceptance collapsed inside their run: AL along the requests in "
        "the order served (each point a stretch of requests) or by conversation round; red "
        "line: where the later part begins; dashed: the AL before and after.</p>"
        f'<div class="charts">{"".join(charts)}</div>'
    )


def _trends(sweep: SweepRecord, report: CheckReport, history: History) -> str:
    labels = history_labels(sweep)
    bad = {f.candidate.label for f in report.regressions}
    keys = [k for k in history if k in labels and history[k]]
    keys.sort(key=lambda k: (labels[k] not in bad, str(k)))
    charts = [
        trend_svg(
            labels[k],
            trend_points(history[k]),
            current=sweep.sweep_id,
            flagged=labels[k] in bad,
        )
        for k in keys[:_MAX_TRENDS]
    ]
    more = len(keys) - len(charts)
    return (
        "<h2>AL over recent sweeps</h2>"
        "<p>One chart per cell key (engine line, model, axes, thinking, workload); "
        "whiskers: request-level bootstrap interval; large dot: this sweep (red when it "
        "has a finding).</p>"
        f'<div class="charts">{"".join(charts)}</div>'
        + (f"<p>... and {more} more cell keys</p>" if more else "")
    )


def _matrix(rows: Sequence[VariantSummary]) -> str:
    shown = matrix_axes(rows)
    axes = matrix_headings(shown)
    head = (*axes, "status", *FIGURE_HEADINGS)
    right = {len(axes) + 1 + i for i, h in enumerate(FIGURE_HEADINGS) if h != "per position"}
    body = []
    for r in rows:
        status = _e(r.status)
        if r.error:
            status += f": {_e(r.error.splitlines()[0][:120])}"
        if r.failed_requests:
            status += f" ({r.failed_requests} requests failed)"
        if r.decided:
            status += f" ({_e(r.decided)})"
        cells = [*(_e(a) for a in row_axes(r, shown)), status, *row_figures(r)]
        body.append(("failed" if r.status != "ok" else "", cells))
    return "<h2>Matrix</h2>" + _table(head, body, right)


def _confirmations(sweep: SweepRecord) -> str:
    """The night's reruns of its suspicious cells, in the order they ran (what each
    decided is in the verdict's findings and notes)."""
    if not sweep.confirmations:
        return ""
    body = []
    for run in sweep.confirmations:
        result = run.result
        al = ", ".join(
            f"{v.counters.mean_acceptance_length:.3f}"
            for v in result.variants
            if v.counters.mean_acceptance_length is not None
        )
        status = _e(result.status)
        if result.error:
            status += f": {_e(result.error.splitlines()[0][:120])}"
        row = [_e(run.cell_id), _e(run.side), str(run.run), _e(run.build_id), status, al]
        body.append(("failed" if result.status != "ok" else "", row))
    head = ("cell", "side", "run", "build", "status", "AL")
    return (
        "<h2>Confirmation reruns</h2><p>Suspicious cells rerun in their night beside the "
        "last good night's build, interleaved on one node.</p>" + _table(head, body, {2, 5})
    )


def _categories(summaries: Sequence[VariantSummary]) -> str:
    rows = category_rows(summaries)
    if not rows:
        return ""
    body = [("", [_e(x) for x in row]) for row in rows]
    return "<h2>Acceptance by category</h2>" + _table(CATEGORY_HEADINGS, body, {2, 3})


def _notes(sweep: SweepRecord, report: CheckReport) -> str:
    items = [f"<li>{_e(n.check)}: {_e(n.message)}</li>" for n in report.notes]
    items += [f"<li>excluded {_e(e.label)}: {_e(e.reason)}</li>" for e in sweep.excluded]
    if not items:
        return ""
    return f"<h2>Notes</h2><ul>{''.join(items)}</ul>"


_OUTCOME_CLASS = {"clean": "ok", "regression": "bad", "failed_cells": "bad"}


def _finding_row(f: Finding) -> tuple[str, list[str]]:
    positions = "<br>".join(
        f'<span class="nowrap">{p.position}: {p.baseline:.3f} &rarr; {p.candidate:.3f} '
        f"({p.difference:+.3f})" + (" <b>fell</b>" if p.fell else "") + "</span>"
        for p in f.positions
    )
    rel = f"{f.relative:+.1%}" if f.relative is not None else ""
    kind = "regressed" if f.is_regression else "quarantined" if f.quarantined else "failed"
    return (
        kind,
        [
            _e(f.source),
            _e(f.shown_check),
            "<br>".join(_e(c) for c in f.cells),
            _e(rel),
            positions,
            _e(f.summary),
        ],
    )


def _verdict_section(verdict: SweepVerdict) -> str:
    """The run's verdict: outcome, what it was compared with, one row per finding."""
    cls = _OUTCOME_CLASS.get(verdict.outcome, "")
    ids = ", ".join(str(i) for i in verdict.baseline_sweep_ids)
    # The verdict counts every comparison it made; the within-sweep ones alone are
    # counted again below, under Findings: each count says what it counts, so the two
    # never read as one number disagreeing with itself.
    if verdict.kind == "pr":
        against = "compared with the base's cells run in this sweep" + (
            f" and reused from sweep{'s' if len(verdict.baseline_sweep_ids) > 1 else ''} {ids}"
            if ids
            else ""
        )
        kinds = "the candidate's cells against the base's, and against goldens"
    else:
        against = (
            f"compared with sweep {ids} (the last good night)"
            if ids
            else "no earlier good night to compare with"
        )
        kinds = "against the last good night, within the sweep, and against goldens"
    counted = f"{_count(verdict.comparisons, 'comparison')} in this verdict ({kinds})"
    pr = f" · PR #{verdict.pr_number}" if verdict.pr_number is not None else ""
    head = f" @ {verdict.head_sha[:12]}" if verdict.head_sha else ""
    kind = "A/A night" if verdict.kind == "aa" else verdict.kind.capitalize()
    outcome = f"{len(verdict.false_alarms)} false alarm(s)" if verdict.kind == "aa" else ""
    out = [
        f'<h2>{_e(kind)} verdict: <span class="{cls}">{_e(outcome or verdict.outcome)}</span></h2>',
        f'<p class="meta">{_e(against)} · {_e(counted)} · history of '
        f"{_count(verdict.history, 'sweep')}{_e(pr)}{_e(head)}</p>",
    ]
    if verdict.findings:
        head_row = ["source", "check", "cells", "change", "draft positions", "finding"]
        out.append(_table(head_row, [_finding_row(f) for f in verdict.findings], {3}))
    if verdict.reused_cells:
        cells = ", ".join(f"{c.cell_id} (sweep {c.sweep_id})" for c in verdict.reused_cells)
        out.append(f'<p class="muted">baseline cells reused: {_e(cells)}</p>')
    return "".join(out)


def render_verdict_index(job: str, verdicts: Sequence[SweepVerdict]) -> str:
    """The publish folder's index: the job's sweeps (newest first), each with its
    verdict and a link to its report ``sweep-<id>.html`` beside the index."""
    rows = []
    for v in verdicts:
        cls = _OUTCOME_CLASS.get(v.outcome, "")
        when = f"{v.created_at:%Y-%m-%d %H:%M} UTC" if v.created_at else ""
        first = v.findings[0].summary if v.findings else ""
        rows.append(
            (
                "regressed" if v.outcome == "regression" else "",
                [
                    f'<a href="sweep-{v.sweep_id}.html">{v.sweep_id}</a>',
                    _e(when),
                    f'<span class="{cls}">{_e(v.outcome)}</span>',
                    str(len(v.findings)),
                    _e(", ".join(str(i) for i in v.baseline_sweep_ids) or "-"),
                    _e(first),
                ],
            )
        )
    title = f"mtp-farm nightlies: {job}"
    body = (
        _table(["sweep", "judged", "verdict", "findings", "baseline", "first finding"], rows, {3})
        if rows
        else "<p>No judged night yet.</p>"
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            '<p class="meta"><a href="latest.html">latest report</a></p>',
            body,
            f'<p class="muted">generated by mtp-farm {_e(__version__)}</p></body></html>',
        ]
    )


def render_bisection_html(b: Bisection) -> str:
    """A bisection as a standalone HTML page: the answer, the ends and every step with
    the AL and per-position acceptance of each regressed variant."""
    title = f"mtp-farm bisection {b.id}: {b.job} / {b.engine}"
    verdict_class = {"good": "ok", "bad": "bad"}
    rows = [
        (
            verdict_class.get(r[3], ""),
            [_e(c) if i != 1 else f"<code>{_e(c)}</code>" for i, c in enumerate(r)],
        )
        for r in bisection_rows(b)
    ]
    pr = b.commits[b.first_bad].pr if b.first_bad is not None and b.status == "found" else None
    meta = (
        f"{b.searched()}; "
        f"{len(b.steps)} step(s), {b.builds_run} build(s), {b.cells_run} cell(s), "
        f"{b.wall_s:.0f} s wall"
    )
    return "".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            f"<p><strong>{_e(b.headline())}</strong>"
            + (f" &middot; pull request #{pr}" if pr is not None else "")
            + "</p>",
            f'<p class="meta">{_e(meta)}</p>',
            _table(BISECTION_HEAD, rows, num={4}),
            f'<p class="muted">generated by mtp-farm {_e(__version__)}</p></body></html>',
        ]
    )

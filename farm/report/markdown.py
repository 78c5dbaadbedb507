"""Markdown reports: a sweep with its verdicts, and two sweeps compared for a PR. Pure.

GitHub-flavoured Markdown (tables, ``<details>``), ready to post as a pull-request
comment or to read in a terminal. Figures always come with their interval: a
difference without one cannot be judged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from farm import __version__
from farm.analysis.attribution import attribute, labels_from_report
from farm.analysis.check_rules import CheckReport, CheckVerdict
from farm.analysis.compare import SweepComparison, VariantOutcome
from farm.analysis.history import HistoryPoint
from farm.analysis.stats import Interval
from farm.analysis.summary import VariantSummary
from farm.comparable import ComparableKey
from farm.inert import cut, github_cell, github_code, github_markdown
from farm.records import SweepRecord
from farm.report.categories import CATEGORY_HEADINGS, category_rows
from farm.report.figures import (
    FIGURE_HEADINGS,
    matrix_axes,
    matrix_headings,
    row_axes,
    row_figures,
)
from farm.report.grid import al_grid

if TYPE_CHECKING:
    from farm.results.bisection import Bisection

__all__ = [
    "BISECTION_HEAD",
    "History",
    "bisection_rows",
    "fmt_interval",
    "history_labels",
    "metric_label",
    "reference_label",
    "render_bisection",
    "render_comparison",
    "render_markdown",
    "verdict_status",
]

History = Mapping[ComparableKey, Sequence[HistoryPoint]]

_SPARK = "▁▂▃▄▅▆▇█"
_MAX_VERDICT_ROWS = 400


def fmt_interval(i: Interval | None, signed: bool = False, digits: int = 3) -> str:
    """``2.651 [2.526, 2.750]``; ``n/a`` for a missing or non-finite estimate."""
    if i is None or not math.isfinite(i.estimate):
        return "n/a"
    sign = "+" if signed else ""

    def f(x: float) -> str:
        return f"{x:{sign}.{digits}f}" if math.isfinite(x) else "n/a"

    return f"{f(i.estimate)} [{f(i.low)}, {f(i.high)}]"


def verdict_status(v: CheckVerdict) -> str:
    """``regressed``; ``below min effect`` (significant but too small to matter);
    ``improved`` (significant the good way, for one-sided checks); else ``ok``."""
    if v.regressed:
        return "regressed"
    if not v.significant:
        return "ok"
    if abs(v.difference.estimate) < v.min_effect:
        return "below min effect"
    return "improved"


def reference_label(v: CheckVerdict) -> str:
    """The reference named by the axes where it differs from the candidate."""
    cand, ref = v.candidate.axes(), v.reference.axes()
    diff = [f"{k}={ref[k]}" for k in ref if ref[k] != cand.get(k)]
    return ", ".join(diff) or v.reference.label


def metric_label(v: CheckVerdict) -> str:
    """Short metric name of a verdict: ``AL``, ``acceptance[1]``, ``accuracy``, ..."""
    names = {
        "mean_acceptance_length": "AL",
        "acceptance_at_position": "acceptance",
        "greedy_divergence": "greedy divergence",
        "accuracy": "accuracy",
    }
    name = names.get(v.metric, v.metric)
    return f"{name}[{v.position}]" if v.position is not None else name


def _cell(text: object) -> str:
    # The farm's own cells may hold its emphasis (**!**); what is not the farm's is
    # made inert where it enters (farm.inert.github_markdown). Here: nothing in a cell
    # can end the row, open a tag, link or mention.
    return github_cell(str(text))


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out.extend("| " + " | ".join(_cell(c) for c in r) + " |" for r in rows)
    return out


def _verdict_rows(verdicts: Sequence[CheckVerdict]) -> list[list[object]]:
    return [
        [
            verdict_status(v),
            v.check,
            metric_label(v),
            v.candidate.label,
            reference_label(v),
            fmt_interval(v.candidate_value),
            fmt_interval(v.reference_value),
            fmt_interval(v.difference, signed=True),
            f"{v.min_effect:.3f}",
            f"paired n={v.pairs}" if v.paired else "unpaired",
        ]
        for v in verdicts
    ]


_VERDICT_HEAD = (
    "verdict",
    "check",
    "metric",
    "candidate",
    "reference",
    "candidate value",
    "reference value",
    "difference (95% CI)",
    "min effect",
    "pairing",
)


def history_labels(sweep: SweepRecord) -> dict[ComparableKey, str]:
    """ComparableKey -> variant label for the spec-on variants of ``sweep``."""
    out: dict[ComparableKey, str] = {}
    for stored in sweep.cells:
        c = stored.cell
        if not c.speculative:
            continue
        for v in c.variants:
            key = c.variant_key(v.axes)
            out[key] = f"{c.cell_id}[think-{v.thinking}.{v.workload}]"
    return out


def _spark(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        return _SPARK[3] * len(values)
    return "".join(_SPARK[round((x - lo) / (hi - lo) * (len(_SPARK) - 1))] for x in values)


def render_markdown(
    sweep: SweepRecord,
    summaries: Sequence[VariantSummary],
    check_report: CheckReport,
    history: History | None = None,
    cost: str | None = None,
) -> str:
    """A sweep as Markdown: findings, the AL-change grid, verdicts, matrix, trends, notes;
    ``cost``: what the sweep's servers cost (``SweepCost.describe``)."""
    ok = sum(1 for s in sweep.cells if s.result is not None and s.result.status == "ok")
    failed = sum(1 for s in sweep.cells if s.result is not None and s.result.status != "ok")
    lines = [
        f"## mtp-farm sweep {sweep.sweep_id}: {sweep.job} ({sweep.status})",
        "",
        f"Started {sweep.started_at:%Y-%m-%d %H:%M} UTC; {len(sweep.cells)} server cells "
        f"({ok} ok, {failed} failed), {len(summaries)} variants; "
        f"{len(check_report.verdicts)} comparisons, "
        f"**{len(check_report.regressions)} finding(s)**, "
        f"{len(check_report.notes)} note(s).",
    ]
    if cost:
        lines += ["", cost[0].upper() + cost[1:] + "."]
    if sweep.builds:
        lines.append("")
        lines.append(
            "Builds: "
            + "; ".join(
                f"`{b.engine}` = {b.package}=={b.version}"
                + (f" + {', '.join(b.patches)}" if b.patches else "")
                for b in sweep.builds
            )
        )
    lines += ["", "### Findings", ""]
    if check_report.regressions:
        lines += _table(_VERDICT_HEAD, _verdict_rows([f for f in check_report.regressions]))
        rule = attribute(labels_from_report(check_report))
        if rule is not None and rule.terms:
            terms = " AND ".join(str(t) for t in rule.terms)
            lines += [
                "",
                f"Explained by `{terms}`: covers {rule.regressed_covered}/{rule.regressed_total} "
                f"regressed variants and {rule.clean_covered}/{rule.clean_total} clean ones.",
            ]
    else:
        lines.append(f"No regression found in {len(check_report.verdicts)} comparisons.")
    lines += _grid_section(sweep, summaries, check_report)
    if check_report.verdicts:
        shown = check_report.verdicts[:_MAX_VERDICT_ROWS]
        cut = len(check_report.verdicts) - len(shown)
        lines += [
            "",
            f"<details><summary>All {len(check_report.verdicts)} verdicts</summary>",
            "",
            *_table(_VERDICT_HEAD, _verdict_rows(shown)),
            *(["", f"... and {cut} more"] if cut else []),
            "",
            "</details>",
        ]
    lines += ["", "### Matrix", "", *_matrix(summaries)]
    by_category = category_rows(summaries)
    if by_category:
        lines += ["", "### Acceptance by category", "", *_table(CATEGORY_HEADINGS, by_category)]
    if history:
        lines += _trends(sweep, check_report, history)
    if check_report.notes or sweep.excluded:
        lines += ["", "### Notes", ""]
        # A note may quote a failed cell's error: outside text, shown verbatim in a
        # code span where no tag, link or mention renders (farm.inert.github_code).
        lines += [
            f"- {github_markdown(n.check)}: {github_code(n.message)}" for n in check_report.notes
        ]
        lines += [
            f"- excluded {github_markdown(e.label)}: {github_markdown(e.reason)}"
            for e in sweep.excluded
        ]
    lines += ["", f"<sub>mtp-farm {__version__}</sub>", ""]
    return "\n".join(lines)


def _grid_section(
    sweep: SweepRecord, summaries: Sequence[VariantSummary], report: CheckReport
) -> list[str]:
    engines = {s.cell.engine for s in sweep.cells}
    grid = al_grid(sweep, summaries, report, mode="engine" if len(engines) > 1 else "graph")
    if not grid.rows:
        return []
    head = [grid.row_axis, *(" / ".join(c) for c in grid.cols)]
    rows = []
    for label, cells in zip(grid.rows, grid.cells, strict=True):
        row: list[object] = [label]
        for c in cells:
            mark = " **!**" if c.flagged else ""
            if c.kind == "value" and c.difference is not None:
                row.append(f"{c.difference:+.2f}{mark}")
            elif c.kind == "reference":
                row.append(f"ref {c.al:.2f}{mark}" if c.al is not None else "ref")
            elif c.kind == "failed":
                row.append("FAILED")
            elif c.kind == "no_reference":
                row.append(f"{c.al:.2f} (no ref)" if c.al is not None else "no ref")
            else:
                row.append("-")
        rows.append(row)
    return [
        "",
        "### AL change vs reference",
        "",
        f"Reference: {grid.reference}. **!** marks a finding.",
        "",
        *_table(head, rows),
    ]


def _matrix(rows: Sequence[VariantSummary]) -> list[str]:
    shown = matrix_axes(rows)
    head = (*matrix_headings(shown), "status", *FIGURE_HEADINGS[:5])
    body = []
    for r in rows:
        status = r.status if r.status == "ok" else f"**{r.status}**"
        if r.error:
            status += f": {github_markdown(cut(r.error.splitlines()[0], 80))}"
        axes = [github_markdown(str(a)) for a in row_axes(r, shown)]
        body.append([*axes, status, *row_figures(r)[:5]])
    return _table(head, body)


def _trends(sweep: SweepRecord, report: CheckReport, history: History) -> list[str]:
    labels = history_labels(sweep)
    flagged = {f.candidate.label for f in report.regressions}
    rows = []
    for key in sorted(history, key=str):
        points = list(history[key])
        if key not in labels or not points:
            continue
        values = [p.value for p in points]
        first, last = values[0], values[-1]
        change = f"{(last - first) / first:+.1%}" if first else "n/a"
        mark = " **!**" if labels[key] in flagged else ""
        rows.append(
            [
                f"{labels[key]}{mark}",
                _spark(values),
                f"{points[0].sweep_id}..{points[-1].sweep_id}",
                f"{last:.3f}",
                change,
            ]
        )
    if not rows:
        return []
    return [
        "",
        "### AL trend per cell",
        "",
        *_table(("variant", "AL over sweeps", "sweeps", "latest AL", "vs first"), rows),
    ]


# --- two sweeps compared -----------------------------------------------------------------


_ICONS = {
    "regress": ":x: regress",
    "improve": ":rocket: improve",
    "pass": ":white_check_mark: pass",
    "failed": ":warning: failed",
    "unmatched": ":grey_question: unmatched",
    "no_data": ":grey_question: no data",
}
_ORDER: tuple[VariantOutcome, ...] = (
    "regress",
    "failed",
    "improve",
    "pass",
    "no_data",
    "unmatched",
)


def render_comparison(comparison: SweepComparison) -> str:
    """The comparison as a PR comment: verdict counts, then one row per cell key
    (regressions first), each with both ALs and the difference with its interval."""
    c = comparison
    counts = ", ".join(f"{c.count(o)} {o}" for o in _ORDER if c.count(o))
    level = f"{c.level:.0%}"
    head = (
        "outcome",
        "variant",
        "baseline AL",
        "candidate AL",
        f"difference ({level} CI)",
        "relative",
        "min effect",
        "pairing",
    )
    rows = sorted(c.rows, key=lambda r: (_ORDER.index(r.outcome), r.key.label))
    body = [
        [
            _ICONS[r.outcome],
            github_markdown(r.label),
            fmt_interval(r.baseline_al),
            fmt_interval(r.candidate_al),
            fmt_interval(r.difference, signed=True)
            if r.difference
            else github_markdown(r.note or "-"),
            f"{r.relative:+.1%}" if r.relative is not None else "-",
            f"{r.min_effect:.3f}" if r.min_effect is not None else "-",
            (f"paired n={r.pairs}" if r.paired else "unpaired") if r.difference else "-",
        ]
        for r in rows
    ]
    if not sum(c.count(o) for o in ("pass", "regress", "improve")):
        verdict = ":warning: **nothing compared**"
    elif c.count("regress"):
        verdict = ":x: **AL regressed**"
    elif c.count("failed"):
        verdict = ":warning: no AL regression, but some cells failed"
    else:
        verdict = ":white_check_mark: no AL regression"
    lines = [
        f"### mtp-farm: sweep {c.candidate_id} ({github_markdown(c.candidate_job)}) vs "
        f"baseline {c.baseline_id} ({github_markdown(c.baseline_job)})",
        "",
        f"{verdict}: {counts or 'nothing to compare'}.",
        "",
        "A cell regresses when the request-level bootstrap interval of candidate - baseline "
        "AL lies below 0 and the drop reaches the minimum effect (max(2% of baseline AL, 0.05)).",
        "",
        *_table(head, body),
        "",
        f"<sub>mtp-farm {__version__}</sub>",
        "",
    ]
    return "\n".join(lines)


BISECTION_HEAD = ("step", "commit", "subject", "verdict", "AL", "per position", "why")


def bisection_rows(b: Bisection) -> list[list[str]]:
    """The ends and each step of ``b`` as table rows (plain text): the step, the
    commit, its subject, the verdict, AL and per-position acceptance of each
    regressed variant, and why (the comparison with the ends, or why it was skipped)."""

    def figures(figs: Sequence[tuple[str, float | None, tuple[float, ...]]]) -> tuple[str, str]:
        al = "; ".join(f"{x:.3f}" for _, x, _ in figs if x is not None)
        pos = "; ".join(" ".join(f"{p:.2f}" for p in per) for _, _, per in figs)
        return al, pos

    rows = []
    for name, end in (("good end", b.good), ("bad end", b.bad)):
        commit = next(c for c in b.commits if c.sha == end.commit)
        al, pos = figures([(f.label, f.al, f.per_position) for f in end.figures])
        sweeps = ", ".join(map(str, end.sweep_ids))
        rows.append(
            [name, commit.sha[:12], commit.subject, name.split()[0], al, pos, f"sweep {sweeps}"]
        )
    for number, step in enumerate(b.steps, 1):
        commit = b.commits[step.position]
        al, pos = figures(
            [(j.figures.label, j.figures.al, j.figures.per_position) for j in step.judgements]
        )
        why = step.reason or "; ".join(j.note for j in step.judgements)
        where = f"{number} [{step.position}/{len(b.commits) - 1}]"
        rows.append([where, commit.sha[:12], commit.subject, step.verdict, al, pos, why])
    return rows


def render_bisection(b: Bisection) -> str:
    """A bisection as Markdown: the answer, what was searched, the ends and each step
    with its figures, and what it cost."""
    lines = [
        f"## mtp-farm bisection {b.id}: {github_markdown(b.job)} / {github_markdown(b.engine)}",
        "",
        f"**{github_markdown(b.headline())}**",
        "",
        f"- searched: {github_markdown(b.searched())} from {b.good.commit[:12]} to "
        f"{b.bad.commit[:12]}",
        f"- regressed variants: {github_markdown(', '.join(sorted(b.regressed)) or '-')}",
        f"- cost: {len(b.steps)} step(s), {b.builds_run} build(s), {b.cells_run} cell(s), "
        f"{b.wall_s:.0f} s wall",
    ]
    if b.first_bad is not None and b.commits[b.first_bad].pr is not None and b.status == "found":
        lines.append(f"- pull request: #{b.commits[b.first_bad].pr}")
    # Every cell of these rows is plain text: subjects come from the repository.
    rows = [[github_markdown(c) for c in row] for row in bisection_rows(b)]
    lines += ["", *_table(BISECTION_HEAD, rows)]
    return "\n".join(lines) + "\n"

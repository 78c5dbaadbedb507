"""Alerts as views of a judgement's findings: the one function that derives them. Pure.

One alert candidate per (comparable key, check, metric): the findings of one cause on
one variant (for example depth invariance at positions 0 and 1) make one alert with one
figure each. Severity: a correctness check (greedy divergence from the spec-off output,
accuracy) is ``critical`` - under greedy decoding speculation must be lossless, so a
divergence is a wrong answer; an acceptance drop is ``critical`` from 10% relative,
``warning`` below (checks alert from 2%, so 10% is a drop users notice in throughput).

A pooled finding (:mod:`farm.analysis.pooling`: a conjunction of axis values whose
cells, pooled, fell) has no one key: it raises one ``pooled_drop`` alert per key it
covers that did not regress alone, and a key that did keeps the alert of its own
finding; every alert of the conjunction, of either kind, carries the conjunction as its
attribution, so a night's message tells them as one cause and each names the cells.
"""

from __future__ import annotations

from collections.abc import Iterable

from farm.analysis.judgement import Judgement
from farm.comparable import ComparableKey
from farm.results.alerts import (
    COVERAGE,
    AlertCandidate,
    AlertDetails,
    AlertFigure,
    AlertKind,
    Severity,
    alert_key,
    metric_name,
)
from farm.results.verdict import Finding

__all__ = ["CRITICAL_RELATIVE_DROP", "alert_candidates", "cell_alert_keys"]

CRITICAL_RELATIVE_DROP = 0.10
_CORRECTNESS_METRICS = ("greedy_divergence", "accuracy")
# Alerts come in this order of their findings' sources (the order they were raised in
# before findings and alerts had one type): within the sweep, failed cells, the
# baseline, history; then the goldens, acceptance over a run, prefix-cache hits and the
# pooled conjunctions.
_ORDER = (
    "label",
    "within_sweep",
    "cells",
    "baseline",
    "history",
    "golden",
    "over_run",
    "prefix_cache",
    "pooled",
)


def alert_candidates(judgement: Judgement) -> list[AlertCandidate]:
    """The alert candidates of ``judgement``'s findings (a PR's ``pr_vs_base`` findings
    raise none: a PR reports on the PR)."""
    grouped: dict[str, list[tuple[Finding, ComparableKey]]] = {}
    for source in _ORDER:
        for f in judgement.findings:
            if f.source != source or f.check == "pr_vs_base" or f.quarantined:
                continue
            for key in _raised(f, judgement):
                grouped.setdefault(_alert_key(f, key), []).append((f, key))
    return [_candidate(key, found, judgement) for key, found in grouped.items()]


def cell_alert_keys(judgement: Judgement, cell_id: str) -> set[str]:
    """The keys of the alert candidates whose findings involve server cell ``cell_id``
    (a pooled finding's: every alert it raises, the cell's landing made it fire)."""
    return {
        _alert_key(f, key)
        for f in judgement.findings
        if cell_id in f.cells
        for key in _raised(f, judgement)
    }


def _alert_key(f: Finding, key: ComparableKey) -> str:
    return alert_key(key, _kind("cell_failed" if f.source == "cells" else f.check), f.metric)


def _raised(f: Finding, judgement: Judgement) -> tuple[ComparableKey, ...]:
    """The keys whose alerts ``f`` raises: its key; a pooled finding's keys but those
    with a finding of their own against the same baseline (that finding raises it)."""
    if f.source != "pooled":
        return (f.key,) if f.key is not None else ()
    alone = {g.key for g in judgement.findings if g.source == "baseline"}
    return tuple(k for k in f.keys if k not in alone)


def _pooled_attribution(judgement: Judgement, key: ComparableKey) -> str | None:
    """The conjunction of the first pooled finding covering ``key``, with its cells and
    pooled effect (None: no pooled finding covers it)."""
    for f in judgement.findings:
        if f.source == "pooled" and key in f.keys and not f.quarantined:
            effect = f" pooled, {f.relative:+.1%}" if f.relative is not None else " pooled"
            return f"{f.label}{COVERAGE}{len(f.cells)} cells{effect}: " + ", ".join(f.cells)
    return None


def _figures(f: Finding, key: ComparableKey) -> tuple[AlertFigure, ...]:
    """``f``'s figures for the alert of ``key``: a pooled finding's, that key's own."""
    if f.source != "pooled":
        return f.figures
    return tuple(fig for k, fig in zip(f.keys, f.figures, strict=False) if k == key)


def _kind(check: str) -> AlertKind:
    return check  # type: ignore[return-value]  # the checks' names are the alert kinds


def _candidate(
    key: str, found: list[tuple[Finding, ComparableKey]], judgement: Judgement
) -> AlertCandidate:
    first, cell = found[0]
    figures = tuple(fig for f, k in found for fig in _figures(f, k))
    attribution = None
    if first.source == "within_sweep":
        rule = judgement.attribution
        if rule is not None and rule.terms and rule.matches(cell.axis_values()):
            attribution = str(rule)
    elif first.source in ("baseline", "pooled"):
        attribution = _pooled_attribution(judgement, cell)
    details = AlertDetails(
        cell=cell,
        sweep_id=judgement.sweep_id,
        figures=figures,
        attribution=attribution,
        error=first.error,
        build_id=judgement.builds.get(cell.engine),
    )
    return AlertCandidate(
        key=key,
        kind=_kind("cell_failed" if first.source == "cells" else first.check),
        metric=first.metric,
        severity=_severity(first, figures),
        summary=_summary(first, figures),
        details=details,
    )


def _severity(first: Finding, figures: Iterable[AlertFigure]) -> Severity:
    if first.source == "cells":
        return "warning"
    if first.source == "label":
        return "critical"  # the night's comparisons of that cell cannot be trusted
    if first.source in ("history", "over_run", "pooled"):
        rel = first.relative
        return "critical" if rel is not None and rel <= -CRITICAL_RELATIVE_DROP else "warning"
    if first.source == "prefix_cache":
        # Slower, not wrong: critical only when caching stopped hitting at all.
        stopped = any(f.candidate_value.estimate == 0.0 for f in figures)
        return "critical" if stopped else "warning"
    if first.source == "baseline":
        rel = first.relative
        return "critical" if rel is not None and abs(rel) >= CRITICAL_RELATIVE_DROP else "warning"
    for f in figures:
        if f.metric in _CORRECTNESS_METRICS:
            return "critical"
        if f.relative is not None and abs(f.relative) >= CRITICAL_RELATIVE_DROP:
            return "critical"
    return "warning"


def _summary(first: Finding, figures: tuple[AlertFigure, ...]) -> str:
    if first.source in ("cells", "history"):
        return first.summary
    if first.source == "label":
        return f"{first.check}: {first.summary}"
    if first.source in ("baseline", "over_run", "prefix_cache", "pooled"):
        return f"{first.check}: {first.summary}"
    f = figures[0]
    rel = f" ({f.relative:+.1%})" if f.relative is not None else ""
    text = (
        f"{first.check}: {metric_name(f.metric, f.position)} of {f.candidate} is "
        f"{f.candidate_value} vs {f.reference_value} for {f.reference}; "
        f"difference {f.difference}{rel}"
    )
    if len(figures) > 1:
        text += f"; and {len(figures) - 1} more position(s)"
    return text

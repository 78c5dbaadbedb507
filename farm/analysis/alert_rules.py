"""Alerts as views of a judgement's findings: the one function that derives them. Pure.

One alert candidate per (comparable key, check, metric): the findings of one cause on
one variant (for example depth invariance at positions 0 and 1) make one alert with one
figure each. Severity: a correctness check (greedy divergence from the spec-off output,
accuracy) is ``critical`` - under greedy decoding speculation must be lossless, so a
divergence is a wrong answer; an acceptance drop is ``critical`` from 10% relative,
``warning`` below (checks alert from 2%, so 10% is a drop users notice in throughput).
"""

from __future__ import annotations

from collections.abc import Iterable

from farm.analysis.judgement import Judgement
from farm.results.alerts import (
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
# baseline, history; then the goldens, acceptance over a run, prefix-cache hits.
_ORDER = (
    "label",
    "within_sweep",
    "cells",
    "baseline",
    "history",
    "golden",
    "over_run",
    "prefix_cache",
)


def alert_candidates(judgement: Judgement) -> list[AlertCandidate]:
    """The alert candidates of ``judgement``'s findings (a PR's ``pr_vs_base`` findings
    raise none: a PR reports on the PR)."""
    grouped: dict[str, list[Finding]] = {}
    for source in _ORDER:
        for f in judgement.findings:
            if f.source != source or f.key is None or f.check == "pr_vs_base" or f.quarantined:
                continue
            kind = "cell_failed" if f.source == "cells" else f.check
            grouped.setdefault(alert_key(f.key, _kind(kind), f.metric), []).append(f)
    return [_candidate(key, found, judgement) for key, found in grouped.items()]


def cell_alert_keys(judgement: Judgement, cell_id: str) -> set[str]:
    """The keys of the alert candidates whose findings involve server cell ``cell_id``."""
    return {
        alert_key(f.key, _kind("cell_failed" if f.source == "cells" else f.check), f.metric)
        for f in judgement.findings
        if f.key is not None and cell_id in f.cells
    }


def _kind(check: str) -> AlertKind:
    return check  # type: ignore[return-value]  # the checks' names are the alert kinds


def _candidate(key: str, findings: list[Finding], judgement: Judgement) -> AlertCandidate:
    first = findings[0]
    assert first.key is not None
    figures = tuple(fig for f in findings for fig in f.figures)
    attribution = None
    if first.source == "within_sweep":
        rule = judgement.attribution
        if rule is not None and rule.terms and rule.matches(first.key.axis_values()):
            attribution = str(rule)
    details = AlertDetails(
        cell=first.key,
        sweep_id=judgement.sweep_id,
        figures=figures,
        attribution=attribution,
        error=first.error,
        build_id=judgement.builds.get(first.key.engine),
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
    if first.source in ("history", "over_run"):
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
    if first.source in ("baseline", "over_run", "prefix_cache"):
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

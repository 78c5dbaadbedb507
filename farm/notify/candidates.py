"""Turn analysis results into alert candidates. Pure: no I/O.

One candidate per (cell key, check kind, metric): the findings of one cause on one
variant (for example depth invariance at positions 0 and 1) make one alert with one
figure each. Severity: a correctness check (greedy divergence from the spec-off
output, accuracy) is ``critical`` - speculation must be lossless (DESIGN.md section
5); an acceptance drop is ``critical`` from 10% relative, ``warning`` below (checks
alert from 2%, so 10% is a drop users notice in throughput).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from farm.analysis.attribution import Attribution, attribute, labels_from_report
from farm.analysis.history import HistoryAnalysis
from farm.analysis.stats import Interval
from farm.analysis.verdicts import CheckReport, Finding, Verdict
from farm.notify.alert import (
    AlertCandidate,
    AlertDetails,
    AlertFigure,
    FigureInterval,
    Severity,
    alert_key,
)
from farm.notify.message import metric_name
from farm.records import StoredCell, SweepRecord

__all__ = [
    "CRITICAL_RELATIVE_DROP",
    "alert_candidates_from_history",
    "alert_candidates_from_report",
]

CRITICAL_RELATIVE_DROP = 0.10
_CORRECTNESS_METRICS = ("greedy_divergence", "accuracy")


def alert_candidates_from_report(
    report: CheckReport,
    sweep: SweepRecord,
    *,
    include_failed_cells: bool = True,
) -> list[AlertCandidate]:
    """Alert candidates for the findings of ``report`` on ``sweep``.

    ``sweep`` supplies what the verdicts do not carry: the failed cells, which become
    ``cell_failed`` candidates unless
    ``include_failed_cells`` is false. Candidates come in finding order, failed cells
    last.
    """
    rule = _attribution(report)
    grouped: dict[str, list[Finding]] = {}
    for finding in report.findings:
        v = finding.verdict
        key = alert_key(v.candidate.key, v.check, v.metric)
        grouped.setdefault(key, []).append(finding)
    out = [_from_findings(key, findings, rule, sweep.sweep_id) for key, findings in grouped.items()]
    if include_failed_cells:
        out.extend(_failed(stored, sweep.sweep_id) for stored in _failed_cells(sweep.cells))
    return out


def alert_candidates_from_history(
    analyses: Sequence[HistoryAnalysis], sweep_id: int, *, recent: int = 2
) -> list[AlertCandidate]:
    """Candidates for confirmed AL drops over nightlies that the latest points confirm.

    Each analysis must cover a series ending with ``sweep_id``. A change point is
    reported only while its first point is among the last ``recent`` points (the
    default equals :class:`farm.analysis.history.HistoryConfig` ``confirm``), so the
    same old shift is not raised again, night after night, once it is resolved.
    """
    out: list[AlertCandidate] = []
    for analysis in analyses:
        if analysis.key is None:
            continue
        cell = analysis.key
        for cp in analysis.alerts:
            if cp.index < analysis.points - recent:
                continue
            figure = AlertFigure(
                metric="mean_acceptance_length",
                candidate=f"{cp.after_n} sweeps from sweep {cp.sweep_id}",
                reference=f"{cp.before_n} sweeps before",
                candidate_value=FigureInterval.of(cp.after_mean),
                reference_value=FigureInterval.of(cp.before_mean),
                difference=FigureInterval.of(cp.after_mean - cp.before_mean),
                relative=cp.relative_change,
                pvalue=cp.pvalue,
            )
            severity: Severity = (
                "critical" if cp.relative_change <= -CRITICAL_RELATIVE_DROP else "warning"
            )
            out.append(
                AlertCandidate(
                    key=alert_key(cell, "history_change", "mean_acceptance_length"),
                    kind="history_change",
                    metric="mean_acceptance_length",
                    severity=severity,
                    summary=(
                        f"{cell}: AL fell {cp.before_mean:.3f} -> {cp.after_mean:.3f} "
                        f"({cp.relative_change:+.1%}) from sweep {cp.sweep_id}, "
                        f"held for {cp.after_n} sweep(s)"
                    ),
                    details=AlertDetails(cell=cell, sweep_id=sweep_id, figures=(figure,)),
                )
            )
    return out


def _attribution(report: CheckReport) -> Attribution | None:
    if not report.findings:
        return None
    return attribute(labels_from_report(report))


def _figure(v: Verdict) -> AlertFigure:
    ref = v.reference_value.estimate
    relative = v.difference.estimate / ref if ref else None
    return AlertFigure(
        metric=v.metric,
        position=v.position,
        candidate=v.candidate.label,
        reference=v.reference.label,
        candidate_value=_interval(v.candidate_value),
        reference_value=_interval(v.reference_value),
        difference=_interval(v.difference),
        relative=relative,
        paired=v.paired,
        pairs=v.pairs,
        min_effect=v.min_effect,
        baseline=v.baseline,
    )


def _interval(i: Interval) -> FigureInterval:
    return FigureInterval.of(i.estimate, i.low, i.high, i.level)


def _severity(figures: Iterable[AlertFigure]) -> Severity:
    for f in figures:
        if f.metric in _CORRECTNESS_METRICS:
            return "critical"
        if f.relative is not None and abs(f.relative) >= CRITICAL_RELATIVE_DROP:
            return "critical"
    return "warning"


def _from_findings(
    key: str,
    findings: list[Finding],
    rule: Attribution | None,
    sweep_id: int,
) -> AlertCandidate:
    first = findings[0].verdict
    cell = first.candidate.key
    figures = tuple(_figure(f.verdict) for f in findings)
    matched = rule is not None and bool(rule.terms) and rule.matches(first.candidate.axes())
    details = AlertDetails(
        cell=cell,
        sweep_id=sweep_id,
        figures=figures,
        attribution=str(rule) if matched else None,
    )
    return AlertCandidate(
        key=key,
        kind=first.check,
        metric=first.metric,
        severity=_severity(figures),
        summary=_summary(first, figures),
        details=details,
    )


def _summary(v: Verdict, figures: tuple[AlertFigure, ...]) -> str:
    f = figures[0]
    rel = f" ({f.relative:+.1%})" if f.relative is not None else ""
    text = (
        f"{v.check}: {metric_name(f.metric, f.position)} of {v.candidate.label} is "
        f"{f.candidate_value} vs {f.reference_value} for {v.reference.label}; "
        f"difference {f.difference}{rel}"
    )
    if len(figures) > 1:
        text += f"; and {len(figures) - 1} more position(s)"
    return text


def _failed_cells(cells: Iterable[StoredCell]) -> Iterable[StoredCell]:
    return (s for s in cells if s.result is not None and s.result.status != "ok")


def _failed(stored: StoredCell, sweep_id: int) -> AlertCandidate:
    c, result = stored.cell, stored.result
    assert result is not None
    cell = c.key
    error = (result.error or "no error recorded").strip()
    first_line = error.splitlines()[0] if error else ""
    return AlertCandidate(
        key=alert_key(cell, "cell_failed", None),
        kind="cell_failed",
        severity="warning",
        summary=f"{c.cell_id} {result.status}: {first_line[:200]}",
        details=AlertDetails(cell=cell, sweep_id=sweep_id, error=error[:4000]),
    )

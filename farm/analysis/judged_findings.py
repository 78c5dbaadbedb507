"""Each check's result as the findings and notes of a judgement: what a drop against the
baseline, a within-sweep verdict, a change point or a failed cell reads as, with the
figures its alert carries. Pure; :func:`farm.analysis.judgement.judge` calls these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from farm.analysis.by_context import (
    ContextPoint,
    context_clauses,
    context_of,
    verdict_context_clauses,
)
from farm.analysis.check_rules import CheckVerdict
from farm.analysis.compare import ComparedVariant, SweepComparison
from farm.analysis.history import HistoryAnalysis
from farm.analysis.judge_rules import CHANGE_POINT_RECENT, JudgeRules
from farm.analysis.stats import Interval
from farm.records import StoredCell, SweepRecord
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import Finding, PositionChange

__all__ = [
    "baseline_finding",
    "baseline_findings",
    "baseline_notes",
    "failed_cell_findings",
    "history_findings",
    "position_text",
    "within_finding",
    "within_findings",
]


def _relative(v: CheckVerdict) -> float | None:
    ref = v.reference_value.estimate
    return v.difference.estimate / ref if ref else None


def _interval(i: Interval) -> FigureInterval:
    return FigureInterval.of(i.estimate, i.low, i.high, i.level)


def within_findings(verdicts: Sequence[CheckVerdict]) -> list[Finding]:
    """A finding per regressed verdict; one of a variant measured at several context
    lengths says how each length moved under the same check."""
    clauses = verdict_context_clauses(verdicts)
    return [
        within_finding(v, clause)
        for v, clause in zip(verdicts, clauses, strict=True)
        if v.regressed
    ]


def within_finding(v: CheckVerdict, by_context: str | None = None) -> Finding:
    relative = _relative(v)
    figure = AlertFigure(
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
    return Finding(
        source="within_sweep",
        check=v.check,
        key=v.candidate.key,
        cells=tuple(dict.fromkeys((v.candidate.cell_id, v.reference.cell_id))),
        metric=v.metric,
        summary=v.describe() + (f"; {by_context}" if by_context else ""),
        relative=relative,
        figures=(figure,),
    )


def position_text(positions: Iterable[PositionChange]) -> str:
    """The positions that fell, as a clause of a finding's summary."""
    fell = [p for p in positions if p.fell]
    if not fell:
        return "no single draft position fell by the minimum effect"
    return "; ".join(
        f"acceptance at position {p.position} fell {p.baseline:.3f} -> {p.candidate:.3f} "
        f"({p.difference:+.3f})"
        for p in fell
    )


def baseline_findings(
    comparison: SweepComparison, baseline_id: int, r: JudgeRules
) -> list[Finding]:
    """A finding per regressed row; one of a variant measured at several context
    lengths says how each length moved."""
    rows = comparison.rows
    clauses = context_clauses(rows, key=lambda row: row.key, point=_context_point)
    return [
        baseline_finding(row, baseline_id, r, clause)
        for row, clause in zip(rows, clauses, strict=True)
        if row.outcome == "regress"
    ]


def _context_point(row: ComparedVariant) -> ContextPoint | None:
    if row.baseline_al is None or row.candidate_al is None:
        return None
    return ContextPoint(
        context=context_of(row.key),
        reference=row.baseline_al.estimate,
        candidate=row.candidate_al.estimate,
        fell=row.outcome == "regress",
    )


def baseline_finding(
    row: ComparedVariant, baseline_id: int, r: JudgeRules, by_context: str | None = None
) -> Finding:
    assert row.baseline_al is not None and row.candidate_al is not None
    assert row.difference is not None and row.cell_id is not None
    rel = row.relative
    rel_text = f" ({rel:+.1%})" if rel is not None else ""
    where = f"in sweep {baseline_id} (last good night)" if r.baseline_sweep else "at the base"
    summary = (
        f"{row.label}: AL {row.candidate_al} vs {row.baseline_al} {where}; "
        f"difference {row.difference}{rel_text}; " + position_text(row.positions)
    )
    if row.threshold is not None:
        summary += f"; {row.threshold.describe()}"
    if row.decided is not None:
        summary += f"; {row.decided}"
    if row.confirmation is not None:
        summary += f"; {row.confirmation.describe()}"
    if by_context:
        summary += f"; {by_context}"
    reference = f"{row.baseline_label} in sweep {baseline_id}"
    figures = [
        AlertFigure(
            metric="mean_acceptance_length",
            candidate=row.label,
            reference=reference,
            candidate_value=_interval(row.candidate_al),
            reference_value=_interval(row.baseline_al),
            difference=_interval(row.difference),
            relative=rel,
            paired=row.paired,
            pairs=row.pairs,
            min_effect=row.min_effect,
        )
    ]
    figures += [
        AlertFigure(
            metric="acceptance_at_position",
            position=p.position,
            candidate=row.label,
            reference=reference,
            candidate_value=FigureInterval.of(p.candidate),
            reference_value=FigureInterval.of(p.baseline),
            difference=FigureInterval.of(p.difference, p.low, p.high, r.check.level),
            relative=p.difference / p.baseline if p.baseline else None,
            min_effect=r.check.min_position_diff,
        )
        for p in row.positions
        if p.fell
    ]
    return Finding(
        source="baseline",
        check=r.baseline_check,
        key=row.key,
        cells=(row.cell_id,),
        metric="mean_acceptance_length",
        summary=summary,
        relative=rel,
        baseline_sweep_id=baseline_id if r.baseline_sweep else None,
        positions=row.positions,
        figures=tuple(figures),
    )


def baseline_notes(comparison: SweepComparison, baseline_id: int, r: JudgeRules) -> list[str]:
    against = f" vs sweep {baseline_id}" if r.baseline_sweep else ""
    notes = [
        f"{row.label}{against}: {row.outcome} ({row.note})"
        for row in comparison.rows
        if row.outcome in ("failed", "unmatched", "no_data")
    ]
    rules = [row.threshold for row in comparison.rows if row.threshold is not None]
    if rules:
        short = [t for t in rules if not t.calibrated]
        notes.append(
            f"AL thresholds from each key's own nights: {len(rules) - len(short)} key(s) "
            f"calibrated, {len(short)} with insufficient history (fewer than "
            f"{rules[0].min_nights} nights: the floor rule)"
        )
    notes += [
        f"{row.label}{against}: {row.confirmation.describe()}"
        for row in comparison.rows
        if row.confirmation is not None and row.outcome != "regress"
    ]
    early = [row for row in comparison.rows if row.decided is not None]
    if early:
        passed = sum(row.outcome == "pass" for row in early)
        pairs = sum(row.pairs for row in early)
        notes.append(
            f"sequential looks: {len(early)} variant(s) decided early on {pairs} paired "
            f"prompts ({passed} pass, {len(early) - passed} regress)"
        )
    return notes


def history_findings(analyses: Sequence[HistoryAnalysis], sweep: SweepRecord) -> list[Finding]:
    out: list[Finding] = []
    for analysis in analyses:
        if analysis.key is None:
            continue
        key = analysis.key
        for cp in analysis.alerts:
            if cp.index < analysis.points - CHANGE_POINT_RECENT:
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
            out.append(
                Finding(
                    source="history",
                    check="history_change",
                    key=key,
                    cells=sweep.cells_measuring(key),
                    metric="mean_acceptance_length",
                    summary=(
                        f"{key}: AL fell {cp.before_mean:.3f} -> {cp.after_mean:.3f} "
                        f"({cp.relative_change:+.1%}) from sweep {cp.sweep_id}, "
                        f"held for {cp.after_n} sweep(s)"
                    ),
                    relative=cp.relative_change,
                    figures=(figure,),
                )
            )
    return out


def failed_cell_findings(cells: Iterable[StoredCell], side: str) -> list[Finding]:
    """One ``cell_failed`` finding per cell that did not end ok (``side`` prefixes the
    summary: "candidate", "baseline")."""
    out = []
    for stored in cells:
        result = stored.result
        if result is None or result.status == "ok":
            continue
        error = (result.error or "no error recorded").strip()
        first = error.splitlines() or [""]
        prefix = f"{side} " if side else ""
        out.append(
            Finding(
                source="cells",
                check="cell_failed",
                key=stored.cell.key,
                cells=(stored.cell.cell_id,),
                summary=f"{prefix}{stored.cell.cell_id} {result.status}: {first[0][:200]}",
                error=error[:4000],
            )
        )
    return out

"""The nightly's decision: one stored sweep judged three ways, as one verdict. Pure.

A nightly sweep is checked

1. within itself (:func:`farm.analysis.checks.check_sweep`: graph modes vs eager,
   patched builds vs their base);
2. against the job's *last good night*, cell by cell: every spec-on variant is paired
   with the variant of the same :class:`farm.comparable.ComparableKey` (never the
   build) and judged by the statistics of ``farm compare``
   (:func:`farm.analysis.compare.compare_sweeps`). This is the only check that sees a
   new build which lowers acceptance in every cell on its first night: the
   within-sweep checks have nothing to compare it with, and the history checks wait
   for a second night to confirm (DESIGN.md section 8);
3. over the job's last N sweeps for slow drifts (:mod:`farm.analysis.history`).

The outcome follows :func:`farm.workflows.verdict.outcome_of`. Each finding names its
cells and, for a drop against the last good night, the draft positions whose
acceptance fell and by how much. The same findings become alert candidates, so the
store deduplicates them with every other alert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict

from farm.analysis.checks import check_sweep
from farm.analysis.compare import ComparedVariant, SweepComparison, compare_sweeps
from farm.analysis.history import HistoryConfig, HistoryPoint, analyze_histories
from farm.analysis.stats import (
    Interval,
)
from farm.analysis.verdicts import CheckConfig, CheckReport
from farm.comparable import ComparableKey
from farm.notify.alert import AlertCandidate, AlertDetails, AlertFigure, FigureInterval, alert_key
from farm.notify.candidates import (
    CRITICAL_RELATIVE_DROP,
    alert_candidates_from_history,
    alert_candidates_from_report,
)
from farm.records import SweepRecord
from farm.workflows.findings import (
    PairedVariant,
    failed_cell_findings,
    position_changes,
    position_text,
    spec_on_variants,
)
from farm.workflows.verdict import (
    SweepVerdict,
    VerdictFinding,
    VerdictOutcome,
    outcome_of,
)

__all__ = [
    "BASELINE_CHECK",
    "EarlierNight",
    "NightJudgement",
    "judge_night",
    "last_good_night",
]

# The alert kind and finding check of a drop against the job's last good night.
BASELINE_CHECK: Final = "nightly_vs_last_good"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EarlierNight(_Frozen):
    """What choosing a baseline needs to know of an earlier sweep of the job."""

    sweep_id: int
    status: str  # the sweep's status (farm.records.SWEEP_STATUSES)
    verdict: VerdictOutcome | None = None  # its stored nightly verdict, if any


class NightJudgement(_Frozen):
    """The verdict on a night and the alert candidates it raises (same findings)."""

    verdict: SweepVerdict
    alerts: tuple[AlertCandidate, ...]
    comparison: SweepComparison | None = None


def last_good_night(sweep_id: int, earlier: Sequence[EarlierNight]) -> int | None:
    """The newest sweep before ``sweep_id`` that is a good baseline, or None.

    Once the job has nightly verdicts, a good night is one whose verdict is ``clean``
    (a night that regressed never becomes the baseline, so the next night is compared
    with the last clean one and raises the same alert again). Before any verdict
    exists (the job's first nightly), the newest sweep whose cells all ran ok
    (status ``ok``) is taken.
    """
    before = sorted((n for n in earlier if n.sweep_id < sweep_id), key=lambda n: -n.sweep_id)
    if any(n.verdict is not None for n in before):
        good = [n for n in before if n.verdict == "clean"]
    else:
        good = [n for n in before if n.status == "ok"]
    return good[0].sweep_id if good else None


def _baseline_finding(
    row: ComparedVariant,
    base: PairedVariant,
    cand: PairedVariant,
    baseline_id: int,
    cfg: CheckConfig,
    sweep_id: int,
) -> tuple[VerdictFinding, AlertCandidate]:
    assert row.baseline_al is not None and row.candidate_al is not None
    assert row.difference is not None
    positions = position_changes(base.result, cand.result, cand.key.label, cfg)
    rel = row.relative
    rel_text = f" ({rel:+.1%})" if rel is not None else ""
    summary = (
        f"{cand.label}: AL {row.candidate_al} vs {row.baseline_al} in sweep {baseline_id} "
        f"(last good night); difference {row.difference}{rel_text}; " + position_text(positions)
    )
    finding = VerdictFinding(
        source="baseline",
        check=BASELINE_CHECK,
        key=row.key,
        cells=(cand.cell_id,),
        metric="mean_acceptance_length",
        summary=summary,
        relative=rel,
        baseline_sweep_id=baseline_id,
        positions=positions,
    )
    reference = f"{base.label} in sweep {baseline_id}"
    figures = [
        AlertFigure(
            metric="mean_acceptance_length",
            candidate=cand.label,
            reference=reference,
            candidate_value=_figure(row.candidate_al),
            reference_value=_figure(row.baseline_al),
            difference=_figure(row.difference),
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
            candidate=cand.label,
            reference=reference,
            candidate_value=FigureInterval.of(p.candidate),
            reference_value=FigureInterval.of(p.baseline),
            difference=FigureInterval.of(p.difference, p.low, p.high, cfg.level),
            relative=p.difference / p.baseline if p.baseline else None,
            min_effect=cfg.min_position_diff,
        )
        for p in positions
        if p.fell
    ]
    severe = rel is not None and abs(rel) >= CRITICAL_RELATIVE_DROP
    alert = AlertCandidate(
        key=alert_key(cand.key, BASELINE_CHECK, "mean_acceptance_length"),
        kind=BASELINE_CHECK,
        metric="mean_acceptance_length",
        severity="critical" if severe else "warning",
        summary=f"{BASELINE_CHECK}: {summary}",
        details=AlertDetails(cell=cand.key, sweep_id=sweep_id, figures=tuple(figures)),
    )
    return finding, alert


def _figure(i: Interval) -> FigureInterval:
    return FigureInterval.of(i.estimate, i.low, i.high, i.level)


def _against_last_good(
    sweep: SweepRecord, last_good: SweepRecord, cfg: CheckConfig
) -> tuple[SweepComparison, list[VerdictFinding], list[AlertCandidate], list[str]]:
    comparison = compare_sweeps(last_good, sweep, config=cfg)
    base, cand = spec_on_variants(last_good), spec_on_variants(sweep)
    findings: list[VerdictFinding] = []
    alerts: list[AlertCandidate] = []
    notes: list[str] = []
    for row in comparison.rows:
        if row.outcome == "regress" and row.key in base and row.key in cand:
            finding, alert = _baseline_finding(
                row, base[row.key], cand[row.key], last_good.sweep_id, cfg, sweep.sweep_id
            )
            findings.append(finding)
            alerts.append(alert)
        elif row.outcome in ("failed", "unmatched", "no_data"):
            notes.append(f"{row.label} vs sweep {last_good.sweep_id}: {row.outcome} ({row.note})")
    return comparison, findings, alerts, notes


def _within_findings(report: CheckReport) -> list[VerdictFinding]:
    return [
        VerdictFinding(
            source="within_sweep",
            check=f.verdict.check,
            key=f.verdict.candidate.key.label,
            cells=tuple(dict.fromkeys((f.verdict.candidate.cell_id, f.verdict.reference.cell_id))),
            metric=f.verdict.metric,
            summary=f.message,
            relative=(
                f.verdict.difference.estimate / f.verdict.reference_value.estimate
                if f.verdict.reference_value.estimate
                else None
            ),
        )
        for f in report.findings
    ]


def judge_night(
    sweep: SweepRecord,
    *,
    last_good: SweepRecord | None,
    history: Mapping[ComparableKey, Sequence[HistoryPoint]] | None = None,
    base_of: Mapping[str, str] | None = None,
    config: CheckConfig | None = None,
    history_config: HistoryConfig | None = None,
) -> NightJudgement:
    """The verdict on nightly ``sweep`` and the alert candidates it raises.

    ``last_good``: the job's last good night (:func:`last_good_night`), None on the
    job's first night; ``history``: per-key AL series over the job's last N sweeps
    ending with ``sweep`` (:func:`farm.analysis.history.series_from_sweeps`, or the
    store's ``history_series``; fewer than 3 points find no change point); ``base_of``: patched
    engine -> base engine for the within-sweep patch check. Failed cells become
    findings of source ``cells`` and ``cell_failed`` alert candidates.
    """
    cfg = config or CheckConfig()
    within = check_sweep(sweep, base_of or {}, cfg)
    findings = _within_findings(within)
    alerts = alert_candidates_from_report(within, sweep)
    notes = [n.message for n in within.notes]
    comparison = None
    comparisons = len(within.verdicts)
    if last_good is not None:
        comparison, found, raised, more_notes = _against_last_good(sweep, last_good, cfg)
        findings += found
        alerts += raised
        notes += more_notes
        comparisons += len(comparison.rows)
    series = {k: tuple(v) for k, v in (history or {}).items()}
    history_sweeps = len({p.sweep_id for points in series.values() for p in points})
    if history_sweeps > 1:
        analyses = analyze_histories(series, config=history_config)
        drifts = alert_candidates_from_history(analyses, sweep.sweep_id)
        alerts += drifts
        findings += [
            VerdictFinding(
                source="history",
                check="history_change",
                key=a.details.cell.label,
                cells=_cells_of(sweep, a.details.cell),
                metric=a.metric,
                summary=a.summary,
                relative=a.details.figures[0].relative if a.details.figures else None,
            )
            for a in drifts
        ]
    findings += failed_cell_findings(sweep.cells)
    ordered = tuple(findings)
    verdict = SweepVerdict(
        sweep_id=sweep.sweep_id,
        job=sweep.job,
        kind="nightly",
        outcome=outcome_of(ordered),
        findings=ordered,
        notes=tuple(dict.fromkeys(notes)),
        comparisons=comparisons,
        baseline_sweep_ids=(last_good.sweep_id,) if last_good is not None else (),
        history=history_sweeps,
    )
    return NightJudgement(verdict=verdict, alerts=tuple(alerts), comparison=comparison)


def _cells_of(sweep: SweepRecord, key: ComparableKey) -> tuple[str, ...]:
    """The cells of ``sweep`` that measured ``key`` (a history series names a key)."""
    return tuple(
        stored.cell.cell_id
        for stored in sweep.cells
        if any(stored.cell.variant_key(v.axes) == key for v in stored.cell.variants)
    )

"""The judgement of a sweep: the one function every verdict comes from. Pure.

:func:`judge` checks one stored sweep three ways and returns one :class:`Judgement`:

1. within itself (:func:`farm.analysis.checks.check_sweep`: graph modes vs eager,
   patched builds vs their base, depth invariance);
2. against a baseline sweep, variant by variant: every spec-on variant paired with the
   variant of the same :class:`farm.comparable.ComparableKey` (never the build), by
   :func:`farm.analysis.compare.compare_sweeps` (the job's last good night for a
   nightly, the base build for a PR, an end of a bisection, ``farm compare``'s
   baseline). This is the only check that sees a new build which lowers acceptance
   in every cell on its first night (the within-sweep checks hold it only to itself);
3. over the job's last N sweeps for slow drifts (:mod:`farm.analysis.history`);

and holds it to the goldens the job names (:mod:`farm.analysis.golden_check`: the
per-position spec-decode gates vllm-ascend keeps), each miss a regression finding.
Before any of that, a cell that ran as another configuration than its label says is a
``label_mismatch`` finding of its own and is left out of every comparison
(:mod:`farm.analysis.labels`).

``farm nightly``, ``farm alerts check``, ``farm pr``, ``farm compare``, each bisection
step, the HTML report and the published pages take its result; alerts are derived from
its findings by :func:`farm.analysis.alert_rules.alert_candidates`. Nothing downstream
recomputes a statistic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pydantic import BaseModel, ConfigDict

from farm.analysis.attribution import Attribution, attribute, labels_from_report
from farm.analysis.check_rules import CheckConfig, CheckReport, Verdict
from farm.analysis.checks import check_sweep
from farm.analysis.compare import ComparedVariant, SweepComparison, compare_sweeps
from farm.analysis.gate import nothing_compared
from farm.analysis.golden_check import GOLDEN_CHECK, check_goldens
from farm.analysis.history import HistoryAnalysis, HistoryConfig, HistoryPoint, analyze_histories
from farm.analysis.labels import as_labelled, label_findings
from farm.analysis.noise import NoiseRule, key_noise
from farm.analysis.over_run import COLLAPSE_CHECK, CollapseRule, check_over_run
from farm.analysis.pooling import POOLED_CHECK, PoolRule, check_pooled
from farm.analysis.prefix_cache import PREFIX_CHECK, PrefixRule, check_prefix_cache
from farm.analysis.stats import Interval
from farm.analysis.summary import patched_bases
from farm.comparable import ComparableKey
from farm.errors import FarmError
from farm.goldens import GoldenCheck
from farm.records import StoredCell, SweepRecord
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import (
    Finding,
    PositionChange,
    SweepVerdict,
    VerdictKind,
    VerdictOutcome,
    outcome_of,
)

__all__ = [
    "BASELINE_CHECK",
    "CHANGE_POINT_RECENT",
    "COLLAPSE_CHECK",
    "GOLDEN_CHECK",
    "NOTHING_COMPARED",
    "POOLED_CHECK",
    "PREFIX_CHECK",
    "PR_CHECK",
    "JudgeRules",
    "Judgement",
    "judge",
    "judge_within",
    "position_text",
]

# The finding check (and alert kind) of a drop against the job's last good night.
BASELINE_CHECK: Final = "nightly_vs_last_good"
# The finding check of a PR's candidate cell that fell below its base.
PR_CHECK: Final = "pr_vs_base"
# The finding check of a comparison in which nothing was compared (a gate, not a pass).
NOTHING_COMPARED: Final = "nothing_compared"
# A change point is a finding while its first point is among the last this many points
# (HistoryConfig.confirm's default), so an old shift is not raised night after night.
CHANGE_POINT_RECENT: Final = 2


class JudgeRules(BaseModel):
    """How a use judges: the statistics, which checks run, and how findings read.

    ``within``: run the within-sweep checks (``graph_modes``: graph modes against
    eager too; ``base_of``: patched engine -> base
    engine; ``depth_invariance``: that check too); ``baseline_check``: the check name
    of a drop against the baseline;
    ``baseline_sweep``: name the baseline's sweep in findings and notes (a nightly's
    last good night) rather than call it ``the base`` (a PR); ``engine_map``: candidate
    engine -> baseline engine (a PR build named apart from its base);
    ``candidate_side`` / ``baseline_side``: the words before a failed cell's summary,
    and whether the baseline's own failed cells are findings (None: they are not);
    ``noise``: calibrate the baseline comparison's AL threshold per key from the
    key's nights in ``history`` when one is given (:mod:`farm.analysis.noise`; None:
    the fixed rule);
    ``quarantine``: keys whose findings are kept, marked and shown but neither make
    the verdict a regression nor raise alerts (flaky keys, with their flip rate);
    ``require_comparison``: a baseline with which nothing was compared is a finding
    (``nothing_compared``, source ``cells``: the run could not judge; a PR's status
    is then error), not a pass (:func:`farm.analysis.gate.nothing_compared`);
    ``goldens``: the goldens the sweep's variants are held to (:mod:`farm.goldens`:
    each bound to the job models it is for), a miss at a position a ``golden`` finding;
    ``over_run``: look inside each spec-on variant's run for acceptance that collapsed
    (:mod:`farm.analysis.over_run`, a ``collapse_over_run`` finding; None: not looked);
    ``prefix_cache``: judge prefix-cache hit rates, MTP on against its MTP-off twin and
    against the baseline (:mod:`farm.analysis.prefix_cache`, a ``prefix_cache_hits``
    finding; None: not judged);
    ``pooling``: pool the keys compared with the baseline over every conjunction of one
    or two axis values and test each (:mod:`farm.analysis.pooling`, a ``pooled_drop``
    finding; None: not pooled).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: CheckConfig = CheckConfig()
    history: HistoryConfig | None = None
    within: bool = True
    graph_modes: bool = True
    base_of: dict[str, str] = {}
    depth_invariance: bool = False
    baseline_check: str = BASELINE_CHECK
    baseline_sweep: bool = True
    engine_map: dict[str, str] = {}
    candidate_side: str = ""
    baseline_side: str | None = None
    require_comparison: bool = False
    noise: NoiseRule | None = None
    quarantine: dict[str, float] = {}  # key label -> its verdict flip rate
    goldens: tuple[GoldenCheck, ...] = ()
    over_run: CollapseRule | None = None
    prefix_cache: PrefixRule | None = None
    pooling: PoolRule | None = None


@dataclass(frozen=True)
class Judgement:
    """One sweep judged: its findings (every use's), what they came from, the notes.

    ``within``: the within-sweep report (None when not run); ``comparison``: every key
    against the baseline (None without one); ``history``: the change-point analyses
    (empty with fewer than two sweeps of history); ``attribution``: the conjunction of
    axis values that best explains the within-sweep regressions.
    """

    sweep_id: int
    job: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    comparisons: int = 0
    within: CheckReport | None = None
    comparison: SweepComparison | None = None
    baseline_sweep_id: int | None = None
    history: tuple[HistoryAnalysis, ...] = ()
    history_sweeps: int = 0
    series: Mapping[ComparableKey, tuple[HistoryPoint, ...]] | None = None
    attribution: Attribution | None = None
    builds: Mapping[str, str] = field(default_factory=dict)  # engine -> build id
    # (check, key label) of every comparison that ran to a result and every cell that
    # ran ok: where an earlier alert of that check and key can be seen to recover.
    checked: frozenset[tuple[str, str]] = frozenset()

    @property
    def outcome(self) -> VerdictOutcome:
        return outcome_of(self.findings)

    @property
    def regressions(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_regression)

    def verdict(self, kind: VerdictKind, **extra: object) -> SweepVerdict:
        """The stored form of this judgement (``extra``: the PR's or the run's fields)."""
        fields: dict[str, object] = {
            "sweep_id": self.sweep_id,
            "job": self.job,
            "kind": kind,
            "outcome": self.outcome,
            "findings": self.findings,
            "notes": self.notes,
            "comparisons": self.comparisons,
            "baseline_sweep_ids": (
                (self.baseline_sweep_id,) if self.baseline_sweep_id is not None else ()
            ),
            "history": self.history_sweeps,
        }
        return SweepVerdict.model_validate(fields | extra)


def judge(
    sweep: SweepRecord,
    baseline: SweepRecord | None = None,
    history: Mapping[ComparableKey, Sequence[HistoryPoint]] | None = None,
    rules: JudgeRules | None = None,
) -> Judgement:
    """Judge ``sweep``: within itself, against ``baseline`` (None: not compared), and
    over ``history`` (per-key AL series over the job's last N sweeps ending with
    ``sweep``; fewer than two sweeps find nothing), and against the goldens of
    ``rules``. Findings in order: label mismatches, within-sweep, baseline, history,
    golden, pooled, over the run, prefix cache, failed cells (the candidate's, then the
    baseline's). FarmError when ``baseline`` is ``sweep``
    itself (a cell compared with itself finds nothing and would recover every alert)."""
    if baseline is not None:
        _refuse_self_comparison(sweep, baseline)
    r = rules or JudgeRules()
    # A cell that ran as another configuration is a finding, compared as nothing.
    findings: list[Finding] = label_findings(sweep, r.candidate_side)
    notes: list[str] = []
    if baseline is not None:
        notes += [f.summary for f in label_findings(baseline, r.baseline_side or "baseline")]
        baseline = as_labelled(baseline)
    sweep = as_labelled(sweep)
    within = _within(sweep, r)
    comparisons = 0
    if within is not None:
        findings += [_within_finding(v) for v in within.regressions]
        notes += [n.message for n in within.notes]
        comparisons += len(within.verdicts)
    comparison = None
    series = {k: tuple(v) for k, v in (history or {}).items()}
    if baseline is not None:
        comparison = _compare(sweep, baseline, series if history is not None else None, r)
        findings += [
            _baseline_finding(row, baseline.sweep_id, r)
            for row in comparison.rows
            if row.outcome == "regress"
        ]
        notes += _baseline_notes(comparison, baseline.sweep_id, r)
        comparisons += len(comparison.rows)
    history_sweeps = len({p.sweep_id for points in series.values() for p in points})
    analyses = analyze_histories(series, config=r.history) if history_sweeps > 1 else ()
    findings += _history_findings(analyses, sweep)
    goldens = check_goldens(sweep, r.goldens, r.check) if r.goldens else None
    if goldens is not None:
        findings += goldens.findings
        notes += goldens.notes
        comparisons += goldens.held
    extra = _parts(sweep, baseline, comparison, r)
    findings += extra.findings
    notes += extra.notes
    findings += _failed_cell_findings(sweep.cells, r.candidate_side)
    if baseline is not None and r.baseline_side is not None:
        findings += _failed_cell_findings(baseline.cells, r.baseline_side)
    if r.quarantine:
        findings, held = _quarantine(findings, r.quarantine)
        notes += held
    findings += _nothing_compared(comparison, r)
    return Judgement(
        sweep_id=sweep.sweep_id,
        job=sweep.job,
        builds={b.engine: b.build_id for b in sweep.builds},
        checked=_checked(sweep, within, comparison, r)
        | (goldens.checked if goldens is not None else frozenset())
        | extra.checked,
        findings=tuple(findings),
        notes=tuple(dict.fromkeys(notes)),
        comparisons=comparisons,
        within=within,
        comparison=comparison,
        baseline_sweep_id=baseline.sweep_id if baseline is not None else None,
        history=analyses,
        history_sweeps=history_sweeps,
        series=series if history is not None else None,
        attribution=attribute(labels_from_report(within))
        if within and within.regressions
        else None,
    )


def _within(sweep: SweepRecord, r: JudgeRules) -> CheckReport | None:
    """The within-sweep checks the rules ask for (None: not run)."""
    if not r.within:
        return None
    return check_sweep(
        sweep, r.base_of, r.check, graph_modes=r.graph_modes, depth_invariance=r.depth_invariance
    )


def _nothing_compared(comparison: SweepComparison | None, r: JudgeRules) -> list[Finding]:
    """No variant compared is no pass where the rules require a comparison: the run
    could not judge, and a gate must not pass by accident."""
    nothing = nothing_compared(comparison) if comparison is not None else None
    if not r.require_comparison or nothing is None:
        return []
    return [Finding(source="cells", check=NOTHING_COMPARED, cells=(), summary=nothing)]


@dataclass(frozen=True)
class _Part:
    """What one of the checks inside a run found (empty when its rule is off)."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    checked: frozenset[tuple[str, str]] = frozenset()


def _parts(
    sweep: SweepRecord,
    baseline: SweepRecord | None,
    comparison: SweepComparison | None,
    r: JudgeRules,
) -> _Part:
    """The baseline comparison pooled, then the two checks inside a run, as one part."""
    parts = (
        _pooled(comparison, r),
        _over_run(sweep, baseline, r),
        _prefix_cache(sweep, baseline, r),
    )
    return _Part(
        tuple(f for p in parts for f in p.findings),
        tuple(n for p in parts for n in p.notes),
        frozenset().union(*(p.checked for p in parts)),
    )


def _pooled(comparison: SweepComparison | None, r: JudgeRules) -> _Part:
    """The compared keys pooled over conjunctions of axis values; quarantined keys
    are pooled with nothing (their figures are not believed)."""
    if r.pooling is None or comparison is None:
        return _Part()
    pooled = check_pooled(
        comparison,
        r.pooling,
        cell_check=r.baseline_check,
        baseline_sweep_id=comparison.baseline_id if r.baseline_sweep else None,
        leave_out=r.quarantine.keys(),
    )
    return _Part(pooled.findings, pooled.notes, pooled.checked)


def _over_run(sweep: SweepRecord, baseline: SweepRecord | None, r: JudgeRules) -> _Part:
    """Acceptance collapsing inside a cell's run; a PR is judged by what it changed, so a
    collapse its base shows too is a note."""
    if r.over_run is None:
        return _Part()
    over = check_over_run(sweep, r.over_run, r.check)
    collapses = list(over.findings)
    notes = list(over.notes)
    if baseline is not None and not r.baseline_sweep:
        base_over = check_over_run(baseline, r.over_run, r.check)
        shared = {f.label for f in base_over.findings}
        kept = [f for f in collapses if _base_label(f, r.engine_map) not in shared]
        notes[:0] = [
            f"{f.summary} (the base collapses too: not the PR's)"
            for f in collapses
            if f not in kept
        ]
        collapses = kept
    return _Part(tuple(collapses), tuple(notes), frozenset(over.checked))


def _prefix_cache(sweep: SweepRecord, baseline: SweepRecord | None, r: JudgeRules) -> _Part:
    """Prefix-cache hit rates: MTP on against its MTP-off twin, and against the baseline."""
    if r.prefix_cache is None:
        return _Part()
    words = (
        f"sweep {baseline.sweep_id} (last good night)"
        if baseline is not None and r.baseline_sweep
        else "the base"
    )
    prefix = check_prefix_cache(
        sweep, r.prefix_cache, baseline, engine_map=r.engine_map, baseline_words=words
    )
    return _Part(tuple(prefix.findings), tuple(prefix.notes), frozenset(prefix.checked))


def _base_label(f: Finding, engine_map: Mapping[str, str]) -> str:
    """The label ``f``'s key has on the base's side (its engine renamed by
    ``engine_map``)."""
    if f.key is None:
        return f.label
    key = f.key.model_copy(update={"engine": engine_map.get(f.key.engine, f.key.engine)})
    return key.label


def _refuse_self_comparison(sweep: SweepRecord, baseline: SweepRecord) -> None:
    """A PR's baseline shares its sweep's id and holds other cells (the base engine's):
    only the same cells of the same sweep on both sides are a self-comparison."""
    if baseline.sweep_id != sweep.sweep_id:
        return
    shared = {c.cell.cell_id for c in sweep.cells} & {c.cell.cell_id for c in baseline.cells}
    if shared:
        raise FarmError(
            f"sweep {sweep.sweep_id} cannot be judged against itself ({len(shared)} cell(s) on "
            "both sides): name an earlier sweep as the baseline"
        )


def _compare(
    sweep: SweepRecord,
    baseline: SweepRecord,
    series: Mapping[ComparableKey, Sequence[HistoryPoint]] | None,
    r: JudgeRules,
) -> SweepComparison:
    """``sweep`` against ``baseline``, each key's AL rule calibrated from ``series``.
    Calibration reads the history: without one (a PR, `farm compare`, `alerts check`
    without --history) the fixed rule holds, as it did before calibration existed."""
    noise_rule = r.noise if series is not None else None
    return compare_sweeps(
        baseline,
        sweep,
        config=r.check,
        engine_map=r.engine_map,
        noise=key_noise(series, sweep.sweep_id, baseline.sweep_id, noise_rule)
        if series is not None and noise_rule
        else None,
        noise_rule=noise_rule,
    )


def judge_within(sweep: SweepRecord) -> CheckReport:
    """The within-sweep part of ``sweep``'s judgement as every report shows it: each
    patched engine against its base build (:func:`farm.analysis.summary.patched_bases`)."""
    within = judge(sweep, None, None, JudgeRules(base_of=patched_bases(sweep.builds))).within
    assert within is not None  # JudgeRules.within defaults to True
    return within


def _quarantine(
    findings: list[Finding], flaky: Mapping[str, float]
) -> tuple[list[Finding], list[str]]:
    """``findings`` with those of flaky keys marked, and a note per such key."""
    out, notes = [], []
    for f in findings:
        label = f.key.label if f.key is not None else ""
        if label in flaky and f.source != "cells":
            f = f.model_copy(update={"quarantined": True})
            notes.append(
                f"quarantined: {label} (verdict flip rate {flaky[label]:.0%}): "
                f"{f.check} measured, not alerted"
            )
        out.append(f)
    return out, notes


def _checked(
    sweep: SweepRecord,
    within: CheckReport | None,
    comparison: SweepComparison | None,
    rules: JudgeRules,
) -> frozenset[tuple[str, str]]:
    pairs: set[tuple[str, str]] = {
        (v.check, v.candidate.key.label) for v in (within.verdicts if within else ())
    }
    for row in comparison.rows if comparison is not None else ():
        if row.outcome in ("pass", "regress", "improve"):
            pairs.add((rules.baseline_check, row.key.label))
    for stored in sweep.cells:
        if stored.result is not None and stored.result.status == "ok":
            pairs.add(("cell_failed", stored.cell.key.label))
    return frozenset(pairs)


def _relative(v: Verdict) -> float | None:
    ref = v.reference_value.estimate
    return v.difference.estimate / ref if ref else None


def _interval(i: Interval) -> FigureInterval:
    return FigureInterval.of(i.estimate, i.low, i.high, i.level)


def _within_finding(v: Verdict) -> Finding:
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
        summary=v.describe(),
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


def _baseline_finding(row: ComparedVariant, baseline_id: int, r: JudgeRules) -> Finding:
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


def _baseline_notes(comparison: SweepComparison, baseline_id: int, r: JudgeRules) -> list[str]:
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


def _history_findings(analyses: Sequence[HistoryAnalysis], sweep: SweepRecord) -> list[Finding]:
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
                    cells=_cells_of(sweep, key),
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


def _cells_of(sweep: SweepRecord, key: ComparableKey) -> tuple[str, ...]:
    """The cells of ``sweep`` that measured ``key`` (a history series names a key)."""
    return tuple(
        stored.cell.cell_id
        for stored in sweep.cells
        if any(stored.cell.variant_key(v.axes) == key for v in stored.cell.variants)
    )


def _failed_cell_findings(cells: Iterable[StoredCell], side: str) -> list[Finding]:
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

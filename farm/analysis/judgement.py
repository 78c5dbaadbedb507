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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from farm.analysis.attribution import Attribution, attribute, labels_from_report
from farm.analysis.check_rules import CheckReport
from farm.analysis.checks import check_sweep
from farm.analysis.compare import SweepComparison, compare_sweeps
from farm.analysis.gate import nothing_compared
from farm.analysis.golden_check import GOLDEN_CHECK, check_goldens
from farm.analysis.history import HistoryAnalysis, HistoryPoint, analyze_histories
from farm.analysis.judge_rules import (
    BASELINE_CHECK,
    CHANGE_POINT_RECENT,
    NOTHING_COMPARED,
    PR_CHECK,
    JudgeRules,
)
from farm.analysis.judged_findings import (
    baseline_findings,
    baseline_notes,
    failed_cell_findings,
    history_findings,
    position_text,
    within_findings,
)
from farm.analysis.labels import as_labelled, label_findings
from farm.analysis.noise import key_noise
from farm.analysis.over_run import COLLAPSE_CHECK, check_over_run
from farm.analysis.pooling import POOLED_CHECK, check_pooled
from farm.analysis.prefix_cache import PREFIX_CHECK, check_prefix_cache
from farm.analysis.summary import patched_bases
from farm.analysis.sustained import sustained_drops, sustained_findings, sustained_notes
from farm.comparable import ComparableKey
from farm.errors import FarmError
from farm.records import SweepRecord
from farm.results.verdict import (
    Finding,
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
        findings += within_findings(within.verdicts)
        notes += [n.message for n in within.notes]
        comparisons += len(within.verdicts)
    comparison = None
    series = {k: tuple(v) for k, v in (history or {}).items()}
    if baseline is not None:
        comparison = _compare(sweep, baseline, series if history is not None else None, r)
        findings += baseline_findings(comparison, baseline.sweep_id, r)
        notes += baseline_notes(comparison, baseline.sweep_id, r)
        comparisons += len(comparison.rows)
    history_sweeps = len({p.sweep_id for points in series.values() for p in points})
    analyses = analyze_histories(series, config=r.history) if history_sweeps > 1 else ()
    over_history = _history_part(series, analyses, sweep, r)
    findings += over_history.findings
    notes += over_history.notes
    goldens = check_goldens(sweep, r.goldens, r.check) if r.goldens else None
    if goldens is not None:
        findings += goldens.findings
        notes += goldens.notes
        comparisons += goldens.held
    extra = _parts(sweep, baseline, comparison, r)
    findings += extra.findings
    notes += extra.notes
    findings += failed_cell_findings(sweep.cells, r.candidate_side)
    if baseline is not None and r.baseline_side is not None:
        findings += failed_cell_findings(baseline.cells, r.baseline_side)
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


def _history_part(
    series: Mapping[ComparableKey, Sequence[HistoryPoint]],
    analyses: Sequence[HistoryAnalysis],
    sweep: SweepRecord,
    r: JudgeRules,
) -> _Part:
    """The change points and sustained drops in the keys' history."""
    sustained, noisy = _sustained(series, sweep, r)
    # A key the sustained-drop check tested has run-to-run spread: its change points
    # are judged by that check, which knows the spread; e-divisive does not.
    changes = [a for a in analyses if a.key not in noisy]
    return _Part(
        findings=(*history_findings(changes, sweep), *sustained.findings),
        notes=tuple(sustained.notes),
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


def _sustained(
    series: Mapping[ComparableKey, Sequence[HistoryPoint]], sweep: SweepRecord, r: JudgeRules
) -> tuple[_Part, frozenset[ComparableKey | None]]:
    """Sustained drops over each key's nights (:mod:`farm.analysis.sustained`), and the
    keys it tested (those with night-to-night spread and history enough). No key is
    marked checked: a step that leaves the window has not recovered."""
    if r.sustained is None:
        return _Part(), frozenset()
    results = sustained_drops(series, r.sustained)
    tested = frozenset(a.key for a in results if a.status == "checked")
    part = _Part(tuple(sustained_findings(results, sweep)), tuple(sustained_notes(results)))
    return part, tested


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
    """``sweep`` against ``baseline``, each key's AL rule calibrated from ``series``,
    else from the rules' ``calibration`` (a PR's, read from the job's nights before
    it ran). Without either (`farm compare`, `alerts check` without --history) the
    fixed rule holds, as it did before calibration existed."""
    noise_rule = r.noise if series is not None or r.calibration else None
    noise = None
    if noise_rule is not None:
        noise = (
            key_noise(series, sweep.sweep_id, baseline.sweep_id, noise_rule)
            if series is not None
            else r.calibration
        )
    return compare_sweeps(
        baseline,
        sweep,
        config=r.check,
        engine_map=r.engine_map,
        noise=noise,
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

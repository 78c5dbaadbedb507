"""Two sweeps compared cell key by cell key: what a PR's build did to acceptance. Pure.

Every spec-on variant of the candidate is paired with the variant of the baseline
that has the same :class:`farm.comparable.ComparableKey`, and judged by
:func:`farm.analysis.check_rules.classify_difference`, the rule of the within-sweep
checks. Each row carries the AL and the full per-position difference of that one
paired comparison: nothing downstream compares the pair again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from farm.analysis.check_rules import CheckConfig, classify_difference
from farm.analysis.confirm import Confirmation, decide, rerun_sides, suspicious
from farm.analysis.noise import KeyNoise, NoiseRule, Threshold, calibrated
from farm.analysis.stats import AcceptanceDifference, AcceptanceSample, Interval, compare_acceptance
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.records import (
    ConfirmationRun,
    SequentialRecord,
    StoredCell,
    SweepRecord,
    VariantResult,
    counters_digest,
)
from farm.results.verdict import PositionChange

__all__ = ["ComparedVariant", "SweepComparison", "VariantOutcome", "compare_sweeps"]

VariantOutcome = Literal["pass", "regress", "improve", "failed", "unmatched", "no_data"]


class ComparedVariant(Frozen):
    """One cell key in both sweeps: AL of each and candidate - baseline, judged.

    ``label``: the candidate's variant label (the baseline's when only it has the key);
    ``cell_id``: the candidate's cell; ``positions``: acceptance per draft position,
    baseline vs candidate, from the same paired bootstrap as the AL.
    """

    key: ComparableKey
    label: str
    outcome: VariantOutcome
    baseline_label: str | None = None
    cell_id: str | None = None
    baseline_al: Interval | None = None
    candidate_al: Interval | None = None
    difference: Interval | None = None
    relative: float | None = None
    min_effect: float | None = None
    paired: bool = False
    pairs: int = 0
    note: str | None = None
    threshold: Threshold | None = None  # where min_effect came from, under a noise rule
    positions: tuple[PositionChange, ...] = ()
    # The candidate ran in looks against this baseline and a look decided early:
    # "regress: decided after 32 of 96 prompts (look 2 of 6)".
    decided: str | None = None
    # A suspicious first run rerun beside the reference build in its night, and what
    # the runs decided (the outcome is theirs): farm.analysis.confirm.
    confirmation: Confirmation | None = None

    @property
    def suspicious(self) -> bool:
        """Whether its first run asks for confirmation in the night
        (:func:`farm.analysis.confirm.suspicious`), the drop read against the
        re-centred reference."""
        threshold, diff = self.threshold, self.difference
        level = threshold.centre if threshold is not None else None
        level = level or (self.baseline_al.estimate if self.baseline_al is not None else None)
        if threshold is None or diff is None or not level:
            return False
        return suspicious(
            self.outcome,
            diff.estimate / level,
            threshold.calibrated,
            threshold.run_sd,
            threshold.floor / level,
        )


class SweepComparison(Frozen):
    """Every cell key of two sweeps, with what happened to its AL."""

    baseline_id: int
    candidate_id: int
    baseline_job: str
    candidate_job: str
    level: float
    rows: tuple[ComparedVariant, ...]

    def count(self, outcome: VariantOutcome) -> int:
        """How many rows have ``outcome``."""
        return sum(r.outcome == outcome for r in self.rows)


@dataclass(frozen=True)
class _Unit:
    label: str
    stored: StoredCell
    variant: VariantResult | None

    def problem(self) -> str | None:
        result = self.stored.result
        if result is None:
            return "not run"
        if result.status != "ok" or self.variant is None:
            return result.status if result.status != "ok" else "variant missing"
        return None


def _units(sweep: SweepRecord, engine_map: Mapping[str, str]) -> dict[ComparableKey, _Unit]:
    out: dict[ComparableKey, _Unit] = {}
    for stored in sweep.cells:
        c = stored.cell
        if not c.speculative:
            continue
        ran = {tuple(v.axes.items()): v for v in (stored.result.variants if stored.result else ())}
        for planned in c.variants:
            key = c.variant_key(planned.axes)
            key = key.model_copy(update={"engine": engine_map.get(key.engine, key.engine)})
            out[key] = _Unit(
                label=c.variant_label(planned.axes),
                stored=stored,
                variant=ran.get(tuple(planned.axes.items())),
            )
    return out


def compare_sweeps(
    baseline: SweepRecord,
    candidate: SweepRecord,
    *,
    config: CheckConfig | None = None,
    engine_map: Mapping[str, str] | None = None,
    noise: Mapping[ComparableKey, KeyNoise] | None = None,
    noise_rule: NoiseRule | None = None,
) -> SweepComparison:
    """Compare the AL of every spec-on variant of ``candidate`` with the same cell key
    in ``baseline`` (request-level bootstrap, paired on shared prompts).

    ``regress``: the interval of candidate - baseline is below 0 and the drop reaches
    ``config.min_al_effect`` (the rule of the within-sweep checks); ``improve``: the
    mirror image; ``pass`` otherwise. ``engine_map`` renames candidate engines to
    baseline engines (a PR build named apart from the nightly line). Variants present
    on one side only are ``unmatched``; failed ones ``failed``. With ``noise_rule``,
    each key's run-to-run ``noise`` (its nights before ``candidate``) widens the
    interval and calibrates the minimum effect (:func:`farm.analysis.noise.calibrated`;
    a key with too little history keeps the floor and says so).
    """
    cfg = config or CheckConfig()
    base_units = _units(baseline, {})
    cand_units = _units(candidate, engine_map or {})
    reruns: dict[str, list[ConfirmationRun]] = {}
    for run in candidate.confirmations:
        reruns.setdefault(run.cell_id, []).append(run)
    rows: list[ComparedVariant] = []
    for key in sorted(base_units.keys() | cand_units.keys(), key=str):
        b, c = base_units.get(key), cand_units.get(key)
        if b is None or c is None:
            only = c if c is not None else b
            assert only is not None
            side = "candidate" if c is not None else "baseline"
            rows.append(
                ComparedVariant(
                    key=key, label=only.label, outcome="unmatched", note=f"only in {side}"
                )
            )
            continue
        calibration = None if noise_rule is None else ((noise or {}).get(key), noise_rule)
        row = _compare_one(key, b, c, cfg, calibration)
        if calibration is not None and row.threshold is not None:
            row = _confirmed(row, c, reruns.get(row.cell_id or "", ()), calibration)
        rows.append(row)
    return SweepComparison(
        baseline_id=baseline.sweep_id,
        candidate_id=candidate.sweep_id,
        baseline_job=baseline.job,
        candidate_job=candidate.job,
        level=cfg.level,
        rows=tuple(rows),
    )


def _compare_one(
    key: ComparableKey,
    b: _Unit,
    c: _Unit,
    cfg: CheckConfig,
    calibration: tuple[KeyNoise | None, NoiseRule] | None = None,
) -> ComparedVariant:
    sides = {"baseline_label": b.label, "cell_id": c.stored.cell.cell_id}
    for side, unit in (("baseline", b), ("candidate", c)):
        problem = unit.problem()
        if problem is not None:
            return ComparedVariant(
                key=key, label=c.label, outcome="failed", note=f"{side} {problem}", **sides
            )
    assert b.variant is not None and c.variant is not None
    ref = AcceptanceSample.from_requests(b.variant.requests)
    cand = AcceptanceSample.from_requests(c.variant.requests)
    if len(ref) == 0 or len(cand) == 0 or ref.drafts.sum() <= 0 or cand.drafts.sum() <= 0:
        return ComparedVariant(
            key=key,
            label=c.label,
            outcome="no_data",
            note="no per-request speculative counters",
            **sides,
        )
    # A variant run in looks stopped at a look: its prompts are the first of the
    # baseline's, paired as the looks paired them.
    d = compare_acceptance(
        ref,
        cand,
        rng=cfg.rng(key.label),
        paired=True if c.variant.sequential is not None else None,
        resamples=cfg.resamples,
        level=cfg.level,
    )
    diff = d.mean_acceptance_length
    min_effect = cfg.min_al_effect(d.reference_al.estimate)
    threshold = None
    if calibration is not None:
        diff, rule = calibrated(
            diff, min_effect, *calibration, reference_al=d.reference_al.estimate
        )
        min_effect, threshold = rule.min_effect, rule
    outcome: VariantOutcome = "pass"
    looks = _early_decision(c.variant, b.variant, threshold)
    if looks is not None:
        outcome = "regress" if looks.decision == "regress" else "pass"
    elif classify_difference(diff, min_effect, "lower")[1]:
        outcome = "regress"
    elif classify_difference(diff, min_effect, "higher")[1]:
        outcome = "improve"
    return ComparedVariant(
        key=key,
        label=c.label,
        outcome=outcome,
        baseline_al=d.reference_al,
        candidate_al=d.candidate_al,
        difference=diff,
        relative=d.relative.estimate,
        min_effect=min_effect,
        threshold=threshold,
        paired=d.paired,
        pairs=d.pairs,
        positions=_positions(d, cfg),
        decided=looks.describe() if looks is not None else None,
        **sides,
    )


def _confirmed(
    row: ComparedVariant,
    c: _Unit,
    reruns: Sequence[ConfirmationRun],
    calibration: tuple[KeyNoise | None, NoiseRule],
) -> ComparedVariant:
    """``row`` decided by its cell's reruns in the night, when there are some on both
    sides: the candidate build's reruns against the reference build's, with the key's
    night-to-night spread (:func:`decide`; the first run only chose the cell)."""
    noise, rule = calibration
    threshold = row.threshold
    if noise is None or threshold is None or c.variant is None or not reruns:
        return row
    if not row.suspicious:
        return row  # its reruns were made for another variant of the cell
    candidate, reference = rerun_sides(reruns, c.variant.axes)
    if not candidate or not reference:
        return row
    confirmation = decide(
        candidate,
        reference,
        history_sd=noise.al_sd,
        history_nights=noise.nights,
        floor=threshold.floor,
        level=rule.confirm.level,
    )
    return row.model_copy(update={"outcome": confirmation.outcome, "confirmation": confirmation})


def _early_decision(
    candidate: VariantResult, baseline: VariantResult, threshold: Threshold | None
) -> SequentialRecord | None:
    """The candidate's sequential record when it stopped early against this very
    baseline run (the same per-request counters): its decision is the verdict (the
    sequential rule's error rates are those of the fixed rule it was designed from;
    the prompts it skipped cannot be judged). Where a noise rule calibrated the key's
    threshold, only when the looks ran under that very rule (``Threshold.matches``);
    else the fixed rule judges the prompts that ran."""
    record = candidate.sequential
    if record is None or not record.stopped_early:
        return None
    calibrated = threshold is not None and threshold.calibrated
    if (calibrated or record.calibration is not None) and not (
        threshold is not None and threshold.matches(record.calibration)
    ):
        return None
    return record if record.reference_digest == counters_digest(baseline.requests) else None


def _positions(d: AcceptanceDifference, cfg: CheckConfig) -> tuple[PositionChange, ...]:
    """Acceptance per draft position, candidate against baseline; ``fell`` by the
    minimum per-position effect of ``cfg``."""
    return tuple(
        PositionChange(
            position=i,
            baseline=d.reference_per_position[i].estimate,
            candidate=d.candidate_per_position[i].estimate,
            difference=diff.estimate,
            low=diff.low,
            high=diff.high,
            fell=classify_difference(diff, cfg.min_position_diff, "lower")[1],
        )
        for i, diff in enumerate(d.per_position)
    )

"""Sequential AL comparisons: decide regress / pass / continue after each look of prompts.

Method: a group-sequential test with Lan-DeMets error spending (Lan & DeMets 1983,
Biometrika 70:659) of O'Brien-Fleming type, one spending function for each way of
stopping (Pampallona & Tsiatis 1994, J. Stat. Plan. Inference 42:19; Jennison &
Turnbull 2000, *Group Sequential Methods*, ch. 7), on the paired per-prompt difference
in mean acceptance length AL = 1 + accepted/drafts. AL is a ratio of sums, so each
prompt enters through its linearisation (delta method, the ratio estimator's influence
``(a_i - r d_i) / mean(d)``); the paired per-prompt differences of those give the
standard error, the same pairing the bootstrap of :mod:`farm.analysis.stats` uses.
Boundaries are found by recursive numerical integration of the joint law of the look
statistics (Armitage, McPherson & Rowe 1969; Jennison & Turnbull ch. 19).

Why this and not a confidence sequence: looks come at planned counts (every
``look_every`` prompts up to ``max_prompts``), and a group-sequential design pays only
for those looks, while an anytime-valid confidence sequence (Howard et al. 2021, Ann.
Stat. 49:1055) pays for looking after every prompt and is wider at every planned look.
Only a design with a fixed last look also reduces to the fixed-sample rule there.

The design is matched to the fixed rule of :mod:`farm.analysis.check_rules` at
``max_prompts``, in three parts (``drop`` is reference minus candidate AL, worse > 0):

* Last look: exactly the fixed rule (:func:`classify_difference`: significant at the
  check level and a drop of at least the minimum effect ``m``).
* Regress early: spend the fixed rule's own false-alarm probability at no drop,
  ``alpha_F = P(drop_N >= max(m, z se_N))``, with the O'Brien-Fleming-type function
  ``alpha(t) = 2 - 2 Phi(z_{alpha_F/2} / sqrt(t))``; a stop also needs ``drop >= m``.
  O'Brien-Fleming spends almost nothing early: a regress stop means the drop summed so
  far already about reaches what the last look needs, so false alarms barely grow.
  Where the fixed rule's false-alarm rate is tiny (the minimum effect, not the
  significance, decides it) that is close to curtailment and stops late at drops just
  above ``m``; ``regress_spending="oc"`` spends ``1 - power`` at ``theta_0 = max(m, z
  se_N) - z_power se_N`` instead (see :class:`SequentialDesign`).
* Pass early: spend the fixed rule's type II error ``1 - power`` at the drop it detects
  with that power (its minimum detectable drop ``theta_1 = max(m, z se_N) + z_power
  se_N``), same function shape. A pass means the repeated confidence bound of the drop
  lies below ``theta_1``: the change is bounded inside the minimum effect plus the
  fixed rule's own resolution (``m`` alone: the fixed rule passes half of the cells
  that drop by exactly ``m``).

Both boundaries are non-binding and computed apart (each ignores the other), which
keeps the error of each kind of early stop at most its spend. The last look is the
fixed rule whatever came before, so the overall rates differ from the fixed rule's by
what the early stops change: early passes remove false alarms and some power, early
regress stops add both. bench/sequential.py measures the net (10,000 replicates per
drop). Only a drop is a regression of AL, so the pass bound is one-sided.

The unknown per-prompt spread enters by plug-in:
``se_N = s_k / sqrt(max_prompts)`` with the spread ``s_k`` estimated at look ``k``
(Jennison & Turnbull ch. 14). The interim looks use the normal (delta-method) interval;
the last look uses the fixed rule's bootstrap interval unless the design says normal.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from farm.analysis.check_rules import CheckConfig, classify_difference
from farm.analysis.noise import recentred
from farm.analysis.stats import AcceptanceSample, Interval, compare_acceptance
from farm.frozen import Frozen
from farm.records import (
    Decision,
    LookCalibration,
    LookDecision,
    LookStatistics,
    SequentialRecord,
)

__all__ = [
    "RULE_NAME",
    "Decision",
    "LookDecision",
    "LookStatistics",
    "SequentialDesign",
    "SequentialRecord",
    "decide_drops",
    "decide_look",
    "look_statistics",
    "obrien_fleming_spend",
    "paired_al_statistics",
    "run_sequential",
    "sequential_record",
    "spending_boundaries",
]

RULE_NAME = "group-sequential OBF-type alpha/beta spending (Lan-DeMets), paired AL"
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# Codes of the vectorised core, in the order of Decision.
CONTINUE, REGRESS, PASS = 0, 1, 2
_CODE: dict[int, Decision] = {CONTINUE: "continue", REGRESS: "regress", PASS: "pass"}
_N = NormalDist()
# Integration grid on the z scale: 0.05 keeps the trapezoid error of a tail mass near
# 1e-4 of itself; beyond 12 the tail (< 1e-32) is no stopping at all.
_GRID = np.arange(-8.0, 12.0 + 1e-9, 0.05)
_NO_STOP = 1e6  # a boundary no statistic reaches (finite so it interpolates)
# The regress boundary depends on alpha_F, i.e. on the fixed rule's z at max prompts:
# tabulated over that z and interpolated, so the scalar and the vectorised paths agree.
_ZF_TABLE = np.arange(1.5, 9.0 + 1e-9, 0.02)


class SequentialDesign(Frozen):
    """Looks every ``look_every`` prompts up to ``max_prompts``; thresholds of ``check``.

    ``power`` is the fixed rule's power at the drop the pass boundary is built on (0.8,
    the usual design power). ``final`` picks the interval of the last look: the fixed
    rule's request-level bootstrap, or the normal (delta-method) one for simulations.
    ``regress_spending``: ``no_drop`` spends the fixed rule's false-alarm probability
    at no drop (false alarms cannot grow by more than the spend's overlap); ``oc``
    spends ``1 - power`` at the drop the fixed rule flags with probability
    ``1 - power``, mirroring the pass side so that the rule follows the fixed rule's
    operating characteristic at two points around the minimum effect (Whitehead 1997,
    *The Design and Analysis of Sequential Clinical Trials*, ch. 4): earlier regress
    stops, at the price of false alarms at no drop.
    """

    look_every: int = Field(default=16, ge=1)
    max_prompts: int = Field(default=200, ge=1)
    power: float = Field(default=0.8, gt=0.5, lt=1.0)
    regress_spending: Literal["no_drop", "oc"] = "no_drop"
    final: Literal["bootstrap", "normal"] = "bootstrap"
    check: CheckConfig = CheckConfig()

    @model_validator(mode="after")
    def _looks_fit(self) -> SequentialDesign:
        if self.look_every > self.max_prompts:
            raise ValueError(
                f"look_every ({self.look_every}) exceeds max_prompts ({self.max_prompts}): "
                "lower look_every or raise max"
            )
        return self

    @property
    def looks(self) -> tuple[int, ...]:
        """Prompt counts at which the rule looks; the last is ``max_prompts``."""
        return (*range(self.look_every, self.max_prompts, self.look_every), self.max_prompts)

    @property
    def fractions(self) -> tuple[float, ...]:
        """Information fractions of the looks (prompts over ``max_prompts``)."""
        return tuple(n / self.max_prompts for n in self.looks)

    @property
    def z_level(self) -> float:
        """Two-sided normal quantile of the check level (1.96 at 0.95)."""
        return _N.inv_cdf(0.5 + self.check.level / 2)

    def parameters(self) -> dict[str, float | int | str]:
        """The design's parameters, flat, for the stored decision record."""
        return {
            "look_every": self.look_every,
            "max_prompts": self.max_prompts,
            "power": self.power,
            "regress_spending": self.regress_spending,
            "final": self.final,
            "level": self.check.level,
            "min_al_relative": self.check.min_al_relative,
            "min_al_absolute": self.check.min_al_absolute,
            "spending": "obrien-fleming (lan-demets)",
        }


def _sf(x: FloatArray) -> FloatArray:
    """Normal upper tail 1 - Phi(x), elementwise (numpy has no erfc)."""
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return np.asarray(0.5 * erfc(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


def obrien_fleming_spend(t: float, total: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: error spent by information ``t``.

    ``2 - 2 Phi(z_{total/2} / sqrt(t))``; 0 at t = 0, ``total`` at t = 1.
    """
    if t <= 0.0 or total <= 0.0:
        return 0.0
    z = -_N.inv_cdf(min(total, 1.0) / 2.0)  # upper quantile, exact for tiny totals
    return float(2.0 * _sf(np.array([z / math.sqrt(min(t, 1.0))]))[0])


@lru_cache(maxsize=64)
def _kernels(fractions: tuple[float, ...]) -> tuple[FloatArray, ...]:
    """Transition densities of Z_k given Z_{k-1} on the grid, times the grid step."""
    out = []
    h = float(_GRID[1] - _GRID[0])
    for prev, cur in itertools.pairwise(fractions):
        gap = cur - prev
        x = (_GRID[None, :] * math.sqrt(cur) - _GRID[:, None] * math.sqrt(prev)) / math.sqrt(gap)
        out.append(np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * math.sqrt(cur / gap) * h)
    return tuple(out)


def _upper_tail(density: FloatArray) -> FloatArray:
    """Mass above each grid point (trapezoid rule from the top)."""
    h = float(_GRID[1] - _GRID[0])
    mid = 0.5 * (density[1:] + density[:-1]) * h
    return np.concatenate([np.cumsum(mid[::-1])[::-1], [0.0]])


def spending_boundaries(fractions: tuple[float, ...], spend: tuple[float, ...]) -> FloatArray:
    """One-sided upper z boundaries whose crossing probabilities, for a zero-drift
    standardised statistic at information ``fractions``, are the increments ``spend``.

    ``spend[k]`` is the probability of first crossing at look ``k``. A spend too small
    for the grid (< 1e-30) gives a boundary no statistic reaches (1e6).
    """
    if len(fractions) != len(spend):
        raise ValueError("fractions and spend differ in length")
    if any(b <= a for a, b in itertools.pairwise(fractions)) or fractions[0] <= 0:
        raise ValueError(f"fractions must increase from above 0, got {fractions}")
    kernels = _kernels(tuple(fractions))
    density = np.exp(-0.5 * _GRID * _GRID) / math.sqrt(2 * math.pi)
    bounds = np.empty(len(fractions))
    for k, pi in enumerate(spend):
        tail = _upper_tail(density)
        if pi <= 1e-30 or pi < tail[-2]:
            bounds[k] = _NO_STOP
        elif pi >= tail[0]:
            bounds[k] = float(_GRID[0])
        else:
            # log-tail falls monotonically in z: interpolate on the reversed arrays.
            logs = np.log(np.maximum(tail[:-1], 1e-300))
            bounds[k] = float(np.interp(math.log(pi), logs[::-1], _GRID[:-1][::-1]))
        if k + 1 < len(fractions):
            density = (density * (bounds[k] > _GRID)) @ kernels[k]
    return bounds


def _increments(fractions: tuple[float, ...], total: float) -> tuple[float, ...]:
    cumulative = [obrien_fleming_spend(t, total) for t in fractions]
    return tuple(b - a for a, b in zip([0.0, *cumulative], cumulative, strict=False))


@lru_cache(maxsize=64)
def _regress_table(fractions: tuple[float, ...]) -> FloatArray:
    """(z_F x interim look) regress boundaries, alpha_F = 1 - Phi(z_F)."""
    rows = [
        spending_boundaries(fractions, _increments(fractions, float(_sf(np.array([z]))[0])))
        for z in _ZF_TABLE
    ]
    return np.array(rows)


@lru_cache(maxsize=64)
def _pass_bounds(fractions: tuple[float, ...], beta: float) -> FloatArray:
    return spending_boundaries(fractions, _increments(fractions, beta))


def _drop_bounds(
    design: SequentialDesign, look: int, se: FloatArray, spread: FloatArray, m: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """(regress when drop >= first, pass when drop <= second) at look ``look``.

    At the last look both are the fixed rule's critical drop ``max(m, z se)``.
    """
    z = design.z_level
    if look == len(design.looks) - 1:
        cut = np.maximum(m, z * se)
        return cut, cut
    se_n = spread / math.sqrt(design.max_prompts)
    crit = np.maximum(m, z * se_n)
    z_power = _N.inv_cdf(design.power)
    interim = design.fractions[:-1]
    a = _pass_bounds(interim, 1.0 - design.power)[look]
    if design.regress_spending == "no_drop":
        z_f = np.divide(crit, se_n, out=np.full_like(crit, _ZF_TABLE[-1]), where=se_n > 0)
        b = np.interp(
            np.clip(z_f, _ZF_TABLE[0], _ZF_TABLE[-1]), _ZF_TABLE, _regress_table(interim)[:, look]
        )
        regress_at = np.maximum(b * se, m)
    else:
        # Mirror of the pass side: the same spend at the drop the fixed rule flags with
        # probability 1 - power, so both errors are spent where the fixed rule has them.
        regress_at = np.maximum(crit - z_power * se_n + a * se, m)
    return regress_at, crit + z_power * se_n - a * se


def decide_drops(
    design: SequentialDesign,
    look: int,
    drop: FloatArray,
    se: FloatArray,
    spread: FloatArray,
    min_effect: FloatArray,
) -> IntArray:
    """The vectorised rule: decision codes (0 continue, 1 regress, 2 pass) per row.

    ``drop`` is reference minus candidate AL at look ``look`` (0-based), ``se`` its
    standard error, ``spread`` the per-prompt SD of the paired linearised difference
    (so the plug-in SE at max prompts is ``spread / sqrt(max_prompts)``) and
    ``min_effect`` the fixed rule's minimum effect. The last look is the fixed rule
    with a normal interval.
    """
    if not 0 <= look < len(design.looks):
        raise ValueError(f"look {look} outside 0..{len(design.looks) - 1}")
    drop, se, spread, m = (np.asarray(x, dtype=np.float64) for x in (drop, se, spread, min_effect))
    regress_at, pass_at = _drop_bounds(design, look, se, spread, m)
    regress = drop >= regress_at
    if look == len(design.looks) - 1:
        return np.where(regress, REGRESS, PASS).astype(np.int64)
    passed = (drop <= pass_at) & ~regress
    return np.where(regress, REGRESS, np.where(passed, PASS, CONTINUE)).astype(np.int64)


def _paired(reference: AcceptanceSample, candidate: AcceptanceSample) -> AcceptanceSample:
    """The reference rows in the candidate's prompt order; both sides need the same ids."""
    if set(reference.prompt_ids) != set(candidate.prompt_ids) or len(
        set(candidate.prompt_ids)
    ) != len(candidate.prompt_ids):
        raise ValueError(
            "a sequential comparison is paired: reference and candidate need the same "
            "prompt ids, each once (run both sides on the same prompts in the same looks)"
        )
    return reference.take(candidate.prompt_ids)


def paired_al_statistics(
    ref_accepted: FloatArray,
    ref_drafts: FloatArray,
    cand_accepted: FloatArray,
    cand_drafts: FloatArray,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(reference AL, candidate AL, per-prompt SD of the paired difference) per row.

    Inputs are (rows x prompts) per-request counters, one row a comparison (the bench
    passes thousands of rows). The SD is that of the paired per-prompt linearised AL
    difference, so the standard error of the AL difference is ``SD / sqrt(prompts)``.
    """
    out = []
    n = ref_drafts.shape[-1]
    for acc, drafts in ((ref_accepted, ref_drafts), (cand_accepted, cand_drafts)):
        total = drafts.sum(axis=-1, keepdims=True)
        ratio = acc.sum(axis=-1, keepdims=True) / total
        out.append((1.0 + ratio[..., 0], (acc - ratio * drafts) / (total / n)))
    (ref_al, ref_u), (cand_al, cand_u) = out
    return ref_al, cand_al, np.asarray((cand_u - ref_u).std(axis=-1, ddof=1))


def look_statistics(
    reference: AcceptanceSample, candidate: AcceptanceSample, config: CheckConfig
) -> LookStatistics:
    """Paired AL difference over the prompts both samples hold, with its delta-method SE.

    Raises ``ValueError`` when the prompt ids differ, there are fewer than 2 prompts,
    or either side has no drafts.
    """
    reference = _paired(reference, candidate)
    n = len(candidate)
    if n < 2 or reference.drafts.sum() <= 0 or candidate.drafts.sum() <= 0:
        raise ValueError("a look needs at least 2 prompts with drafts on both sides")
    ref_al, cand_al, spread = (
        float(x[0])
        for x in paired_al_statistics(
            reference.accepted[None, :],
            reference.drafts[None, :],
            candidate.accepted[None, :],
            candidate.drafts[None, :],
        )
    )
    return LookStatistics(
        prompts=n,
        reference_al=ref_al,
        candidate_al=cand_al,
        difference=cand_al - ref_al,
        se=spread / math.sqrt(n),
        min_effect=config.min_al_effect(ref_al),
    )


def decide_look(
    reference: AcceptanceSample,
    candidate: AcceptanceSample,
    design: SequentialDesign,
    look: int,
    *,
    name: str = "",
    calibration: LookCalibration | None = None,
) -> LookDecision:
    """Decide look ``look`` (0-based) from the paired samples seen so far.

    The samples hold the prompts run so far (the planned count, or fewer when requests
    failed). At the last look the decision is the fixed rule's; with ``final="bootstrap"``
    its bootstrap draws come from ``design.check.rng(name)``, as the checks draw them.
    ``calibration``: the key's calibrated rule (:func:`farm.analysis.noise.
    look_calibration`): the difference re-centred on its centre, its run-level sd in the
    standard error of every look (and of the last, which the boundaries are built
    from), its minimum effect; the last look is then the calibrated fixed rule.
    """
    st = look_statistics(reference, candidate, design.check)
    spread, se, m, shift = st.se * math.sqrt(st.prompts), st.se, st.min_effect, 0.0
    if calibration is not None:
        if calibration.centre is not None:
            shift = st.reference_al - calibration.centre
        spread = math.sqrt(spread**2 + design.max_prompts * calibration.run_sd**2)
        se = math.hypot(se, calibration.run_sd)
        m = max(m, calibration.min_effect)
    code = int(
        decide_drops(
            design,
            look,
            np.array([-st.difference - shift]),
            np.array([se]),
            np.array([spread]),
            np.array([m]),
        )[0]
    )
    regress_at, pass_at = (
        -float(x[0]) - shift
        for x in _drop_bounds(design, look, np.array([se]), np.array([spread]), np.array([m]))
    )
    if look == len(design.looks) - 1 and design.final == "bootstrap":
        diff = compare_acceptance(
            reference,
            candidate,
            rng=design.check.rng(name),
            paired=True,
            resamples=design.check.resamples,
            level=design.check.level,
        )
        interval: Interval = diff.mean_acceptance_length
        if calibration is not None:
            interval = recentred(interval, shift, calibration.run_sd)
        # The paired prompts' reference AL is the look's: ``m`` and ``shift`` hold.
        _, bad = classify_difference(interval, m, "lower")
        code = REGRESS if bad else PASS
        regress_at = pass_at = -m - shift
    return LookDecision(
        look=look,
        prompts=st.prompts,
        decision=_CODE[code],
        statistics=st,
        regress_at=regress_at,
        pass_at=pass_at,
    )


def sequential_record(
    design: SequentialDesign, looks: tuple[LookDecision, ...]
) -> SequentialRecord:
    """The record to store: the looks made, the rule and "decided after N of M"."""
    if not looks:
        raise ValueError("a sequential record needs at least one look")
    return SequentialRecord(
        rule=RULE_NAME,
        parameters=design.parameters(),
        decision=looks[-1].decision,
        prompts_used=looks[-1].prompts,
        max_prompts=design.max_prompts,
        planned_looks=design.looks,
        looks=looks,
    )


def run_sequential(
    reference: AcceptanceSample,
    candidate: AcceptanceSample,
    design: SequentialDesign,
    *,
    name: str = "",
    calibration: LookCalibration | None = None,
) -> SequentialRecord:
    """Replay the looks over paired samples in prompt order until one decides, under
    ``calibration`` when the key has one (:func:`decide_look`).

    The candidate's order is the prompt order; the samples need at least
    ``max_prompts`` prompts to reach the last look (fewer: the record ends undecided,
    ``continue``, at the last look they allow).
    """
    reference = _paired(reference, candidate)
    looks: list[LookDecision] = []
    for k, n in enumerate(design.looks):
        if n > len(candidate):
            break
        ids = candidate.prompt_ids[:n]
        looks.append(
            decide_look(
                reference.take(ids),
                candidate.take(ids),
                design,
                k,
                name=name,
                calibration=calibration,
            )
        )
        if looks[-1].decision != "continue":
            break
    record = sequential_record(design, tuple(looks))
    return record.model_copy(update={"calibration": calibration})

"""Run-to-run noise of each comparable key, from the job's own nights, and the AL
threshold it calibrates. Pure.

The paired bootstrap of a night against the last good night (:mod:`farm.analysis.
compare`) resamples prompts: it sees per-token jitter (prompts move apart at random)
but reads a shift common to every prompt of a run (another machine, another kernel
build: vllm-ascend PR #14890's goldens that "varied significantly across machines")
as a real difference. What covers that is the key's own history: the night-to-night
spread of its AL over the same prompts, which is the run-level variation itself.

Estimator: successive differences of the key's nightly AL, ``d_i = AL_i - AL_(i-1)``,
have standard deviation ``sqrt(2) * sigma`` and centre 0 under run-to-run noise; a
regression or a fix moves one difference only, so the spread is read robustly as
``1.4826 * median(|d|) / sqrt(2)`` (the median absolute deviation about 0 with its
consistency factor for a normal). No verdicts are
needed, and a few shifted nights in the window do not inflate it.

Reference level: under a per-run shift the last good night is one draw of the run level,
and not a fair one: a night that drew high passes and becomes the reference, a night
that drew low fails and does not, so the reference ratchets up and the clean nights
after a lucky one read as drops (20 recorded real-engine nights at the noise patch's
defaults, bench/detection.py table 8: of the 15 judged with a calibrated threshold, 2
raised false alarms against a last good night 12% and 19% above the key's median,
thinking off). So once calibrated the comparison is re-centred: the paired difference
against the last good night (per-token jitter, prompt sampling) is shifted by that
night's AL minus the median AL of the key's last ``centre_nights`` nights up to and
including it, a baseline window as PyTorch HUD's. The median of m runs has variance
about ``(pi / 2) * sigma**2 / m`` (``sigma**2 / m`` for m <= 2, where it is the mean).

Rule (per key, :func:`calibrated`): with at least ``min_nights`` nights before the
judged one, the comparison's difference has a run-level variance ``(1 + c_m) *
sigma**2`` (the judged night's own run, and the window's centre: ``c_m = 1`` against the
last good night alone) added to the bootstrap's, and the minimum effect is the larger of
the fixed floor and ``k * sqrt(1 + c_m) * sigma``. ``k = 3``: a clean night then exceeds
the minimum effect with probability 0.13% per key (one-sided normal), so a job of 16
keys raises a false alarm from noise about once in 500 nights, while a deterministic
engine (sigma 0) keeps exactly the fixed rule and its power. With fewer nights the floor
rule holds and the key says "insufficient history". Which component this covers (the
per-run shift; per-token jitter is already in the bootstrap) is read from the
measurements in ``bench/detection.py``. The 0.13% holds for a spread read well: on the
recorded nights 13 nights read a thinking-on spread of 1.0% where 20 read 1.7%, and a
clean night 4.5% below the centre was flagged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from farm.analysis.confirm import ConfirmRule
from farm.analysis.history import HistoryPoint
from farm.analysis.stats import Interval
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.records import LookCalibration, SweepRecord, VariantResult
from farm.results.verdict import SweepVerdict

__all__ = [
    "KeyNoise",
    "KeyNoiseRow",
    "NoiseRule",
    "QuarantineRule",
    "Threshold",
    "calibrated",
    "key_noise",
    "look_calibration",
    "median_variance",
    "night_to_night_sd",
    "night_to_night_sds",
    "noise_table",
    "quarantined",
    "recentred",
]

_MAD_TO_SD = 1.4826
FloatArray = npt.NDArray[np.float64]


class NoiseRule(Frozen):
    """How thresholds follow a key's history (module docstring), and how a suspicious
    first run is confirmed in its night (:mod:`farm.analysis.confirm`)."""

    k: float = 3.0
    min_nights: int = 5
    centre_nights: int = 10  # the baseline window: nights up to the last good one
    confirm: ConfirmRule = ConfirmRule()


class KeyNoise(Frozen):
    """A key's nights before the judged one, and its night-to-night AL spread;
    ``centre``: the median AL of its last nights up to the reference night (the
    baseline window, ``centre_nights`` of them), None when not known."""

    nights: int
    al_sd: float
    centre: float | None = None
    centre_nights: int = 0

    def centre_variance(self) -> float:
        """The variance of ``centre`` in units of the run variance (1: a single night)."""
        return median_variance(self.centre_nights if self.centre is not None else 1)


class Threshold(Frozen):
    """The AL threshold of one comparison and where it came from."""

    min_effect: float
    floor: float
    run_sd: float = 0.0  # the run-level sd added to each night (0: prompt-only rule)
    nights: int = 0
    k: float = 0.0
    calibrated: bool = False
    min_nights: int = 0
    factor: float = math.sqrt(2.0)  # sqrt(1 + c_m): the judged run and the reference's
    # The reference level when re-centred on the baseline window: its median AL, the
    # nights in it and the reference night's own AL (None: the last good night's).
    centre: float | None = None
    centre_nights: int = 0
    reference_al: float | None = None

    def describe(self) -> str:
        """``min effect 0.058: 3 x night-to-night sd 0.0137 x 1.05 over 12 nights
        (floor 0.050); reference re-centred 3.120 -> median 3.050 of 10 nights``, or
        ``min effect 0.050 (floor); insufficient history: 2 of 5 nights``."""
        if self.calibrated:
            text = (
                f"min effect {self.min_effect:.3f}: {self.k:g} x night-to-night sd "
                f"{self.run_sd:.4f} x {self._factor_name()} over {self.nights} nights "
                f"(floor {self.floor:.3f})"
            )
            if self.centre is not None and self.reference_al is not None:
                text += (
                    f"; reference re-centred {self.reference_al:.3f} -> median "
                    f"{self.centre:.3f} of {self.centre_nights} nights"
                )
            return text
        return (
            f"min effect {self.floor:.3f} (floor); insufficient history: {self.nights} of "
            f"{self.min_nights} nights"
        )

    def matches(self, looks: LookCalibration | None) -> bool:
        """Whether sequential looks made under ``looks`` judged by this very rule (the
        same centre, run-level sd and minimum effect beyond the floor)."""
        if not self.calibrated or looks is None:
            return False
        return (
            self.centre == looks.centre
            and math.isclose(self.factor * self.run_sd, looks.run_sd)
            and math.isclose(self.k * self.factor * self.run_sd, looks.min_effect)
        )

    def _factor_name(self) -> str:
        return "sqrt2" if math.isclose(self.factor, math.sqrt(2.0)) else f"{self.factor:.3f}"


def night_to_night_sd(values: Sequence[float]) -> float:
    """The run-to-run sd of nightly values, robust to a few level shifts (docstring)."""
    if len(values) < 2:
        return 0.0
    return float(night_to_night_sds(np.asarray(values, dtype=float)[None, :])[0])


def night_to_night_sds(values: FloatArray) -> FloatArray:
    """:func:`night_to_night_sd` of each row of ``values`` (nights along the last axis,
    at least two of them): one definition for a key's nights and for simulated ones."""
    d = np.diff(values, axis=-1)
    # About 0, not the median difference: under noise the differences centre on 0,
    # and a centre fitted to a handful of them can make the spread vanish.
    return _MAD_TO_SD * np.median(np.abs(d), axis=-1) / math.sqrt(2.0)


def median_variance(m: int) -> float:
    """The variance of the median of ``m`` nights in units of one night's (module
    docstring: ``pi / (2 m)``, the mean's ``1 / m`` for ``m <= 2``)."""
    return 1.0 / m if m <= 2 else math.pi / (2.0 * m)


def key_noise(
    series: Mapping[ComparableKey, Sequence[HistoryPoint]],
    judged_sweep: int,
    reference_sweep: int | None = None,
    rule: NoiseRule | None = None,
) -> dict[ComparableKey, KeyNoise]:
    """Each key's nights before ``judged_sweep`` (oldest first) and their spread; with
    ``reference_sweep`` (the last good night), the median AL of the key's last
    ``rule.centre_nights`` nights up to and including it."""
    window = (rule or NoiseRule()).centre_nights
    out = {}
    for key, points in series.items():
        before = sorted((p for p in points if p.sweep_id < judged_sweep), key=lambda p: p.sweep_id)
        values = [p.value for p in before]
        upto = (
            [p.value for p in before if p.sweep_id <= reference_sweep][-window:]
            if reference_sweep is not None
            else []
        )
        out[key] = KeyNoise(
            nights=len(before),
            al_sd=night_to_night_sd(values),
            centre=float(np.median(upto)) if upto else None,
            centre_nights=len(upto),
        )
    return out


def calibrated(
    diff: Interval,
    floor: float,
    noise: KeyNoise | None,
    rule: NoiseRule,
    reference_al: float | None = None,
) -> tuple[Interval, Threshold]:
    """``diff`` (candidate - reference AL, from the paired bootstrap) re-centred on the
    key's baseline window (when ``noise.centre`` and the reference night's
    ``reference_al`` are known) with the key's run-level variance added, and the
    threshold it is judged by."""
    nights = noise.nights if noise is not None else 0
    if noise is None or nights < rule.min_nights:
        return diff, Threshold(
            min_effect=floor, floor=floor, nights=nights, min_nights=rule.min_nights
        )
    centre, shift = None, 0.0  # sigma 0: nothing to re-centre
    if noise.al_sd > 0 and noise.centre is not None and reference_al is not None:
        centre, shift = noise.centre, reference_al - noise.centre
    centred = centre is not None
    factor = math.sqrt(1.0 + (noise.centre_variance() if centred else 1.0))
    widened = recentred(diff, shift, factor * noise.al_sd)
    threshold = Threshold(
        min_effect=max(floor, rule.k * factor * noise.al_sd),
        floor=floor,
        run_sd=noise.al_sd,
        nights=nights,
        k=rule.k,
        calibrated=True,
        min_nights=rule.min_nights,
        factor=factor,
        centre=centre,
        centre_nights=noise.centre_nights if centred else 0,
        reference_al=reference_al if centred else None,
    )
    return (widened if noise.al_sd > 0 else diff), threshold


def recentred(diff: Interval, shift: float, run_sd: float) -> Interval:
    """``diff`` moved by ``shift``, each side of its (asymmetric) interval widened by the
    run-level variance ``run_sd**2``."""
    run = (_z(diff.level) * run_sd) ** 2
    low = diff.estimate + shift - math.sqrt((diff.estimate - diff.low) ** 2 + run)
    high = diff.estimate + shift + math.sqrt((diff.high - diff.estimate) ** 2 + run)
    return Interval(estimate=diff.estimate + shift, low=low, high=high, level=diff.level)


def look_calibration(noise: KeyNoise | None, rule: NoiseRule) -> LookCalibration | None:
    """The key's calibrated rule for its sequential looks, as :func:`calibrated` will
    judge the night (the reference re-centred on ``noise.centre``); None while the key
    has too little history or no spread (the looks' own rule is the fixed one then)."""
    if noise is None or noise.nights < rule.min_nights or noise.al_sd <= 0:
        return None
    _, threshold = calibrated(
        Interval(estimate=0.0, low=0.0, high=0.0, level=0.95),
        0.0,
        noise,
        rule,
        reference_al=noise.centre,
    )
    return LookCalibration(
        centre=threshold.centre,
        run_sd=threshold.factor * noise.al_sd,
        min_effect=threshold.min_effect,
        rule=threshold.describe(),
    )


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2.0)


class KeyNoiseRow(Frozen):
    """One key's run-to-run variation over a job's nights (``farm noise``)."""

    key: ComparableKey
    nights: int
    al_mean: float
    al_sd: float  # night-to-night, the calibration's estimator
    position_sd: tuple[float, ...]  # acceptance at each draft position, the same way
    accuracy_sd: float | None  # share correct, the same way (None: not scored)
    flip_rate: float | None  # share of prompts whose output differs from the night before
    aa_nights: int = 0  # of ``nights``, the A/A nights (clean repeats of a good night)
    aa_false_alarms: int = 0  # of those, the nights with a finding on this key

    @property
    def al_relative_sd(self) -> float:
        return self.al_sd / self.al_mean if self.al_mean else 0.0


def noise_table(
    sweeps: Sequence[SweepRecord], aa_verdicts: Sequence[SweepVerdict] = ()
) -> list[KeyNoiseRow]:
    """Every spec-on key of ``sweeps`` (a job's nights, any order) with its spread.

    ``aa_verdicts``: the A/A verdicts of those sweeps (others are ignored); each key
    counts the A/A nights it was measured on and those on which a finding of the
    rule (a false alarm: :attr:`SweepVerdict.false_alarms`) named it."""
    aa = {v.sweep_id: _false_alarm_labels(v) for v in aa_verdicts if v.kind == "aa"}
    nights: dict[ComparableKey, list[tuple[int, VariantResult]]] = {}
    for sweep in sweeps:
        for stored in sweep.cells:
            result = stored.result
            if result is None or result.status != "ok":
                continue
            for v in result.variants:
                if v.counters.mean_acceptance_length is None:
                    continue
                key = stored.cell.variant_key(v.axes)
                nights.setdefault(key, []).append((sweep.sweep_id, v))
    rows = []
    for key, seen in sorted(nights.items(), key=lambda kv: kv[0].label):
        runs = [v for _, v in sorted(seen, key=lambda sv: sv[0])]
        al = [v.counters.mean_acceptance_length or 0.0 for v in runs]
        depth = min(len(v.counters.accepted_per_pos) for v in runs)
        per_position = tuple(
            night_to_night_sd([v.counters.accepted_per_pos[i] / v.counters.drafts for v in runs])
            for i in range(depth)
            if all(v.counters.drafts for v in runs)
        )
        scored = [[r.correct for r in v.requests if r.correct is not None] for v in runs]
        accuracy = night_to_night_sd([sum(s) / len(s) for s in scored]) if all(scored) else None
        rows.append(
            KeyNoiseRow(
                key=key,
                nights=len(runs),
                al_mean=float(np.mean(al)),
                al_sd=night_to_night_sd(al),
                position_sd=per_position,
                accuracy_sd=accuracy,
                flip_rate=_flip_rate(runs),
                aa_nights=sum(sweep_id in aa for sweep_id, _ in seen),
                aa_false_alarms=sum(key.label in aa.get(sweep_id, ()) for sweep_id, _ in seen),
            )
        )
    return rows


def _false_alarm_labels(verdict: SweepVerdict) -> frozenset[str]:
    return frozenset(f.key.label for f in verdict.false_alarms if f.key is not None)


def _flip_rate(runs: Sequence[VariantResult]) -> float | None:
    """Share of (prompt, consecutive night pair) whose greedy output changed."""
    changed = compared = 0
    for before, after in itertools.pairwise(runs):
        earlier = {r.prompt_id: r.output_text for r in before.requests}
        for r in after.requests:
            old = earlier.get(r.prompt_id)
            if old is None or r.output_text is None:
                continue  # a prompt of one night only, or a pruned text
            compared += 1
            changed += old != r.output_text
    return changed / compared if compared else None


class QuarantineRule(Frozen):
    """When a key's verdicts flip too often to be believed (vLLM's nightly bot reports
    the same per-test flip rate): over the last ``window`` judged nights, at least
    ``min_nights`` of them, a pass <-> fail flip rate above ``max_flip_rate``
    quarantines the key until its last ``stable_nights`` nights held one verdict."""

    window: int = 60
    min_nights: int = 10
    max_flip_rate: float = 0.2
    stable_nights: int = 7


def quarantined(
    nights: Sequence[tuple[frozenset[str], frozenset[str]]], rule: QuarantineRule
) -> dict[str, float]:
    """Key label -> flip rate of each quarantined key. ``nights``: oldest first, each
    night's (labels judged, labels flagged)."""
    recent = list(nights)[-rule.window :]
    labels = set().union(*(judged for judged, _ in recent)) if recent else set()
    out = {}
    for label in sorted(labels):
        seq = [label in flagged for judged, flagged in recent if label in judged]
        if len(seq) < rule.min_nights:
            continue
        flips = sum(a != b for a, b in itertools.pairwise(seq))
        rate = flips / (len(seq) - 1)
        settled = len(set(seq[-rule.stable_nights :])) == 1
        if rate > rule.max_flip_rate and not settled:
            out[label] = rate
    return out

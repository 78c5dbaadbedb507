"""Sustained small drops across nights: a step in a key's nightly AL, named with the
night it began and the builds between that night and the one before. Pure.

The change-point check (:mod:`farm.analysis.history`) alerts on drops of at least 2%
that hold two nights; under run-to-run noise (:mod:`farm.analysis.noise`: a key's AL
moves 1.7% a night on the recorded real-engine nights) a 2% drop hides in single nights,
and only an average over several nights shows it. This check averages.

Test (a window-limited generalised likelihood ratio test for a mean shift with the
noise scale estimated, Lai 1995, J. R. Stat. Soc. B 57:613; Willsky & Jones 1976): the
judged night is the last of the key's series, of which the last ``reference_nights +
window`` nights are read. Every start ``s`` with at least ``min_reference`` nights before
it and two or more from it on (``m`` nights, ``s`` to the judged one) gets the score

    z_s = (median(reference) - level_s) / (sigma * sqrt(1 / (m - 1) + c_n))

where the reference is the ``n`` nights before ``s`` (at most ``reference_nights``),
``level_s`` the mean of the ``m`` nights with their lowest one left out, ``sigma`` the
key's night-to-night sd over the nights read
(:func:`farm.analysis.noise.night_to_night_sd`, the calibration's robust estimator: a
step moves one difference, which it ignores) and ``c_n`` the variance of the median of
``n`` nights in units of a night's (:func:`farm.analysis.noise.median_variance`). The
start with the largest score is the likelihood's estimate of when the level changed; a
step is named there when that start lies among the last ``window`` nights and its score
reaches the threshold ``h``. Why each piece:

- the lowest night left out: a single night, however low, never fires (a step, not a
  spike); two low nights are the least a step is (with two, the higher one counts);
- the median of the reference: a high or low night before the step does not move it;
- the best start over the whole series read, not over the window alone: a step older
  than the window sits in the reference of the recent starts and pulls its median
  towards the new level, so the recent nights would read as a fresh drop, at the wrong
  night, for weeks; its own start scores higher, so it is not named again;
- ``h`` by simulation: the scores are unchanged by the level and the scale of the
  series, so under noise alone (independent normal nights) the statistic (the best
  score when its start is recent, else nothing) has one distribution per number of
  nights read, whatever the key's AL and spread. ``h`` is its ``1 - alpha`` quantile,
  drawn once per night count (``draws`` series, a fixed seed: the same threshold on every
  machine). That holds the error across the starts tried (the maximum is what is
  calibrated) and, with few nights, for the spread read from them (the threshold rises
  as they fall: 4.4 at 14 nights, 3.0 at 35);
- ``alpha = 0.00135``: a clean key fires on a given night with the probability the
  calibrated baseline rule allows (``k = 3``, one-sided normal), so the two checks of a
  key's AL spend the same budget; looks made night after night add up to at most
  ``nights * alpha`` (over 20 clean nights, at most 2.7% per key; consecutive nights
  share most of their data, so the real figure is lower);
- ``window = 7``: a step is named within a week of its first night or not at all; once
  older, it leaves the window and the finding stops, though the AL has not recovered
  (so the check never marks a key checked: an alert it raised stays open);
- ``reference_nights = 28``: four weeks before the step, so that the median is close to
  the level (``c_n`` 0.056); the test reads at most 35 nights, and a job's
  ``nightly.history`` (14 by default) may give it fewer: it then has less power;
- ``min_reference = 5``: the calibration's own minimum (``NoiseRule.min_nights``); a key
  with fewer than 7 nights has insufficient history and the check does nothing;
- ``min_relative_drop = 0.01``: a key whose nights barely move (a spread near 0) would
  make any difference significant; half the checks' 2% floor is named, less is not.

A key with no spread (a deterministic engine: sigma 0) is not tested: its drops are the
change-point check's, exactly as before this check existed. The drop is reported as the
mean of all ``m`` nights against the reference median, relative to the median, with a
``level`` normal interval (``sigma * sqrt(1 / m + c_n)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from farm.analysis.history import HistoryPoint
from farm.analysis.noise import median_variance, night_to_night_sds
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.records import SweepRecord
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import Finding

__all__ = [
    "SUSTAINED_CHECK",
    "SustainedAnalysis",
    "SustainedDrop",
    "SustainedRule",
    "step_scores",
    "step_threshold",
    "sustained_drop",
    "sustained_drops",
    "sustained_findings",
    "sustained_notes",
    "window_score",
]

# The finding check (and alert kind) of a sustained drop over a key's nights.
SUSTAINED_CHECK = "sustained_drop"

FloatArray = npt.NDArray[np.float64]
SustainedStatus = Literal["checked", "insufficient_history", "no_spread"]


class SustainedRule(Frozen):
    """The sustained-drop test's constants (module docstring says why each)."""

    window: int = Field(default=7, ge=2)
    reference_nights: int = Field(default=28, ge=1)
    min_reference: int = Field(default=5, ge=1)
    alpha: float = Field(default=0.00135, gt=0.0, lt=1.0)
    min_relative_drop: float = Field(default=0.01, ge=0.0)
    level: float = Field(default=0.95, gt=0.0, lt=1.0)
    draws: int = Field(default=100_000, ge=1000)  # null series per threshold
    seed: int = 0

    @property
    def min_nights(self) -> int:
        """Nights a key needs before anything is tested: the reference and two more."""
        return self.min_reference + 2

    @property
    def max_nights(self) -> int:
        """Nights read at most: the reference of the earliest start and the window."""
        return self.reference_nights + self.window


class SustainedDrop(Frozen):
    """A step named: its first night, the night before it, the builds either side, the
    level after it against the reference before it, and the test's score."""

    start_sweep_id: int
    start_timestamp: datetime
    before_sweep_id: int
    builds_before: tuple[str, ...] = ()
    builds_after: tuple[str, ...] = ()
    nights: int  # at the new level, the judged night included
    reference: float  # median AL of the nights before the step
    reference_nights: int
    level: float  # mean AL of the nights at the new level
    relative: float
    relative_low: float
    relative_high: float
    interval_level: float
    score: float
    threshold: float

    def builds_text(self) -> str:
        """``build abc -> def``, ``build abc on both nights`` or ``builds not recorded``."""
        before, after = ",".join(self.builds_before), ",".join(self.builds_after)
        if not before and not after:
            return "builds not recorded"
        if before == after:
            return f"build {after} on both nights"
        return f"build {before or '?'} -> {after or '?'}"


class SustainedAnalysis(Frozen):
    """One key's series tested: how many nights were read, the spread, the threshold,
    and the step named (None: none)."""

    key: ComparableKey | None
    status: SustainedStatus
    nights: int
    min_nights: int
    window: int
    last_sweep_id: int | None
    run_sd: float = 0.0
    threshold: float | None = None
    alpha: float = 0.0
    drop: SustainedDrop | None = None

    def describe(self) -> str:
        """``sustained drop of -2.3% [-3.4, -1.2] over 4 nights since sweep 41 (build
        abc -> def); ...``, ``no sustained drop ...``, or why the key was not tested."""
        if self.status == "insufficient_history":
            return f"insufficient history: {self.nights} of {self.min_nights} nights"
        if self.status == "no_spread":
            return "no night-to-night spread: drops are the change-point check's"
        d = self.drop
        if d is None:
            return (
                f"no sustained drop over {self.nights} nights (threshold {self.threshold:.2f}, "
                f"night-to-night sd {self.run_sd:.4f})"
            )
        return (
            f"sustained drop of {d.relative:+.1%} [{100 * d.relative_low:+.1f}, "
            f"{100 * d.relative_high:+.1f}] over {d.nights} nights since sweep "
            f"{d.start_sweep_id} ({d.builds_text()}): AL {d.level:.3f} vs median "
            f"{d.reference:.3f} of the {d.reference_nights} nights before; score "
            f"{d.score:.2f} >= {d.threshold:.2f} (per-night false-alarm rate "
            f"{self.alpha:.3%}, night-to-night sd {self.run_sd:.4f})"
        )


def _starts(nights: int, rule: SustainedRule) -> range:
    """Every start a step can have in a series of ``nights`` (0-based): at least
    ``min_reference`` nights before it, two or more from it on."""
    return range(rule.min_reference, nights - 1)


def step_scores(values: FloatArray, rule: SustainedRule) -> FloatArray:
    """The score ``z_s`` (module docstring) of every start in :func:`_starts` order, one
    column each, for each row of ``values`` (a series of nights, oldest first, at most
    ``rule.max_nights`` of them, their spread > 0)."""
    nights = values.shape[-1]
    sigma = night_to_night_sds(values)
    # Sums and minima of every tail values[:, s:] at once, longest tail first.
    tail_sum = np.cumsum(values[:, ::-1], axis=1)[:, ::-1]
    tail_min = np.minimum.accumulate(values[:, ::-1], axis=1)[:, ::-1]
    columns = []
    for s in _starts(nights, rule):
        reference = values[:, max(0, s - rule.reference_nights) : s]
        m = nights - s
        # The lowest night at the new level left out: a spike alone never fires.
        level = (tail_sum[:, s] - tail_min[:, s]) / (m - 1)
        spread = sigma * np.sqrt(1.0 / (m - 1) + median_variance(reference.shape[1]))
        columns.append((np.median(reference, axis=1) - level) / spread)
    return np.stack(columns, axis=1)


def window_score(scores: FloatArray, nights: int, rule: SustainedRule) -> FloatArray:
    """The test's statistic of each row of :func:`step_scores`: the largest score of a
    start among the last ``window`` nights, when the row's best start lies there (the
    series' most likely step is recent); -inf when it lies earlier (an old step, or
    none in the window)."""
    recent = np.array([s >= nights - rule.window for s in _starts(nights, rule)])
    best = np.argmax(scores, axis=1)
    top = scores[np.arange(len(scores)), best]
    return np.where(recent[best], top, -np.inf)


@lru_cache(maxsize=64)
def step_threshold(nights: int, rule: SustainedRule) -> float:
    """The threshold ``h`` for a series of ``nights`` nights read: the ``1 - alpha``
    quantile of :func:`window_score` under noise alone, from ``rule.draws`` simulated
    series of independent standard normal nights (seeded by ``rule.seed`` and
    ``nights``, so deterministic). ValueError below ``rule.min_nights``."""
    if nights < rule.min_nights:
        raise ValueError(f"{nights} nights: the test needs at least {rule.min_nights}")
    rng = np.random.default_rng([rule.seed, nights])
    chunk = 20_000  # bounded memory: rows x nights floats at a time
    stats = []
    for i in range(0, rule.draws, chunk):
        values = rng.standard_normal((min(chunk, rule.draws - i), nights))
        stats.append(window_score(step_scores(values, rule), nights, rule))
    return float(np.quantile(np.concatenate(stats), 1.0 - rule.alpha))


def sustained_drop(
    points: Sequence[HistoryPoint],
    *,
    key: ComparableKey | None = None,
    rule: SustainedRule | None = None,
) -> SustainedAnalysis:
    """Test one key's series (sorted by timestamp first; the last point is the judged
    night) for a sustained drop; reads the last ``rule.max_nights`` points."""
    r = rule or SustainedRule()
    ordered = sorted(points, key=lambda p: (p.timestamp, p.sweep_id))[-r.max_nights :]
    tested = SustainedAnalysis(
        key=key,
        status="insufficient_history",
        nights=len(ordered),
        min_nights=r.min_nights,
        window=r.window,
        last_sweep_id=ordered[-1].sweep_id if ordered else None,
    )
    if len(ordered) < r.min_nights:
        return tested
    values = np.array([[p.value for p in ordered]], dtype=np.float64)
    sigma = float(night_to_night_sds(values)[0])
    if not sigma > 0:
        return tested.model_copy(update={"status": "no_spread"})
    threshold = step_threshold(len(ordered), r)
    scores = step_scores(values, r)
    best = int(np.argmax(scores[0]))
    start = _starts(len(ordered), r)[best]
    drop = _named(ordered, start, sigma, (float(scores[0, best]), threshold), r)
    recent = np.isfinite(window_score(scores, len(ordered), r)[0])
    named = recent and drop.score >= threshold and -drop.relative >= r.min_relative_drop
    return tested.model_copy(
        update={
            "status": "checked",
            "run_sd": sigma,
            "threshold": threshold,
            "alpha": r.alpha,
            "drop": drop if named else None,
        }
    )


def _named(
    ordered: Sequence[HistoryPoint],
    start: int,
    sigma: float,
    score: tuple[float, float],
    r: SustainedRule,
) -> SustainedDrop:
    """The step starting at ``ordered[start]``: level, reference and the interval;
    ``score``: its score and the threshold it was held to."""
    reference = [p.value for p in ordered[max(0, start - r.reference_nights) : start]]
    after = [p.value for p in ordered[start:]]
    centre, level = float(np.median(reference)), float(np.mean(after))
    half = NormalDist().inv_cdf(0.5 + r.level / 2.0) * sigma
    half *= float(np.sqrt(1.0 / len(after) + median_variance(len(reference))))
    first, before = ordered[start], ordered[start - 1]
    return SustainedDrop(
        start_sweep_id=first.sweep_id,
        start_timestamp=first.timestamp,
        before_sweep_id=before.sweep_id,
        builds_before=before.builds,
        builds_after=first.builds,
        nights=len(after),
        reference=centre,
        reference_nights=len(reference),
        level=level,
        relative=(level - centre) / centre,
        relative_low=(level - centre - half) / centre,
        relative_high=(level - centre + half) / centre,
        interval_level=r.level,
        score=score[0],
        threshold=score[1],
    )


def sustained_drops(
    series: Mapping[ComparableKey, Sequence[HistoryPoint]], rule: SustainedRule | None = None
) -> tuple[SustainedAnalysis, ...]:
    """:func:`sustained_drop` for every key of ``series``, in key order."""
    return tuple(sustained_drop(series[k], key=k, rule=rule) for k in sorted(series, key=str))


def sustained_findings(results: Sequence[SustainedAnalysis], sweep: SweepRecord) -> list[Finding]:
    """One ``sustained_drop`` finding (source ``history``) per key whose series, ending
    with ``sweep``, names a step; a key not measured in ``sweep`` finds nothing (its
    last night is an older one)."""
    out = []
    for a in results:
        d = a.drop
        if a.key is None or d is None or a.last_sweep_id != sweep.sweep_id:
            continue
        figure = AlertFigure(
            metric="mean_acceptance_length",
            candidate=f"{d.nights} nights from sweep {d.start_sweep_id}",
            reference=f"median of {d.reference_nights} nights before",
            candidate_value=FigureInterval.of(d.level),
            reference_value=FigureInterval.of(d.reference),
            difference=FigureInterval.of(
                d.level - d.reference,
                d.relative_low * d.reference,
                d.relative_high * d.reference,
                d.interval_level,
            ),
            relative=d.relative,
        )
        out.append(
            Finding(
                source="history",
                check=SUSTAINED_CHECK,
                key=a.key,
                cells=sweep.cells_measuring(a.key),
                metric="mean_acceptance_length",
                summary=f"{a.key}: {a.describe()}",
                relative=d.relative,
                figures=(figure,),
            )
        )
    return out


def sustained_notes(results: Sequence[SustainedAnalysis]) -> list[str]:
    """One note on what the check could test; nothing when every key lacks spread (a
    deterministic engine's verdict reads as it did before the check) or none was given."""
    if all(a.status == "no_spread" for a in results):
        return []
    count = {s: sum(a.status == s for a in results) for s in ("checked", "no_spread")}
    short = len(results) - sum(count.values())
    return [
        f"sustained drops over the last {results[0].window} nights: {count['checked']} "
        f"key(s) tested, {count['no_spread']} without night-to-night spread, {short} with "
        f"insufficient history (fewer than {results[0].min_nights} nights)"
    ]

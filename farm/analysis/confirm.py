"""Confirmation in the same night: a suspicious cell rerun beside the reference build,
decided with runs as the unit. Pure.

Under run-to-run noise one run of a cell per night cannot be told from a run that drew
low (:mod:`farm.analysis.noise`: the calibrated threshold is ``3 x 1.08 x`` the key's
run-level spread). So when a cell's first run is *suspicious* (:func:`suspicious`: a
calibrated key whose AL fell by at least the fixed floor, or that the calibrated rule
called a regression) the night reruns it ``R`` times and the reference build's same
cell ``R`` times, interleaved on the node it ran on (A B A B ...: what the node does
tonight falls on both sides alike, as Chromium's Pinpoint interleaves), and decides
from the runs (:func:`decide`).

The test: the difference of the sides' mean AL over the reruns. The first run is left
out: it was chosen for being low, and counting it would carry that choice into the test
(on the 20 recorded real-engine nights, ``bench/confirmation.py --recorded``, it
doubled the false alarms of the confirmations). The difference's variance is the
run-level variance over the runs' count on each side, read from this night's reruns
(the spread within each side) pooled with the key's night-to-night spread over its
earlier nights (a prior with ``nights - 1`` degrees of freedom: two or three runs alone
say little about a variance). Student's t with the pooled degrees of freedom. A
regression: the interval lies below 0 and the drop reaches the fixed floor
(:meth:`farm.analysis.check_rules.CheckConfig.min_al_effect`); an improvement the mirror
image; else the cell passes, whatever its first run said.

Sequential looks (:func:`settled`): after each pair of reruns the runner asks whether
the runs already rule a regression out, and stops early when they do (from the second
pair on: the mean drop is under half the floor, or the interval at ``level`` lies above
minus the floor). Only a pass stops early, a regression is called at the last look
alone: stopping for futility never raises the error rate of calling a regression, so
the one look that can call it is made at ``level`` with no correction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np

from farm.analysis.stats import Interval
from farm.axes import AxisValue
from farm.frozen import Frozen
from farm.records import ConfirmationRun

__all__ = [
    "ConfirmRule",
    "Confirmation",
    "decide",
    "rerun_sides",
    "settled",
    "suspicious",
    "t_quantile",
]

ConfirmOutcome = Literal["regress", "pass", "improve"]


class ConfirmRule(Frozen):
    """How a night confirms: ``runs`` reruns of each side at most (R), ``budget_s`` the
    device time (device-seconds) all confirmations of a night may take (the most
    suspicious cells first), ``level`` the confidence of the confirmation."""

    runs: int = 6
    budget_s: float = 3600.0
    level: float = 0.95


class Confirmation(Frozen):
    """A suspicious cell decided with runs as the unit: ``candidate`` and ``reference``
    the reruns' AL, ``difference`` candidate minus
    reference mean AL with its interval, ``relative`` the same over the reference
    mean, ``outcome`` what the runs say."""

    candidate: tuple[float, ...]
    reference: tuple[float, ...]
    difference: Interval
    relative: Interval
    outcome: ConfirmOutcome
    floor: float
    run_sd: float
    df: float
    early: bool = False  # stopped before every rerun ran

    def describe(self) -> str:
        """``confirmed over 5+4 runs: -3.1% [-4.6, -1.7]`` (a regression), ``cleared
        over 3+2 runs: -0.4% [-2.0, +1.2]`` (a pass), ``improved over ...``."""
        verb = {"regress": "confirmed", "pass": "cleared", "improve": "improved"}[self.outcome]
        r = self.relative
        return (
            f"{verb} over {len(self.candidate)}+{len(self.reference)} runs: "
            f"{r.estimate:+.1%} [{r.low:+.1%}, {r.high:+.1%}]"
            + (" (stopped early)" if self.early else "")
        )


def rerun_sides(
    runs: Sequence[ConfirmationRun], axes: Mapping[str, AxisValue]
) -> tuple[list[float], list[float]]:
    """The AL of variant ``axes`` in each side's reruns that ran ok (candidate,
    reference), in run order."""
    sides: dict[str, list[float]] = {"candidate": [], "reference": []}
    for run in sorted(runs, key=lambda r: r.run):
        al = run.al(axes)
        if al is not None:
            sides[run.side].append(al)
    return sides["candidate"], sides["reference"]


def suspicious(
    outcome: str, relative: float | None, calibrated: bool, run_sd: float, floor_rel: float
) -> bool:
    """Whether a comparison's first run asks for confirmation: its key is calibrated on
    a noisy history (``run_sd`` > 0: a deterministic engine's rules stay as they are)
    and the run regressed by the calibrated rule or fell by the fixed floor
    (``floor_rel``, relative) that the run-level rule could not yet call."""
    if not calibrated or run_sd <= 0 or relative is None:
        return False
    return outcome == "regress" or relative <= -floor_rel


def decide(
    candidate: Sequence[float],
    reference: Sequence[float],
    *,
    history_sd: float,
    history_nights: int,
    floor: float,
    level: float,
    early: bool = False,
) -> Confirmation:
    """Decide from the runs' AL (module docstring); ``history_sd`` the key's
    night-to-night spread (absolute AL) over ``history_nights`` earlier nights,
    ``floor`` the fixed minimum AL effect. ValueError without a run on each side."""
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("a confirmation needs a run on each side")
    squares = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    df_tonight = len(a) + len(b) - 2
    df_history = max(history_nights - 1, 0) if history_sd > 0 else 0
    df = df_tonight + df_history
    variance = (squares + df_history * history_sd**2) / df if df > 0 else 0.0
    se = math.sqrt(variance * (1.0 / len(a) + 1.0 / len(b)))
    estimate = float(a.mean() - b.mean())
    half = t_quantile(0.5 + level / 2.0, df) * se if df > 0 and se > 0 else 0.0
    diff = Interval(estimate=estimate, low=estimate - half, high=estimate + half, level=level)
    mean_b = float(b.mean())
    rel = Interval(
        estimate=estimate / mean_b, low=diff.low / mean_b, high=diff.high / mean_b, level=level
    )
    outcome: ConfirmOutcome = "pass"
    if diff.high < 0 and -estimate >= floor:
        outcome = "regress"
    elif diff.low > 0 and estimate >= floor:
        outcome = "improve"
    return Confirmation(
        candidate=tuple(float(x) for x in a),
        reference=tuple(float(x) for x in b),
        difference=diff,
        relative=rel,
        outcome=outcome,
        floor=floor,
        run_sd=math.sqrt(variance),
        df=df,
        early=early,
    )


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile by its Cornish-Fisher expansion about the normal's (Hill
    1970, ACM Alg. 396): within 0.5% of the exact value from 4 degrees of freedom, the
    fewest a calibrated key gives (five earlier nights)."""
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4.0
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96.0
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384.0
    return z + g1 / df + g2 / df**2 + g3 / df**3


def settled(
    candidate: Sequence[float],
    reference: Sequence[float],
    *,
    history_sd: float,
    history_nights: int,
    floor: float,
    rule: ConfirmRule,
) -> Confirmation | None:
    """A pass decided early (module docstring), or None: rerun another pair (or, after
    the last, :func:`decide`)."""
    if len(reference) < 2 or len(reference) >= rule.runs:
        return None
    looked = decide(
        candidate,
        reference,
        history_sd=history_sd,
        history_nights=history_nights,
        floor=floor,
        level=rule.level,
        early=True,
    )
    if looked.difference.estimate > -floor / 2 or looked.difference.low > -floor:
        return looked.model_copy(update={"outcome": "pass"})
    return None

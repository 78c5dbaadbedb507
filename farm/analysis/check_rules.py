"""What the within-sweep checks return: verdicts, notes, and the rule.

Typed outputs of :mod:`farm.analysis.checks`, kept apart so that reports,
notifications and :mod:`farm.analysis.attribution` can use them without the checks.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np

from farm.analysis.stats import Interval
from farm.axes import AxisValue
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.plan import ServerCell

__all__ = [
    "CheckConfig",
    "CheckKind",
    "CheckReport",
    "CheckVerdict",
    "Direction",
    "Metric",
    "Note",
    "VariantRef",
    "classify_difference",
    "control_false_discoveries",
    "p_value",
]

CheckKind = Literal["graph_vs_eager", "patch_vs_base", "depth_invariance"]
Metric = Literal[
    "mean_acceptance_length", "acceptance_at_position", "accuracy", "greedy_divergence"
]
Direction = Literal["lower", "higher", "either"]


class CheckConfig(Frozen):
    """Significance level, bootstrap size, seed and minimum effects of the checks.

    AL: a difference must reach max(2% of the reference AL, 0.05), so that a large
    sweep does not alert on differences too small to matter. Per position: 0.05
    absolute, a little inside vllm-ascend's per-position golden check (fails beyond
    0.06). Accuracy: 5 points. Greedy divergence: 1 point more prompts diverging than
    the reference.
    """

    level: float = 0.95
    resamples: int = 2000
    seed: int = 0
    min_al_relative: float = 0.02
    min_al_absolute: float = 0.05
    min_position_diff: float = 0.05
    min_accuracy_drop: float = 0.05
    min_divergence_increase: float = 0.01
    control_fdr: bool = True

    def min_al_effect(self, reference_al: float) -> float:
        """The AL difference that matters at this reference AL."""
        return max(self.min_al_relative * reference_al, self.min_al_absolute)

    def rng(self, name: str) -> np.random.Generator:
        """The bootstrap generator of one comparison, named by ``name`` (a comparable
        key's label): stable per comparison (crc32, not ``hash()``), so a figure does
        not depend on the order comparisons are made in, and every use that compares
        the same key draws the same resamples."""
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])


class VariantRef(Frozen):
    """One request-level variant of a server cell: its cell id and comparable key."""

    cell_id: str
    key: ComparableKey
    label: str

    @classmethod
    def of(cls, cell: ServerCell, axes: Mapping[str, AxisValue]) -> VariantRef:
        """The variant of ``cell`` with request-axis values ``axes``."""
        return cls(cell_id=cell.cell_id, key=cell.variant_key(axes), label=cell.variant_label(axes))

    @property
    def engine(self) -> str:
        return self.key.engine

    @property
    def graph_mode(self) -> str:
        """The graph mode the engine ran (the planned one)."""
        return str(self.key.value("graph_mode"))

    @property
    def mtp_depth(self) -> int:
        return int(self.key.value("mtp_depth"))

    def axes(self) -> dict[str, AxisValue]:
        """Axis name -> value, the input shape of :mod:`farm.analysis.attribution`."""
        return self.key.axis_values()


class CheckVerdict(Frozen):
    """The outcome of one comparison; ``difference`` is candidate minus reference."""

    check: CheckKind
    metric: Metric
    position: int | None = None
    candidate: VariantRef
    reference: VariantRef
    candidate_value: Interval
    reference_value: Interval
    difference: Interval
    paired: bool
    pairs: int
    min_effect: float
    direction: Direction
    significant: bool
    regressed: bool
    p_value: float = 1.0
    baseline: str | None = None

    def describe(self) -> str:
        """One line with the cells, the figures and their intervals."""
        metric = self.metric + (f"[{self.position}]" if self.position is not None else "")
        pairing = f"paired over {self.pairs} prompts" if self.paired else "unpaired"
        base = f", spec-off baseline {self.baseline}" if self.baseline else ""
        return (
            f"{self.check}: {metric} of {self.candidate.label} = {self.candidate_value} vs "
            f"{self.reference.label} = {self.reference_value}; difference {self.difference} "
            f"({pairing}{base}; minimum effect {self.min_effect:.3f})"
        )


class Note(Frozen):
    """Why a comparison was not made (failed cell, missing reference, no counters)."""

    check: CheckKind | Literal["input"]
    cells: tuple[str, ...]
    message: str


class CheckReport(Frozen):
    """Every verdict of a sweep and the notes; :attr:`regressions` are the verdicts
    that regressed (each becomes a within-sweep :class:`farm.results.verdict.Finding`)."""

    sweep_id: int
    verdicts: tuple[CheckVerdict, ...]
    notes: tuple[Note, ...]

    @property
    def regressions(self) -> tuple[CheckVerdict, ...]:
        return tuple(v for v in self.verdicts if v.regressed)


def classify_difference(
    diff: Interval, min_effect: float, worse: Direction, significant: bool | None = None
) -> tuple[bool, bool]:
    """(significant, regressed) for a candidate-minus-reference difference.

    Significant: the interval excludes 0, unless the caller decided it for a family
    of comparisons (see :func:`control_false_discoveries`). Regressed: significant,
    on the bad side (``lower``: below 0, ``higher``: above 0, ``either``: any side),
    and the point difference reaches ``min_effect``.
    """
    if significant is None:
        significant = diff.excludes(0.0)
    if worse == "lower":
        bad = diff.estimate < 0 and -diff.estimate >= min_effect
    elif worse == "higher":
        bad = diff.estimate > 0 and diff.estimate >= min_effect
    else:
        bad = abs(diff.estimate) >= min_effect
    return significant, significant and bad


def p_value(diff: Interval) -> float:
    """Two-sided p-value of ``diff`` against 0, recovered from its interval.

    Assumes the sampling distribution is roughly normal, so its standard error is
    the interval's width over ``2 z``; request-level bootstrap differences of AL and
    proportions at >= 30 prompts are close to normal. A zero-width interval means
    both sides were identical on every resample: p is 1 at estimate 0, else 0.
    """
    if not (math.isfinite(diff.low) and math.isfinite(diff.high)):
        return 1.0
    z = NormalDist().inv_cdf(0.5 + diff.level / 2)
    se = (diff.high - diff.low) / (2 * z)
    if se <= 0:
        return 1.0 if diff.estimate == 0 else 0.0
    return math.erfc(abs(diff.estimate) / se / math.sqrt(2))


def control_false_discoveries(p_values: Sequence[float], rate: float) -> list[bool]:
    """Benjamini-Hochberg (1995) step-up: which hypotheses to reject at FDR ``rate``.

    The k smallest p-values are rejected for the largest k with p_(k) <= k * rate / m.
    Valid under independence and positive dependence (Benjamini & Yekutieli 2001),
    which is the case for comparisons sharing a reference cell.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    cutoff = 0
    for rank, i in enumerate(order, start=1):
        if p_values[i] <= rank * rate / m:
            cutoff = rank
    rejected = [False] * m
    for i in order[:cutoff]:
        rejected[i] = True
    return rejected

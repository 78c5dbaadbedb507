"""Pooling the cells a cause shares: a conjunction of axis values tested as one. Pure.

A regression usually spans a conjunction of axis values (every depth-3 cell of one
graph mode), and each cell's run shift is its own: a 2% drop in six cells is far more
evidence than in one, yet each cell alone may stay inside its calibrated threshold.
:func:`check_pooled` tests every conjunction of one or two ``axis=value`` terms over
the axes that vary among the compared keys (engine, model and workload included).

**Each key** (a row of a :class:`~farm.analysis.compare.SweepComparison` that was
compared) gives its relative difference ``x`` (candidate - reference AL, over the
reference: the re-centred window's median where the calibration re-centred it) and
two standard deviations: the run-level one ``u`` (``Threshold.factor x run_sd``, the
judged run's shift and the reference's; 0 for a deterministic engine and under the
prompt-only rule) and the prompt-level one ``b`` (the bootstrap interval's half-widths
with the run-level part taken back out, over ``2 z``). Under a noise rule, a key
without calibration (too few nights) has no known run-level variance and is left out:
pooling it would read its run shift as evidence.

**What is pooled.** A key that regressed alone is named by every conjunction that
covers it but pooled in none: its own finding raises its alert, and a pooled finding
raises the alerts of the others, so its evidence must be theirs. One cell at -15%
beside five clean ones is a finding of its own and leaves five clean cells to pool.
A conjunction is tried when the keys it pools span two server cells or more and it
does not cover every key; conjunctions pooling the same keys are tried once (the one
with fewer terms, axes in their order).

**The pooled effect** is the inverse-variance weighted mean of the pooled keys' ``x``.
Its variance adds the keys' prompt-level variances, independent, and the run-level
sds of each server cell's variants before squaring: the variants (thinking on and off,
workloads) of one cell share one engine process, so their run shift is treated as one
(the conservative bound); the cells' shifts are independent.

**The one-loud-cell guard**, for a cell loud enough to carry a pool but not to regress
alone: a conjunction's statistic ``T`` is the least significant of its pooled z and
the pooled z with each of its server cells left out in turn. The claim is a drop the
cells share, so it must hold without any one of them.

**Error control.** Single-step max-T (Westfall & Young 1993; the simultaneous tests of
R's multcomp, Hothorn, Bretz & Westfall 2008): with no change anywhere every ``T`` is a
function of the same per-key noise, whose joint law is the normal one above, so the
law of ``min T`` over every conjunction tried is drawn by Monte Carlo (``draws``,
fixed seed: the same comparison always gets the same answer). A conjunction's adjusted
p is the share of draws whose ``min T`` is at or below its ``T``; it fires at adjusted
p <= ``alpha`` (family-wise, one-sided, per comparison). The conjunctions nest and
overlap, so this is much less conservative than Bonferroni or Holm over the same count
(16 cells, 32 conjunctions: critical z about -2.5 against Bonferroni's -3.4 at 1%)
with the same guarantee. ``alpha`` 1%: a pooled false alarm about once in a hundred
clean nights, beside the per-key rule's 0.13% per key.

**Minimum pooled effect** 1% of AL (``min_effect``), half the per-cell floor: the floor
says what is worth raising, not what is detectable, and a 1% loss shared by a whole
graph mode or depth is a loss of decode throughput users see across it, where one
cell's 1% is within what prompt order and batching move. The pooled estimate's
standard error falls with the number of cells pooled, so a floor as low as this is
only met where several cells carry it.

**Which conjunctions are reported.** The fired ones in order of ``T`` (most
significant first; then fewer terms); each is kept when the keys it pools beyond the
kept ones still fire on their own (the same statistic and critical value), else it is
explained by them and only noted. A drop in ``mtp_depth=3 AND graph_mode=compiled``
also moves ``mtp_depth=3`` (diluted by its clean half): the narrower is more
significant, kept first, and the rest of the wider one is clean. A drop in all of
``mtp_depth=3`` makes it the most significant, and its halves are inside it.

Each kept conjunction is a ``pooled_drop`` finding naming every cell it covers and
saying which finding raises each cell's alert: a cell that regressed alone keeps its
own (``nightly_vs_last_good``, a PR's ``pr_vs_base``), the others are raised by the
pooled finding (:func:`farm.analysis.alert_rules.alert_candidates`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final

import numpy as np
import numpy.typing as npt

from farm.analysis.attribution import Predicate
from farm.analysis.compare import ComparedVariant, SweepComparison
from farm.axes import AxisValue
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import Finding

__all__ = ["POOLED_CHECK", "PoolReport", "PoolRule", "PooledConjunction", "check_pooled"]

POOLED_CHECK: Final = "pooled_drop"
# A key whose interval has no width (a deterministic engine, an unchanged run) would
# take an infinite weight: its sd is held at this share of AL instead.
_SD_FLOOR: Final = 1e-6
# Null draws held at once (draws x keys): memory stays bounded on large sweeps.
_CHUNK: Final = 2000
_COMPARED: Final = ("pass", "regress", "improve")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class PoolRule(Frozen):
    """How conjunctions of cells are pooled and tested (module docstring).

    ``alpha``: family-wise error over the conjunctions tried, one-sided, per comparison;
    ``min_effect``: the pooled relative drop it must reach; ``max_terms``: 1 or 2 terms
    per conjunction; ``draws`` / ``seed``: the Monte Carlo of the max-T null law.
    """

    alpha: float = 0.01
    min_effect: float = 0.01
    max_terms: int = 2
    draws: int = 10_000
    seed: int = 0


class PooledConjunction(Frozen):
    """One conjunction tested: the keys and server cells it covers, those of its keys
    that regressed alone (named, not pooled), the pooled relative effect of the others
    over ``pooled_cells`` cells with its interval at ``level``, ``z`` (pooled),
    ``statistic`` (the least significant of ``z`` and each cell left out), ``least``
    (the pooled effect without the cell whose absence weakens it most) and the max-T
    adjusted p."""

    terms: tuple[Predicate, ...]
    keys: tuple[ComparableKey, ...]
    cells: tuple[str, ...]
    alone: tuple[ComparableKey, ...]
    pooled_cells: int
    estimate: float
    low: float
    high: float
    level: float
    z: float
    statistic: float
    least: float
    adjusted_p: float

    @property
    def conjunction(self) -> str:
        return " AND ".join(str(t) for t in self.terms)


class PoolReport(Frozen):
    """What :func:`check_pooled` found: ``findings`` (one per kept conjunction),
    ``notes``, ``checked`` ((check, key label) of each key a pool judged and no kept
    finding covers), ``tried`` (conjunctions), ``critical`` (the family's critical
    value of the statistic; None: nothing tried), every conjunction that fired, kept
    or explained, most significant first, and the most significant tried, fired or
    not."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    checked: frozenset[tuple[str, str]] = frozenset()
    tried: int = 0
    critical: float | None = None
    fired: tuple[PooledConjunction, ...] = ()
    strongest: PooledConjunction | None = None


@dataclass(frozen=True)
class _Units:
    """The usable keys, as arrays: relative difference, prompt-level and run-level sd,
    the index of each key's server cell, and whether it regressed alone."""

    rows: tuple[ComparedVariant, ...]
    x: FloatArray
    b: FloatArray
    u: FloatArray
    cell: IntArray
    cell_ids: tuple[str, ...]
    alone: BoolArray


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def _unit(row: ComparedVariant) -> tuple[float, float, float] | None:
    """(x, b, u) of a compared row, relative to its reference level; None when it has
    no figures or its run-level variance is unknown (a noise rule without history)."""
    d, base, t = row.difference, row.baseline_al, row.threshold
    if row.outcome not in _COMPARED or d is None or base is None or row.cell_id is None:
        return None
    if t is not None and not t.calibrated:
        return None
    level = t.centre if t is not None and t.centre is not None else base.estimate
    if level <= 0:
        return None
    run = t.factor * t.run_sd if t is not None else 0.0
    z = _z(d.level)
    # The calibration widened each side by the run-level variance: take it back out.
    sides = (d.estimate - d.low, d.high - d.estimate)
    prompt = sum(math.sqrt(max(s**2 - (z * run) ** 2, 0.0)) for s in sides) / (2.0 * z)
    return d.estimate / level, max(prompt / level, _SD_FLOOR), run / level


def _units(comparison: SweepComparison, leave_out: Collection[str]) -> tuple[_Units, int]:
    """The rows pooling can use, and how many compared rows it left out for want of a
    known run-level variance."""
    rows, values, unknown = [], [], 0
    for row in comparison.rows:
        if row.key.label in leave_out:
            continue
        unit = _unit(row)
        if unit is None:
            unknown += row.threshold is not None and row.outcome in _COMPARED
            continue
        rows.append(row)
        values.append(unit)
    cell_ids = tuple(dict.fromkeys(r.cell_id or "" for r in rows))
    arr = np.asarray(values, dtype=np.float64).reshape(-1, 3)
    units = _Units(
        rows=tuple(rows),
        x=arr[:, 0],
        b=arr[:, 1],
        u=arr[:, 2],
        cell=np.asarray([cell_ids.index(r.cell_id or "") for r in rows], dtype=np.int64),
        cell_ids=cell_ids,
        alone=np.asarray([r.outcome == "regress" for r in rows], dtype=np.bool_),
    )
    return units, unknown


def _conjunctions(
    units: _Units, max_terms: int
) -> list[tuple[tuple[Predicate, ...], IntArray, IntArray]]:
    """Every conjunction tried (module docstring): its terms, the keys it covers and
    the keys it pools."""
    values = [r.key.axis_values() for r in units.rows]
    axes: dict[str, list[AxisValue]] = {}
    for v in values:
        for name, value in v.items():
            seen = axes.setdefault(name, [])
            if value not in seen:
                seen.append(value)
    terms = [
        (Predicate(axis=name, op="==", value=value), name)
        for name, seen in axes.items()
        if len(seen) > 1
        for value in seen
    ]
    masks = {t: np.asarray([t.matches(v) for v in values]) for t, _ in terms}
    out, pooled_sets = [], set()
    for n in range(1, max_terms + 1):
        for combo in itertools.combinations(terms, n):
            if len({axis for _, axis in combo}) < n:
                continue
            covered = np.flatnonzero(np.logical_and.reduce([masks[t] for t, _ in combo]))
            pooled = covered[~units.alone[covered]]
            if len(covered) == len(values) or len(set(units.cell[pooled].tolist())) < 2:
                continue
            if (fingerprint := pooled.tobytes()) not in pooled_sets:
                pooled_sets.add(fingerprint)
                out.append((tuple(t for t, _ in combo), covered, pooled))
    return out


@dataclass(frozen=True)
class _Pool:
    """One set of keys ready to pool: their indices grouped by server cell, weights
    and the standard deviations of the pooled mean and of each cell left out."""

    idx: IntArray
    starts: IntArray
    w: FloatArray
    total: float
    left: FloatArray  # total weight with each cell left out
    sd: float
    sd_left: FloatArray

    @classmethod
    def of(cls, units: _Units, idx: IntArray) -> _Pool:
        idx = idx[np.argsort(units.cell[idx], kind="stable")]
        cells = units.cell[idx]
        starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        b, u = units.b[idx], units.u[idx]
        w = 1.0 / (b**2 + u**2)
        # Per cell: prompt-level variances add; run-level sds of its variants add first.
        prompt_c = np.add.reduceat(w**2 * b**2, starts)
        run_c = np.add.reduceat(w * u, starts) ** 2
        total = float(w.sum())
        left = total - np.add.reduceat(w, starts)
        var = prompt_c.sum() + run_c.sum()
        return cls(
            idx=idx,
            starts=starts,
            w=w,
            total=total,
            left=left,
            sd=math.sqrt(var) / total,
            sd_left=np.sqrt(np.maximum(var - prompt_c - run_c, 0.0)) / left,
        )

    def statistic(self, x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """For rows of per-key differences ``x`` (draws x keys): the pooled estimate,
        its z, and the statistic (the least significant of the pooled z and each cell
        left out)."""
        xw = x[:, self.idx] * self.w
        s = xw.sum(axis=1)
        z_left = (s[:, None] - np.add.reduceat(xw, self.starts, axis=1)) / self.left / self.sd_left
        estimate = s / self.total
        z = estimate / self.sd
        return estimate, z, np.maximum(z, z_left.max(axis=1))

    def least(self, x: FloatArray) -> float:
        """The pooled estimate without the cell whose absence weakens it most."""
        xw = x[self.idx] * self.w
        left = (xw.sum() - np.add.reduceat(xw, self.starts)) / self.left
        return float(left[int(np.argmax(left / self.sd_left))])


def _null_minimum(units: _Units, pools: Sequence[_Pool], rule: PoolRule) -> FloatArray:
    """The sorted Monte Carlo law of min T over ``pools`` with no change anywhere."""
    rng = np.random.default_rng(rule.seed)
    out = []
    for start in range(0, rule.draws, _CHUNK):
        n = min(_CHUNK, rule.draws - start)
        noise = rng.standard_normal((n, len(units.x))) * units.b
        shift = rng.standard_normal((n, len(units.cell_ids)))
        noise += shift[:, units.cell] * units.u
        lowest = np.full(n, np.inf)
        for pool in pools:
            lowest = np.minimum(lowest, pool.statistic(noise)[2])
        out.append(lowest)
    return np.sort(np.concatenate(out))


def check_pooled(
    comparison: SweepComparison,
    rule: PoolRule,
    *,
    cell_check: str,
    baseline_sweep_id: int | None = None,
    leave_out: Collection[str] = (),
) -> PoolReport:
    """Pool the compared keys of ``comparison`` over every conjunction of axis values
    and test each (module docstring). ``cell_check``: the check name of a single key's
    drop in the same comparison (the finding that raises the alert of a key that
    regressed alone); ``baseline_sweep_id``: set on the findings (a nightly's last good
    night); ``leave_out``: key labels pooled with nothing (quarantined keys)."""
    units, unknown = _units(comparison, leave_out)
    notes = []
    if unknown:
        notes.append(
            f"pooled: {unknown} key(s) without a calibrated run-level variance (too few "
            "nights) left out of every pool"
        )
    conjunctions = _conjunctions(units, rule.max_terms)
    if not conjunctions:
        return PoolReport(notes=tuple(notes))
    pools = [_Pool.of(units, pooled) for _, _, pooled in conjunctions]
    null = _null_minimum(units, pools, rule)
    critical = float(np.quantile(null, rule.alpha, method="inverted_cdf"))
    tested = [
        _tested(terms, covered, pool, units, null, comparison.level)
        for (terms, covered, _), pool in zip(conjunctions, pools, strict=True)
    ]
    fired = sorted(
        (c for c in tested if c.adjusted_p <= rule.alpha and c.estimate <= -rule.min_effect),
        key=lambda c: (c.statistic, len(c.terms), c.conjunction),
    )
    kept, explained = _keep(units, fired, critical, rule)
    strongest = min(tested, key=lambda c: (c.statistic, c.z))
    notes.append(
        f"pooled: {len(tested)} conjunction(s) of 1-{rule.max_terms} axis values over "
        f"{len(units.cell_ids)} cells tried, family-wise {rule.alpha:.0%} (max-T, critical "
        f"z {critical:.2f}): {len(kept)} finding(s); strongest {strongest.conjunction} "
        f"{strongest.estimate:+.1%}, adjusted p {strongest.adjusted_p:.3f}"
    )
    notes += [
        f"pooled: {c.conjunction} ({c.estimate:+.1%}) explained by {by}" for c, by in explained
    ]
    named = {k for c in kept for k in c.keys}
    return PoolReport(
        findings=tuple(
            _finding(c, units, len(tested), critical, rule, cell_check, baseline_sweep_id)
            for c in kept
        ),
        notes=tuple(notes),
        checked=frozenset(
            (POOLED_CHECK, units.rows[i].key.label)
            for pool in pools
            for i in pool.idx
            if units.rows[i].key not in named
        ),
        tried=len(tested),
        critical=critical,
        fired=tuple(fired),
        strongest=strongest,
    )


def _tested(
    terms: tuple[Predicate, ...],
    covered: IntArray,
    pool: _Pool,
    units: _Units,
    null: FloatArray,
    level: float,
) -> PooledConjunction:
    """One conjunction's figures on the night's differences."""
    estimate, z, stat = (float(a[0]) for a in pool.statistic(units.x[None, :]))
    half = _z(level) * pool.sd
    return PooledConjunction(
        terms=terms,
        keys=tuple(units.rows[i].key for i in covered),
        cells=tuple(dict.fromkeys(units.cell_ids[c] for c in units.cell[covered])),
        alone=tuple(units.rows[i].key for i in covered if units.alone[i]),
        pooled_cells=len(set(units.cell[pool.idx].tolist())),
        estimate=estimate,
        low=estimate - half,
        high=estimate + half,
        level=level,
        z=z,
        statistic=stat,
        least=pool.least(units.x),
        adjusted_p=(1 + int(np.searchsorted(null, stat, side="right"))) / (1 + len(null)),
    )


def _keep(
    units: _Units, fired: Sequence[PooledConjunction], critical: float, rule: PoolRule
) -> tuple[list[PooledConjunction], list[tuple[PooledConjunction, str]]]:
    """The fired conjunctions worth reporting, most significant first: each kept while
    the keys it pools beyond the kept ones fire on their own; the others with the
    kept conjunctions that explain them."""
    index = {r.key: i for i, r in enumerate(units.rows)}
    kept: list[PooledConjunction] = []
    explained: list[tuple[PooledConjunction, str]] = []
    for c in fired:
        named = {k for other in kept for k in other.keys}
        pooled = [k for k in c.keys if not units.alone[index[k]]]
        rest = np.asarray([index[k] for k in pooled if k not in named], dtype=np.int64)
        if len(rest) == len(pooled) or _fires(units, rest, critical, rule):
            kept.append(c)
            continue
        by = [other.conjunction for other in kept if set(other.keys) & set(c.keys)]
        explained.append((c, " and ".join(by)))
    return kept, explained


def _fires(units: _Units, idx: IntArray, critical: float, rule: PoolRule) -> bool:
    """Whether the keys ``idx`` pooled alone meet the rule (two cells or more)."""
    if len(set(units.cell[idx].tolist())) < 2:
        return False
    estimate, _, stat = (float(a[0]) for a in _Pool.of(units, idx).statistic(units.x[None, :]))
    return stat <= critical and estimate <= -rule.min_effect


def _finding(
    c: PooledConjunction,
    units: _Units,
    tried: int,
    critical: float,
    rule: PoolRule,
    cell_check: str,
    baseline_sweep_id: int | None,
) -> Finding:
    index = {r.key: i for i, r in enumerate(units.rows)}
    alone = [units.rows[index[k]].label for k in c.alone]
    beside = f" beside {len(alone)} that regressed alone" if alone else ""
    raised = f"this pooled finding for its {len(c.keys) - len(alone)} pooled variant(s)"
    if alone:
        raised += f"; their own {cell_check} findings for " + ", ".join(alone)
    summary = (
        f"{c.conjunction}: {c.estimate:+.1%} over {c.pooled_cells} cells "
        f"[{100 * c.low:.1f}, {100 * c.high:.1f}]{beside} ({c.level:.0%} interval, AL "
        f"relative to the baseline); adjusted p {c.adjusted_p:.4f} over {tried} "
        f"conjunctions (max-T, family-wise {rule.alpha:.0%}); with any one cell left out "
        f"still {c.least:+.1%} (z {c.statistic:.2f} <= {critical:.2f}); cells: "
        + ", ".join(c.cells)
        + f"; alerts: {raised}"
    )
    return Finding(
        source="pooled",
        check=POOLED_CHECK,
        label=c.conjunction,
        keys=c.keys,
        cells=c.cells,
        metric="mean_acceptance_length",
        summary=summary,
        relative=c.estimate,
        baseline_sweep_id=baseline_sweep_id,
        figures=tuple(_figure(units.rows[index[k]], float(units.x[index[k]])) for k in c.keys),
    )


def _figure(row: ComparedVariant, relative: float) -> AlertFigure:
    """One key's own comparison, as its alert shows it."""
    assert row.candidate_al is not None and row.baseline_al is not None
    assert row.difference is not None
    d, cand, base = row.difference, row.candidate_al, row.baseline_al
    return AlertFigure(
        metric="mean_acceptance_length",
        candidate=row.label,
        reference=row.baseline_label or row.label,
        candidate_value=FigureInterval.of(cand.estimate, cand.low, cand.high, cand.level),
        reference_value=FigureInterval.of(base.estimate, base.low, base.high, base.level),
        difference=FigureInterval.of(d.estimate, d.low, d.high, d.level),
        relative=relative,
        paired=row.paired,
        pairs=row.pairs,
        min_effect=row.min_effect,
    )

"""Change points in a cell's acceptance over successive sweeps (nightlies).

A series is keyed by :class:`farm.comparable.ComparableKey` (what makes results
comparable across builds, never build or sweep id). Its points are per-sweep AL
estimates.

Detection is a swappable :class:`ChangePointTest`:

- :class:`EDivisive` (default): hierarchical e-divisive with the energy statistic of
  Matteson & James (2014, JASA 109:334), as used by MongoDB's
  ``signal-processing-algorithms`` and Apache Otava; each split is accepted by a
  permutation test. Implemented here on numpy because that package pins numpy < 2,
  pulls in gevent and subprocess at import and shuffles with the global numpy RNG;
  this one takes an explicit ``numpy.random.Generator``, so results are reproducible.
- :class:`WindowedTTest`: Welch's t-test between the ``window`` points before and
  after each index, keeping local minima of the p-value (Perfherder-style).

A change point becomes an alert only if it is a *drop* of at least
``min_relative_drop`` (default 2% of the mean before it, the checks' AL floor) and it
is *confirmed*: the new level holds for ``confirm`` consecutive sweeps (default 2),
each below the old mean, so a single bad night does not page anyone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np
import numpy.typing as npt

from farm.analysis.stats import AcceptanceSample, acceptance_stats
from farm.axes import speculates
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.records import BuildInfo, RequestRecord, SweepRecord

__all__ = [
    "HISTORY_RESAMPLES",
    "ChangePoint",
    "ChangePointTest",
    "EDivisive",
    "HistoryAnalysis",
    "HistoryConfig",
    "HistoryFigures",
    "HistoryPoint",
    "WindowedTTest",
    "al_interval",
    "analyze_histories",
    "analyze_history",
    "engine_builds",
    "history_figures",
    "series_from_figures",
    "series_from_sweeps",
    "welch_pvalue",
]

FloatArray = npt.NDArray[np.float64]


class HistoryPoint(Frozen):
    """One sweep's AL for a key; ``low``/``high`` its interval when known; ``builds``
    the ids of the key's engine builds that sweep ran (empty: not known)."""

    sweep_id: int
    timestamp: datetime
    value: float
    low: float | None = None
    high: float | None = None
    builds: tuple[str, ...] = ()


class ChangePoint(Frozen):
    """A level shift starting at point ``index`` (the first point of the new level).

    ``pvalue``: Welch's t-test between the segments either side (nan when neither
    side has two points); ``detection_pvalue``: the strategy's own p-value.
    """

    index: int
    sweep_id: int
    timestamp: datetime
    before_mean: float
    after_mean: float
    before_n: int
    after_n: int
    relative_change: float
    pvalue: float
    detection_pvalue: float
    confirmed: bool
    meets_min_effect: bool

    @property
    def is_drop(self) -> bool:
        return self.after_mean < self.before_mean

    @property
    def alert(self) -> bool:
        """A confirmed drop of at least the minimum effect: an alert candidate."""
        return self.is_drop and self.confirmed and self.meets_min_effect


class HistoryAnalysis(Frozen):
    """Change points of one series, with the alert candidates among them."""

    key: ComparableKey | None
    points: int
    change_points: tuple[ChangePoint, ...]

    @property
    def alerts(self) -> tuple[ChangePoint, ...]:
        return tuple(c for c in self.change_points if c.alert)


class HistoryConfig(Frozen):
    """Minimum relative AL drop and confirmation length for an alert."""

    min_relative_drop: float = 0.02
    confirm: int = 2
    seed: int = 0


class ChangePointTest(Protocol):
    """Finds change points: sorted (index of first new point, p-value) pairs."""

    def find(self, values: FloatArray, rng: np.random.Generator) -> list[tuple[int, float]]: ...


def _energy(values: FloatArray, min_size: int) -> tuple[int, float]:
    """Best split of ``values`` by the energy statistic (V-statistic form, alpha = 1).

    For X = values[:t], Y = values[t:], E = 2 mean|X-Y| - mean|X-X'| - mean|Y-Y'| and
    the statistic is t(n-t)/n * E; block sums come from a 2-D prefix sum, so all
    splits cost O(n^2) together.
    """
    n = len(values)
    if n < 2 * min_size:
        return -1, 0.0
    d = np.abs(values[:, None] - values[None, :])
    p = np.zeros((n + 1, n + 1))
    p[1:, 1:] = d.cumsum(0).cumsum(1)
    t = np.arange(min_size, n - min_size + 1)
    m = n - t
    x = p[t, t]
    y = p[n, n] - p[t, n] - p[n, t] + p[t, t]
    xy = p[t, n] - p[t, t]
    e = 2 * xy / (t * m) - x / t**2 - y / m**2
    stat = t * m / n * e
    best = int(np.argmax(stat))
    return int(t[best]), float(stat[best])


@dataclass(frozen=True)
class EDivisive:
    """Hierarchical e-divisive (Matteson & James 2014) with a permutation test.

    Each round splits the segment whose best split has the largest statistic and
    keeps it if a permutation test (values shuffled within each current segment, as
    in MongoDB's implementation) gives p = (b + 1) / (permutations + 1) <=
    ``max_pvalue`` (Phipson & Smyth 2010). 199 permutations resolve p down to 0.005;
    ``max_pvalue = 0.05`` because the minimum-effect and confirmation rules, not the
    test alone, decide alerts. ``min_size = 1`` lets a one-night dip be isolated
    (and then discarded by the confirmation rule) instead of bending a segment mean.
    """

    max_pvalue: float = 0.05
    permutations: int = 199
    min_size: int = 1

    def find(self, values: FloatArray, rng: np.random.Generator) -> list[tuple[int, float]]:
        """Change point indices with their permutation p-values, sorted by index."""
        found: list[tuple[int, float]] = []
        while True:
            bounds = [0, *sorted(i for i, _ in found), len(values)]
            segments = list(itertools.pairwise(bounds))
            best_at, best_stat = -1, 0.0
            for a, b in segments:
                at, stat = _energy(values[a:b], self.min_size)
                if at > 0 and stat > best_stat:
                    best_at, best_stat = a + at, stat
            if best_at < 0 or best_stat <= 0:
                break
            exceed = 0
            for _ in range(self.permutations):
                shuffled = max(
                    _energy(rng.permutation(values[a:b]), self.min_size)[1] for a, b in segments
                )
                exceed += shuffled >= best_stat
            pvalue = (exceed + 1) / (self.permutations + 1)
            if pvalue > self.max_pvalue:
                break
            found.append((best_at, pvalue))
        return sorted(found)


@dataclass(frozen=True)
class WindowedTTest:
    """Welch's t-test of the ``window`` points before vs after each index.

    Keeps indices whose p-value is <= ``max_pvalue`` and the smallest within
    ``window`` of each other. Needs at least two points on each side, so it sees a
    change two sweeps late at the earliest - the same as the confirmation rule.
    """

    window: int = 5
    max_pvalue: float = 0.01

    def find(self, values: FloatArray, rng: np.random.Generator) -> list[tuple[int, float]]:
        """Change point indices with their Welch p-values (``rng`` is unused)."""
        del rng
        n = len(values)
        scored = []
        for k in range(2, n - 1):
            p = welch_pvalue(values[max(0, k - self.window) : k], values[k : k + self.window])
            if p <= self.max_pvalue:
                scored.append((p, k))
        kept: list[tuple[int, float]] = []
        for p, k in sorted(scored):
            if all(abs(k - j) >= self.window for j, _ in kept):
                kept.append((k, p))
        return sorted(kept)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by Lentz's continued fraction
    (Numerical Recipes, 3rd ed., section 6.4); accurate to ~1e-12 here."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = (
        math.exp(
            math.lgamma(a + b)
            - math.lgamma(a)
            - math.lgamma(b)
            + a * math.log(x)
            + b * math.log1p(-x)
        )
        / a
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * f


def welch_pvalue(x: FloatArray, y: FloatArray) -> float:
    """Two-sided p-value of Welch's unequal-variance t-test (Welch 1947).

    With a single point on one side, it is a prediction test of that point against
    the other side (t = diff / (s * sqrt(1 + 1/n)), n - 1 degrees of freedom). nan
    when neither side has two points; 0 or 1 when both sides have no spread.
    """
    nx, ny = len(x), len(y)
    if nx < 2 and ny < 2:
        return float("nan")
    diff = float(np.mean(y) - np.mean(x))
    if nx < 2 or ny < 2:
        many = y if nx < 2 else x
        se = float(np.std(many, ddof=1)) * math.sqrt(1 + 1 / len(many))
        df = len(many) - 1.0
    else:
        vx, vy = float(np.var(x, ddof=1)) / nx, float(np.var(y, ddof=1)) / ny
        se = math.sqrt(vx + vy)
        df = (vx + vy) ** 2 / (
            (vx**2 / (nx - 1) if vx else 0) + (vy**2 / (ny - 1) if vy else 0) or 1.0
        )
    if se == 0.0:
        return 0.0 if diff != 0.0 else 1.0
    t = abs(diff) / se
    return _betainc(df / 2, 0.5, df / (df + t * t))


def analyze_history(
    points: Sequence[HistoryPoint],
    *,
    key: ComparableKey | None = None,
    test: ChangePointTest | None = None,
    config: HistoryConfig | None = None,
    rng: np.random.Generator | None = None,
) -> HistoryAnalysis:
    """Change points of one key's series (points are sorted by timestamp first).

    ``rng`` defaults to ``numpy.random.default_rng(config.seed)``. Returns every
    change point found, increases included; ``HistoryAnalysis.alerts`` keeps the
    confirmed drops of at least the minimum effect.
    """
    cfg = config or HistoryConfig()
    ordered = sorted(points, key=lambda p: (p.timestamp, p.sweep_id))
    values = np.array([p.value for p in ordered], dtype=np.float64)
    found = (test or EDivisive()).find(values, rng or np.random.default_rng(cfg.seed))
    bounds = [0, *(i for i, _ in found), len(values)]
    changes = []
    for j, (index, det_p) in enumerate(found):
        before, after = values[bounds[j] : index], values[index : bounds[j + 2]]
        mean_b, mean_a = float(before.mean()), float(after.mean())
        rel = (mean_a - mean_b) / mean_b if mean_b else float("nan")
        head = after[: cfg.confirm]
        persists = len(head) >= cfg.confirm and bool(np.all(head < mean_b))
        changes.append(
            ChangePoint(
                index=index,
                sweep_id=ordered[index].sweep_id,
                timestamp=ordered[index].timestamp,
                before_mean=mean_b,
                after_mean=mean_a,
                before_n=len(before),
                after_n=len(after),
                relative_change=rel,
                pvalue=welch_pvalue(before, after),
                detection_pvalue=det_p,
                confirmed=persists if mean_a < mean_b else len(head) >= cfg.confirm,
                meets_min_effect=abs(rel) >= cfg.min_relative_drop,
            )
        )
    return HistoryAnalysis(key=key, points=len(values), change_points=tuple(changes))


def analyze_histories(
    series: Mapping[ComparableKey, Sequence[HistoryPoint]],
    *,
    test: ChangePointTest | None = None,
    config: HistoryConfig | None = None,
) -> tuple[HistoryAnalysis, ...]:
    """:func:`analyze_history` for every key, in key order; each key gets its own
    generator seeded from ``config.seed`` and the key, so adding a key changes nothing
    for the others."""
    cfg = config or HistoryConfig()
    out = []
    for key in sorted(series, key=str):
        rng = np.random.default_rng([cfg.seed, *str(key).encode()])
        out.append(analyze_history(series[key], key=key, test=test, config=cfg, rng=rng))
    return tuple(out)


HISTORY_RESAMPLES = 1000
"""Bootstrap resamples of a history point's AL interval (a trend band, not a test)."""


class HistoryFigures(Frozen):
    """One variant of a stored sweep as history needs it: the store keeps these per
    variant (``variant_summary``), so history over many sweeps reads no request row.

    ``low``/``high``: :func:`al_interval` of the variant's requests (None without
    per-request counters); ``builds``: the sweep's builds of the cell's engine.
    """

    sweep_id: int
    timestamp: datetime
    key: ComparableKey
    cell_status: str
    mtp_depth: int
    mean_acceptance_length: float | None
    low: float | None = None
    high: float | None = None
    builds: tuple[str, ...] = ()


def al_interval(
    requests: Sequence[RequestRecord],
    sweep_id: int,
    *,
    resamples: int = HISTORY_RESAMPLES,
    seed: int = 0,
) -> tuple[float | None, float | None]:
    """Request-level bootstrap interval of a variant's AL, as history points carry it.

    ``requests`` in stored order (by prompt id, then as run: the bootstrap draws by
    row); the generator is seeded with ``(seed, sweep_id)``, so the store can compute
    it when the variant is saved and get what a later read would. (None, None)
    without per-request counters or drafts.
    """
    sample = AcceptanceSample.from_requests(requests)
    if not len(sample) or sample.drafts.sum() <= 0:
        return None, None
    stats = acceptance_stats(
        sample, rng=np.random.default_rng([seed, sweep_id]), resamples=resamples
    )
    if stats.mean_acceptance_length is None:
        return None, None
    return stats.mean_acceptance_length.low, stats.mean_acceptance_length.high


def history_figures(
    sweep: SweepRecord, *, resamples: int = HISTORY_RESAMPLES, seed: int = 0
) -> tuple[HistoryFigures, ...]:
    """:class:`HistoryFigures` of every variant of ``sweep``'s cells that have results."""
    out = []
    for stored in sweep.cells:
        c, result = stored.cell, stored.result
        if result is None:
            continue
        builds = engine_builds(sweep.builds, c.engine)
        for v in result.variants:
            low, high = al_interval(v.requests, sweep.sweep_id, resamples=resamples, seed=seed)
            out.append(
                HistoryFigures(
                    sweep_id=sweep.sweep_id,
                    timestamp=sweep.started_at,
                    key=c.variant_key(v.axes),
                    cell_status=result.status,
                    mtp_depth=c.mtp_depth,
                    mean_acceptance_length=v.counters.mean_acceptance_length,
                    low=low,
                    high=high,
                    builds=builds,
                )
            )
    return tuple(out)


def engine_builds(builds: Iterable[BuildInfo], engine: str) -> tuple[str, ...]:
    """The ids of ``engine``'s builds among a sweep's ``builds``, sorted (one, unless a
    sweep ran an engine from several builds)."""
    return tuple(sorted({b.build_id for b in builds if b.engine == engine}))


def series_from_figures(
    figures: Iterable[HistoryFigures],
) -> dict[ComparableKey, tuple[HistoryPoint, ...]]:
    """Per-key AL series: speculation-on variants of ok cells, each a point with its
    interval. Keys use the cell's engine name and family, never the build or sweep."""
    series: dict[ComparableKey, list[HistoryPoint]] = {}
    for f in figures:
        if f.cell_status != "ok" or not speculates(f.mtp_depth) or f.mean_acceptance_length is None:
            continue
        series.setdefault(f.key, []).append(
            HistoryPoint(
                sweep_id=f.sweep_id,
                timestamp=f.timestamp,
                value=f.mean_acceptance_length,
                low=f.low,
                high=f.high,
                builds=f.builds,
            )
        )
    return {k: tuple(sorted(v, key=lambda p: (p.timestamp, p.sweep_id))) for k, v in series.items()}


def series_from_sweeps(
    sweeps: Sequence[SweepRecord], *, resamples: int = HISTORY_RESAMPLES, seed: int = 0
) -> dict[ComparableKey, tuple[HistoryPoint, ...]]:
    """Per-key AL series over ``sweeps`` (:func:`series_from_figures`); the interval
    is a request-level bootstrap when per-request counters exist. For stored sweeps
    ``farm.store.history_series`` gives the same from the per-variant summaries."""
    return series_from_figures(
        f for sweep in sweeps for f in history_figures(sweep, resamples=resamples, seed=seed)
    )

"""Pooled attribution (farm/analysis/pooling.py) on first nights: power and false alarms.

    python bench/pooling.py [--replicates N] [--clean N] [--resamples B] [--seed S]

Synthetic nights (tests/fakes/simulate.py) of a 16-cell matrix, thinking on: engine
{main, patched} x graph mode {eager, compiled} x MTP depth {1, 3} x sliding window {on,
off}. Each night keeps the replicate's prompts (the same prompt file), draws fresh
token-level noise, and shifts each cell's AL by its own run-level shift, sd 1.72% of
AL (the measured default, thinking on: bench/data/recorded-noise, docs/detection.md).
Each key's history is 19 earlier nights (the run shift and a night's token-level
spread) and the last good night, so the calibration (farm/analysis/noise.py) reads its
spread and re-centres it as on a real job. The judged night is judged as `farm
nightly` judges it (judge() with night_rules(): the comparison with the last good
night, calibrated thresholds, history, pooling; the within-sweep, over-the-run and
prefix-cache checks are off: they do not see a drop shared by both ends' builds).

Prompt counts: 32, the nightly's own (jobs/local.yaml and jobs/noise-calibration.yaml
run 32 prompts of arith-mix; AIME25, jobs/nightly-ascend.yaml's Step-3.5 workload, is
30 problems), and 200.

(a) First-night power of a 2% AL drop in 1 cell, in 4 (engine=patched AND mtp_depth=3)
    and in 8 (engine=patched): the share of nights with a pooled finding on a fallen
    cell, with exactly the true conjunction, with only fallen cells named; the share
    where some fallen cell regressed alone (its own nightly_vs_last_good finding); and
    the share where either raised an alert on a fallen cell. The same nights (prompts,
    run shifts, token noise) serve every row of one prompt count.
(b) False alarms per clean night: nights with a pooled finding, with a Wilson 95%
    interval; per-cell findings beside them.

Measured (`python bench/pooling.py`, seed 0: about 6 CPU-minutes):

    (a) First-night power of a 2% AL drop, run-level sd 1.72% of AL, 100 nights per row
       prompts fallen    pooled   exact only fallen cell alone any alert
            32 1 cell        0%       -          0%         8%        8%
            32 4 cells       1%      0%          0%        26%       27%
            32 8 cells      14%      8%          9%        31%       42%
           200 1 cell        0%       -          0%         3%        3%
           200 4 cells       5%      3%          3%        16%       20%
           200 8 cells      35%     25%         31%        30%       56%

    (b) Clean nights (no drop), run-level sd 1.72% of AL
       prompts nights            pooled false alarms  cell false alarms
            32    300             1 (0.3%, 0.1-1.9%)         39 (13.0%)
           200    300             2 (0.7%, 0.2-2.4%)         32 (10.7%)

Without run-level shifts (`--run-sd 0 --replicates 50 --clean 50 --prompts 32`; the
history still carries each night's token-level spread, about 1% of AL at 32 prompts):
8 cells 30% pooled (26% exact), 66% any alert; 4 cells 0% pooled; 0 of 50 clean nights.

Why not more: at 32 prompts a key's difference has an sd of about 2.4% of AL (1.85%
run-level: the judged night's shift and the baseline window's median, 1.5% from the
prompts), so a 2% drop is 0.85 sd per cell and pooled over 8 cells about 2.4 sd before
any guard, against a family critical z of about -2.5; even with no prompt noise at all
the run-level part alone holds 8 cells at 3.1 sd. What the guards cost on top: a
fallen cell that regressed alone leaves the pool (its own finding raises it), and each
cell must be dispensable. The 20 recorded clean nights (bench/data/recorded-noise)
hold one server cell: pooling has no conjunction to try there and found nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import numpy.typing as npt

# The synthetic sweeps are a test double (tests/fakes/simulate.py), not part of the
# farm package: the bench imports it from the repository it runs in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from farm.analysis.check_rules import CheckConfig
from farm.analysis.history import HistoryPoint
from farm.analysis.judgement import BASELINE_CHECK, POOLED_CHECK, JudgeRules, judge
from farm.analysis.rules import night_rules
from farm.comparable import ComparableKey
from farm.plan import ServerCell, Variant
from farm.records import SweepRecord
from tests.fakes.simulate import expected_al, prompt_acceptance, simulate_sweep

MEAN, CONC = 0.8, 8.0
RUN_SD = 0.0172
DROP = 0.02
HISTORY = 19  # earlier nights before the last good one
AXES = ("engine", "graph_mode", "mtp_depth", "sliding_window")
# Cells of one row: (label, predicate on a server cell's axes).
FALLEN: tuple[tuple[str, dict[str, object]], ...] = (
    (
        "1 cell",
        {"engine": "patched", "graph_mode": "compiled", "mtp_depth": 3, "sliding_window": "on"},
    ),
    ("4 cells", {"engine": "patched", "mtp_depth": 3}),
    ("8 cells", {"engine": "patched"}),
)
TRUE_CONJUNCTION = {"4 cells": "engine=patched AND mtp_depth=3", "8 cells": "engine=patched"}
FloatArray = npt.NDArray[np.float64]


def _factor(depth: int, change: float) -> float:
    """The multiplier on every prompt's acceptance that moves the population AL by
    ``change`` (relative, either sign; clipping at 1 aside)."""
    target = expected_al(MEAN, CONC, depth) * (1 + change)
    lo, hi = 0.0, 1.5
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_al(MEAN, CONC, depth, mid) < target else (lo, mid)
    return (lo + hi) / 2


def _cell_name(axes: Mapping[str, object]) -> tuple[object, ...]:
    return tuple(axes[a] for a in AXES)


def _night(
    p: FloatArray,
    shifts: Mapping[tuple[object, ...], float],
    fallen: Mapping[str, object] | None,
    sweep_id: int,
    rng: np.random.Generator,
) -> SweepRecord:
    """One night: each cell's run shift, and the drop where ``fallen`` matches."""

    def effect(cell: ServerCell, v: Variant) -> float:
        hit = fallen is not None and all(cell.axes[k] == x for k, x in fallen.items())
        return _factor(cell.mtp_depth, shifts[_cell_name(cell.axes)] - (DROP if hit else 0.0))

    return simulate_sweep(
        rng=rng,
        engines=("main", "patched"),
        graph_modes=("eager", "compiled"),
        depths=(1, 3),
        sliding_windows=("on", "off"),
        thinking=("on",),
        prompts=len(p),
        mean=MEAN,
        concentration=CONC,
        effect=effect,
        sweep_id=sweep_id,
        acceptance=p,
    )


def _al(sweep: SweepRecord) -> dict[ComparableKey, float]:
    out = {}
    for stored in sweep.cells:
        for v in stored.result.variants if stored.result else ():
            if v.counters.mean_acceptance_length is not None:
                out[stored.cell.variant_key(v.axes)] = v.counters.mean_acceptance_length
    return out


def _series(
    earlier: Mapping[ComparableKey, Sequence[float]], *nights: SweepRecord
) -> dict[ComparableKey, list[HistoryPoint]]:
    day0 = datetime(2026, 1, 1, tzinfo=UTC)
    series: dict[ComparableKey, list[HistoryPoint]] = {}
    for key, values in earlier.items():
        series[key] = [
            HistoryPoint(sweep_id=i + 1, timestamp=day0 + timedelta(days=i), value=v)
            for i, v in enumerate(values)
        ]
    for night in nights:
        for key, value in _al(night).items():
            at = day0 + timedelta(days=night.sweep_id)
            series[key].append(HistoryPoint(sweep_id=night.sweep_id, timestamp=at, value=value))
    return series


@dataclass
class Tally:
    nights: int = 0
    pooled: int = 0  # a pooled finding naming a fallen cell (clean: any pooled finding)
    exact: int = 0
    inside: int = 0  # pooled findings name only fallen cells
    cell: int = 0  # a fallen cell regressed alone (clean: any cell finding)
    alert: int = 0  # an alert on a fallen cell, either way

    def add(self, found: Sequence[object], fallen: set[ComparableKey], true: str | None) -> None:
        pooled = [f for f in found if f.check == POOLED_CHECK]  # type: ignore[attr-defined]
        cells = {f.key for f in found if f.check == BASELINE_CHECK}  # type: ignore[attr-defined]
        named = {k for f in pooled for k in f.keys}  # type: ignore[attr-defined]
        self.nights += 1
        if not fallen:
            self.pooled += bool(pooled)
            self.cell += bool(cells)
            return
        self.pooled += bool(named & fallen)
        self.exact += any(f.label == true for f in pooled)  # type: ignore[attr-defined]
        self.inside += bool(named) and named <= fallen
        self.cell += bool(cells & fallen)
        self.alert += bool((named | cells) & fallen)


def _token_sd(p: FloatArray, rng: np.random.Generator) -> float:
    """A night's relative AL spread from token-level noise alone at these prompts."""
    shifts = {c: 0.0 for c in _grid()}
    a = _al(_night(p, shifts, None, 1, rng))
    b = _al(_night(p, shifts, None, 2, rng))
    diffs = [b[k] / a[k] - 1 for k in a]
    return float(np.std(diffs, ddof=1) / math.sqrt(2))


def _grid() -> list[tuple[object, ...]]:
    return [
        (e, g, d, s)
        for e in ("main", "patched")
        for g in ("eager", "compiled")
        for d in (1, 3)
        for s in ("on", "off")
    ]


def run(
    prompts: int, replicates: int, clean: int, rules: JudgeRules, run_sd: float, seed: int
) -> tuple[dict[str, Tally], Tally]:
    """Rows of table (a) and the clean nights of table (b) at ``prompts`` prompts."""
    rng = np.random.default_rng(seed)
    rows = {name: Tally() for name, _ in FALLEN}
    quiet = Tally()
    token = _token_sd(
        prompt_acceptance(prompts, mean=MEAN, concentration=CONC, rng=rng),
        np.random.default_rng(rng.integers(1 << 30)),
    )
    for rep in range(max(replicates, clean)):
        p = prompt_acceptance(prompts, mean=MEAN, concentration=CONC, rng=rng)
        base_shift = {c: run_sd * rng.standard_normal() for c in _grid()}
        night_shift = {c: run_sd * rng.standard_normal() for c in _grid()}
        night_seed = int(rng.integers(1 << 30))
        last_good = _night(
            p, base_shift, None, HISTORY + 1, np.random.default_rng(rng.integers(1 << 30))
        )
        level = _al(last_good)
        earlier = {
            key: (
                level[key]
                / (1 + base_shift[_cell_name(key.axis_values())])
                * (1 + run_sd * rng.standard_normal(HISTORY) + token * rng.standard_normal(HISTORY))
            ).tolist()
            for key in level
        }
        scenarios = [(None, None)] + (list(FALLEN) if rep < replicates else [])
        for name, fallen in scenarios:
            night = _night(p, night_shift, fallen, HISTORY + 2, np.random.default_rng(night_seed))
            found = judge(night, last_good, _series(earlier, last_good, night), rules).findings
            if name is None:
                if rep < clean:
                    quiet.add(found, set(), None)
                continue
            hit = {
                stored.cell.variant_key(v.axes)
                for stored in night.cells
                if all(stored.cell.axes[k] == x for k, x in (fallen or {}).items())
                for v in stored.cell.variants
            }
            rows[name].add(found, hit, TRUE_CONJUNCTION.get(name))
    return rows, quiet


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    phat = k / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:5.0f}%" if n else "    -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=100, help="nights per power row")
    parser.add_argument("--clean", type=int, default=300, help="clean nights for table (b)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--run-sd", type=float, default=RUN_SD, help="run-level sd, relative")
    parser.add_argument("--prompts", type=int, nargs="+", default=[32, 200])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rules = night_rules(check=CheckConfig(resamples=args.resamples)).model_copy(
        update={"within": False, "over_run": None, "prefix_cache": None}
    )
    t0 = time.monotonic()
    results = {
        n: run(n, args.replicates, args.clean, rules, args.run_sd, args.seed) for n in args.prompts
    }
    print(
        f"\n(a) First-night power of a {DROP:.0%} AL drop, run-level sd {args.run_sd:.2%} of AL, "
        f"{args.replicates} nights per row (16 cells, thinking on; family-wise 1%)"
    )
    print(
        f"   {'prompts':>7} {'fallen':<8} {'pooled':>7} {'exact':>7} {'only fallen':>11} "
        f"{'cell alone':>10} {'any alert':>9}"
    )
    for n, (rows, _) in results.items():
        for name, t in rows.items():
            exact = _pct(t.exact, t.nights) if name in TRUE_CONJUNCTION else "    -"
            print(
                f"   {n:>7} {name:<8} {_pct(t.pooled, t.nights):>7} {exact:>7} "
                f"{_pct(t.inside, t.nights):>11} {_pct(t.cell, t.nights):>10} "
                f"{_pct(t.alert, t.nights):>9}"
            )
    print(f"\n(b) Clean nights (no drop), run-level sd {args.run_sd:.2%} of AL")
    print(f"   {'prompts':>7} {'nights':>6} {'pooled false alarms':>30} {'cell false alarms':>18}")
    for n, (_, quiet) in results.items():
        lo, hi = wilson(quiet.pooled, quiet.nights)
        share = 100 * quiet.pooled / quiet.nights
        pooled = f"{quiet.pooled} ({share:.1f}%, {100 * lo:.1f}-{100 * hi:.1f}%)"
        cell = f"{quiet.cell} ({100 * quiet.cell / quiet.nights:.1f}%)"
        print(f"   {n:>7} {quiet.nights:>6} {pooled:>30} {cell:>18}")
    print(f"\n({time.monotonic() - t0:.0f} s, seed {args.seed}, {args.resamples} resamples)")


if __name__ == "__main__":
    main()

"""Sustained small drops across nights (farm/analysis/sustained.py): power, nights to
detect and false alarms, by simulation calibrated on the recorded nights, and the
recorded nights replayed.

    python bench/sustained.py [--replicates N] [--clean-keys K] [--seed S]
        [--recorded DIR] [--history H ...] [--alpha A]

Each simulated key is one fixed set of prompts (tests/fakes/simulate.py: per-prompt
acceptance Beta(0.72 * 8, 0.28 * 8), depth 3, Poisson(38) verify steps a request: AL
about 2.68, as tiny-step's thinking-on variant on the recorded nights) measured once a
night: fresh verify steps each night (the prompt-level noise, at 32 or 200 prompts), and
the night's AL times 1 + 0.0172 N(0, 1) (the run-level sd: what the 20 clean nights of
bench/data/recorded-noise give for that key, 32 prompts each). Since those 1.72% were
measured at 32 prompts, they hold that prompt-level noise already: the "recorded" rows
apply them alone (the recorded nights as they are), the "32 prompts" rows add it again
(an upper bound). A drop lowers every prompt's acceptance by the factor that lowers the
population AL by it. The judge reads the key's last H nights (``nightly.history``: 14
by default; 35 is the most the test reads).

Tables (``python bench/sustained.py`` prints all four in about 3 minutes on one core;
``--replicates`` sets table 2's keys per row, ``--clean-keys`` table 3's; ``--alpha``
runs them all at another per key-night false-alarm rate than the rule's, to show the
trade-off):

1. The threshold per nights read (alpha, draws and seed of the rule used).
2. Power: a sustained drop of 2%, 3% and 5% from one night on, judged each night after
   it: the share of keys whose step is named within 7 nights, the share of those whose
   first named night is the step's own (and within one night of it), and the nights at
   the new level when first named (median and 80th percentile over all keys; ">7": not
   named within 7). "bound": the same test with the key's level and night-to-night sd
   known (normal nights of the measured sd, threshold simulated for the same per-night
   false-alarm rate): its ceiling; the gap to it is what reading the level and the
   spread from the key's own nights costs.
3. False alarms on clean keys judged 20 nights each: per key-night, and keys with any
   finding over their 20 nights, each with a 95% Wilson interval (a key's nights are
   not independent: a low stretch fires on consecutive nights, so the key-night
   interval is narrower than it should be; keys with any are independent).
4. The recorded nights (``--recorded``, default bench/data/recorded-noise) replayed:
   each night judged with the nights up to it, as the nightly reads them; the 20 clean
   nights' findings, then the two canary nights'.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import numpy.typing as npt

# The synthetic nights come from a test double (tests/fakes/simulate.py), not part of the
# farm package: the bench imports it from the repository it runs in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from farm.analysis.history import HistoryPoint, series_from_sweeps
from farm.analysis.stats import wilson_interval
from farm.analysis.sustained import SustainedRule, step_threshold, sustained_drop
from farm.store.export import read_sweep_export
from tests.fakes.simulate import factor_for_drop, prompt_acceptance, simulate_sample

MEAN, CONCENTRATION, DEPTH, VERIFY_STEPS = 0.72, 8.0, 3, 38.0
RUN_SD = 0.0172  # tiny-step thinking-on, 20 clean recorded nights (night_to_night_sd)
DROPS = (0.02, 0.03, 0.05)
WITHIN = 7  # nights: the target names a step within a week
CLEAN_NIGHTS = 20
RECORDED = Path(__file__).resolve().parent / "data" / "recorded-noise"
DAY0 = datetime(2026, 1, 1, tzinfo=UTC)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Noise:
    """How a simulated night is measured: ``prompts`` (0: no prompt-level noise, the
    run-level sd standing for all of it, as measured)."""

    name: str
    prompts: int


NOISES = (Noise("recorded (1.72% in all)", 0), Noise("32 prompts", 32), Noise("200 prompts", 200))


def _nights(
    n: int, noise: Noise, rng: np.random.Generator, step_at: int | None = None, drop: float = 0
) -> list[HistoryPoint]:
    """``n`` nights of one key; from night ``step_at`` on, AL lower by ``drop`` (and a
    new build: ``b1`` instead of ``b0``)."""
    p = prompt_acceptance(max(noise.prompts, 1), mean=MEAN, concentration=CONCENTRATION, rng=rng)
    factor = factor_for_drop(MEAN, CONCENTRATION, DEPTH, drop) if drop else 1.0
    out = []
    for i in range(n):
        after = step_at is not None and i >= step_at
        if noise.prompts:
            q = np.clip(p * factor, 0, 1) if after else p
            s = simulate_sample(q, depth=DEPTH, rng=rng, verify_steps=VERIFY_STEPS)
            al = 1.0 + float(s.accepted.sum() / s.drafts.sum())
        else:
            al = _expected_al(factor if after else 1.0)
        out.append(
            HistoryPoint(
                sweep_id=i + 1,
                timestamp=DAY0 + timedelta(days=i),
                value=al * (1.0 + RUN_SD * rng.standard_normal()),
                builds=("b1",) if after else ("b0",),
            )
        )
    return out


def _expected_al(factor: float) -> float:
    a, b = MEAN * CONCENTRATION, (1 - MEAN) * CONCENTRATION
    total, moment = 1.0, 1.0
    for k in range(DEPTH):
        moment *= (a + k) / (a + b + k)
        total += factor ** (k + 1) * moment
    return total


def table_thresholds(rule: SustainedRule) -> None:
    print(
        f"\n1. Thresholds (alpha {rule.alpha:g} per key-night, {rule.draws} null series per "
        f"count, seed {rule.seed}; window {rule.window}, reference <= {rule.reference_nights})"
    )
    counts = (rule.min_nights, 10, 14, 21, 28, rule.max_nights)
    print("   nights read  " + "  ".join(f"{n:>5}" for n in counts))
    print("   threshold    " + "  ".join(f"{step_threshold(n, rule):>5.2f}" for n in counts))


def _first_named(
    points: Sequence[HistoryPoint], step_at: int, history: int, rule: SustainedRule
) -> tuple[int, int | None]:
    """Nights at the new level when the step is first named (WITHIN + 1: not within
    WITHIN) and how many nights the first night named is off the step's own (None:
    not named)."""
    for j in range(2, WITHIN + 1):
        judged = points[max(0, step_at + j - history) : step_at + j]
        d = sustained_drop(judged, rule=rule).drop
        if d is not None:
            return j, d.start_sweep_id - points[step_at].sweep_id
    return WITHIN + 1, None


def _quantile(nights: list[int], q: float) -> str:
    v = int(np.quantile(nights, q, method="inverted_cdf"))
    return f">{WITHIN}" if v > WITHIN else str(v)


def _relative_sd(noise: Noise, rng: np.random.Generator, keys: int = 100) -> float:
    """The night-to-night sd of a clean key's AL relative to its mean under ``noise``
    (run-level and prompt-level together), pooled over ``keys`` prompt sets."""
    variances = []
    for _ in range(keys):
        values = np.array([p.value for p in _nights(30, noise, rng)])
        variances.append(float(np.var(values, ddof=1) / np.mean(values) ** 2))
    return float(np.sqrt(np.mean(variances)))


def _bound(shift: float, alpha: float, rng: np.random.Generator, draws: int = 200_000) -> float:
    """Power within WITHIN nights of the same test with the level and the sd known
    (normal nights; ``shift``: the drop over the sd): what no window test reaches past."""

    def score(z: FloatArray, nights: int) -> FloatArray:
        tail = z[:, :nights][:, ::-1]
        best = np.full(len(z), -np.inf)
        for m in range(2, min(nights, WITHIN) + 1):
            last = tail[:, :m]
            level = (last.sum(axis=1) - last.min(axis=1)) / (m - 1)
            best = np.maximum(best, -level * np.sqrt(m - 1))
        return best

    h = float(np.quantile(score(rng.standard_normal((draws, WITHIN)), WITHIN), 1 - alpha))
    z = rng.standard_normal((draws // 10, WITHIN + 10))
    z[:, 10:] -= shift  # ten clean nights, then the step
    named = np.zeros(len(z), dtype=bool)
    for j in range(2, WITHIN + 1):
        named |= score(z[:, : 10 + j], 10 + j) >= h
    return float(named.mean())


def table_power(
    histories: Sequence[int], keys: int, rule: SustainedRule, rng: np.random.Generator
) -> None:
    print(
        f"\n2. A sustained drop from one night on, {keys} keys per row: named within "
        f"{WITHIN} nights (95% Wilson interval), of those the first night named right "
        "(and within one night), nights at the new level to detect; bound: the same test "
        "with the level and sd known"
    )
    print(
        f"   {'per-night noise':<24} {'sd':>5} {'H':>3} {'drop':>5} {'named <=7':>17} "
        f"{'bound':>6} {'first night':>11} {'median':>7} {'p80':>4}"
    )
    for noise in NOISES:
        sd = _relative_sd(noise, rng)
        for history in histories:
            for drop in DROPS:
                found, right, near = [], 0, 0
                for _ in range(keys):
                    points = _nights(history + WITHIN, noise, rng, step_at=history, drop=drop)
                    j, off = _first_named(points, history, history, rule)
                    found.append(j)
                    right += off == 0
                    near += off is not None and abs(off) <= 1
                named = sum(j <= WITHIN for j in found)
                share = wilson_interval(named, keys)
                print(
                    f"   {noise.name:<24} {sd:>5.2%} {history:>3} {drop:>5.0%} "
                    f"{f'{named / keys:.0%} [{share.low:.0%}, {share.high:.0%}]':>17} "
                    f"{_bound(drop / sd, rule.alpha, rng):>6.0%} "
                    f"{(f'{right / named:.0%} ({near / named:.0%})' if named else '-'):>11} "
                    f"{_quantile(found, 0.5):>7} {_quantile(found, 0.8):>4}"
                )


def table_false_alarms(
    histories: Sequence[int], keys: int, rule: SustainedRule, rng: np.random.Generator
) -> None:
    print(
        f"\n3. Clean keys, each judged on {CLEAN_NIGHTS} nights after {{H}} nights of "
        f"history, {keys} keys per row (95% Wilson intervals)"
    )
    print(f"   {'per-night noise':<24} {'H':>3} {'per key-night':>34} {'keys with any':>28}")
    for noise in NOISES:
        for history in histories:
            nights = fired_keys = 0
            for _ in range(keys):
                points = _nights(history + CLEAN_NIGHTS, noise, rng)
                fired = [
                    sustained_drop(points[t - history : t], rule=rule).drop is not None
                    for t in range(history + 1, history + CLEAN_NIGHTS + 1)
                ]
                nights += sum(fired)
                fired_keys += any(fired)
            per_night = wilson_interval(nights, keys * CLEAN_NIGHTS)
            per_key = wilson_interval(fired_keys, keys)
            print(
                f"   {noise.name:<24} {history:>3} "
                f"{f'{nights}/{keys * CLEAN_NIGHTS} = {100 * per_night.estimate:.2f}%':>19}"
                f" [{100 * per_night.low:.2f}, {100 * per_night.high:.2f}]"
                f"  {f'{fired_keys}/{keys} = {100 * fired_keys / keys:.1f}%':>15}"
                f" [{100 * per_key.low:.1f}, {100 * per_key.high:.1f}]"
            )


def table_recorded(directory: Path, rule: SustainedRule) -> None:
    nights = [read_sweep_export(p) for p in sorted(directory.glob("night-*.json"))]
    canary = [any(p.startswith("canary-") for b in n.builds for p in b.patches) for n in nights]
    series = series_from_sweeps(nights, resamples=10)
    clean = sum(not c for c in canary)
    print(
        f"\n4. {directory.name}: {len(nights)} recorded nights ({clean} clean, then "
        f"{len(nights) - clean} canary), each judged with the nights up to it"
    )
    for key, points in sorted(series.items(), key=lambda kv: kv[0].label):
        tested = findings = 0
        for i, point in enumerate(points):
            if canary[i]:
                continue
            result = sustained_drop(points[: i + 1], rule=rule)
            tested += result.status == "checked"
            if result.drop is not None:
                findings += 1
                print(f"     clean night {point.sweep_id}: {result.describe()}")
        print(
            f"   {key.label}:\n     {clean} clean nights, {tested} tested "
            f"(the first {rule.min_nights - 1} have too little history), "
            f"{findings} finding(s)"
        )
        for i, point in enumerate(points):
            if canary[i]:
                result = sustained_drop(points[: i + 1], rule=rule)
                what = f"canary night {point.sweep_id} (AL {point.value:.3f})"
                print(f"     {what}: {result.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=600, help="keys per power row")
    parser.add_argument("--clean-keys", type=int, default=600, help="keys per clean row")
    parser.add_argument("--history", type=int, nargs="+", default=[14, 35])
    parser.add_argument("--recorded", type=Path, default=RECORDED)
    parser.add_argument(
        "--alpha", type=float, default=SustainedRule().alpha, help="per key-night (the trade-off)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rule = SustainedRule(alpha=args.alpha)
    t0 = time.monotonic()
    table_thresholds(rule)
    tables: list[Callable[[], None]] = [
        lambda: table_power(args.history, args.replicates, rule, rng),
        lambda: table_false_alarms(args.history, args.clean_keys, rule, rng),
        lambda: table_recorded(args.recorded, rule),
    ]
    for table in tables:
        start = time.monotonic()
        table()
        print(f"   ({time.monotonic() - start:.0f} s)")
    print(f"\n({time.monotonic() - t0:.0f} s, seed {args.seed})")


if __name__ == "__main__":
    main()

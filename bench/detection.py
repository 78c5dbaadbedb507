"""How well the analysis finds regressions: power, false positives, change points.

    python bench/detection.py [--replicates N] [--resamples B] [--seed S]
        [--recorded bench/data/recorded [--no-synthetic]]

All data is synthetic with request-level noise like real runs (tests.fakes.simulate:
per-prompt acceptance from a Beta distribution, ~40 verify steps per request, MTP
depth 3, AL about 2.5-3.7). Three tables:

1. Within-sweep power at 200 prompts: share of paired (and unpaired) AL comparisons
   that the check rule flags (bootstrap interval excludes 0 AND the drop reaches the
   minimum effect), per true relative AL drop; the minimum detectable drop is the
   smallest drop flagged with >= 80% power (linear interpolation on the grid).
2. Whole sweeps with the first seed bug, vllm-ascend PR #8210 (FULL_DECODE_ONLY x
   MTP >= 2 x SWA on): recall over regressed comparisons, false-positive rate over
   clean ones, and how often attribution returns exactly the three true terms.
3. Nightly histories (30 sweeps, each point a fresh 200-prompt measurement, optionally
   with 1% extra run-to-run jitter): alert rate and on-time recall of step drops for
   both change-point strategies, alert rate on flat series and one-night dips.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import numpy.typing as npt

# The synthetic sweeps are a test double (tests/fakes/simulate.py), not part of the
# farm package: the bench imports it from the repository it runs in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detection_recorded import minimum_detectable, run_recorded

from farm.analysis.attribution import attribute, labels_from_report
from farm.analysis.check_rules import CheckConfig, classify_difference
from farm.analysis.checks import check_sweep
from farm.analysis.history import (
    ChangePointTest,
    EDivisive,
    HistoryPoint,
    WindowedTTest,
    analyze_history,
)
from farm.analysis.stats import acceptance_stats, compare_acceptance
from farm.plan import ServerCell, Variant
from tests.fakes.simulate import (
    expected_al,
    factor_for_drop,
    prompt_acceptance,
    simulate_sample,
    simulate_sweep,
)

DEPTH, PROMPTS, CONC = 3, 200, 8.0
DROPS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.10)
OPERATING_POINTS = (0.7, 0.8, 0.9)  # mean per-prompt acceptance -> AL ~2.5, ~3.0, ~3.4


def _factor_for_drop(mean: float, drop: float) -> float:
    return factor_for_drop(mean, CONC, DEPTH, drop)


def _power(
    mean: float, drop: float, paired: bool, reps: int, resamples: int, rng: np.random.Generator
) -> tuple[float, float]:
    """(share flagged by the check rule, share merely significant)."""
    cfg = CheckConfig(resamples=resamples)
    factor = _factor_for_drop(mean, drop)
    flagged = significant = 0
    for _ in range(reps):
        p = prompt_acceptance(PROMPTS, mean=mean, concentration=CONC, rng=rng)
        ref = simulate_sample(p, depth=DEPTH, rng=rng)
        q = p if paired else prompt_acceptance(PROMPTS, mean=mean, concentration=CONC, rng=rng)
        cand = simulate_sample(
            np.clip(q * factor, 0, 1), depth=DEPTH, rng=rng, prefix="p" if paired else "q"
        )
        d = compare_acceptance(ref, cand, rng=rng, resamples=resamples)
        sig, bad = classify_difference(
            d.mean_acceptance_length, cfg.min_al_effect(d.reference_al.estimate), "lower"
        )
        significant += sig and d.mean_acceptance_length.high < 0
        flagged += bad
    return flagged / reps, significant / reps


def table_power(reps: int, resamples: int, rng: np.random.Generator) -> None:
    print(
        f"\n1. Within-sweep AL comparisons at {PROMPTS} prompts, depth {DEPTH}, "
        f"{reps} replicates per cell (flagged = significant AND >= max(2%, 0.05 AL))"
    )
    head = "  ".join(f"{100 * d:>5.1f}%" for d in DROPS)
    print(f"   {'AL':>4}  {'design':<9} {'rule':<12} {head}   MDE@80%")
    for mean in OPERATING_POINTS:
        al = expected_al(mean, CONC, DEPTH)
        for paired in (True, False):
            rows = [_power(mean, d, paired, reps, resamples, rng) for d in DROPS]
            for label, col in (("check rule", 0), ("signif only", 1)):
                power = [r[col] for r in rows]
                cells = "  ".join(f"{100 * p:>5.0f}%" for p in power)
                design = "paired" if paired else "unpaired"
                mde = minimum_detectable(DROPS, power)
                print(f"   {al:4.2f}  {design:<9} {label:<12} {cells}   {mde}")


def table_sweeps(n: int, resamples: int, rng: np.random.Generator) -> None:
    print(
        f"\n2. Whole sweeps with seed bug 1 (3 graph modes x depth 0-3 x SWA x thinking, "
        f"{PROMPTS} prompts), {n} sweeps per row; recall per check over the truly "
        "regressed comparisons, FP rate over all others"
    )
    print(
        f"   {'AL drop':>7}  {'recall AL vs eager':>18}  {'recall per-pos depth':>20}  "
        f"{'FP rate':>8}  {'sweeps w/ a false finding':>25}  {'attribution exact':>17}"
    )
    for drop in (0.0, 0.05, 0.10):
        factor = _factor_for_drop(0.8, drop)

        def bug(cell: ServerCell, v: Variant, factor: float = factor) -> float:
            hit = (
                cell.planned_graph_mode == "full_decode_only"
                and cell.mtp_depth >= 2
                and cell.sliding_window == "on"
            )
            return factor if hit else 1.0

        hits = {"graph_vs_eager": [0, 0], "depth_invariance": [0, 0]}
        fp = tn = exact = dirty = 0
        for _ in range(n):
            sweep = simulate_sweep(rng=rng, prompts=PROMPTS, effect=bug)
            report = check_sweep(
                sweep,
                config=CheckConfig(resamples=resamples, seed=int(rng.integers(1 << 30))),
                depth_invariance=True,
            )
            false_finding = False
            for v in report.verdicts:
                c = v.candidate
                truly = (
                    drop > 0
                    and c.graph_mode == "full_decode_only"
                    and c.mtp_depth >= 2
                    and c.key.value("sliding_window") == "on"
                    and v.metric != "greedy_divergence"
                )
                if v.check == "depth_invariance" and truly:
                    truly = v.reference.mtp_depth < 2  # bad vs bad is not a difference
                if truly:
                    hits[v.check][0] += v.regressed
                    hits[v.check][1] += 1
                else:
                    fp += v.regressed
                    tn += not v.regressed
                    false_finding |= v.regressed
            dirty += false_finding
            rule = attribute(labels_from_report(report))
            terms = {str(t) for t in rule.terms} if rule else set()
            exact += terms == {"graph_mode=full_decode_only", "mtp_depth>=2", "sliding_window=on"}
        recall = [f"{100 * k / total:.0f}%" if total else "-" for k, total in hits.values()]
        attribution = f"{100 * exact / n:.0f}%" if drop else "-"
        print(
            f"   {100 * drop:>6.0f}%  {recall[0]:>18}  {recall[1]:>20}  "
            f"{100 * fp / max(fp + tn, 1):>7.2f}%  {f'{dirty}/{n}':>25}  {attribution:>17}"
        )


def _nightly(
    factors: list[float], jitter: float, rng: np.random.Generator, p: npt.NDArray[np.float64]
) -> list[HistoryPoint]:
    """One fresh 200-prompt measurement per night; ``jitter`` adds run-to-run noise
    (relative sd on AL) beyond token sampling, e.g. batching or kernel changes."""
    day0 = datetime(2026, 1, 1, tzinfo=UTC)
    points = []
    for i, f in enumerate(factors):
        s = simulate_sample(np.clip(p * f, 0, 1), depth=DEPTH, rng=rng)
        al = acceptance_stats(s, rng=rng, resamples=1).mean_acceptance_length
        assert al is not None
        value = al.estimate * (1 + jitter * rng.standard_normal())
        points.append(HistoryPoint(sweep_id=i, timestamp=day0 + timedelta(days=i), value=value))
    return points


def table_history(n: int, rng: np.random.Generator) -> None:
    length, mean = 30, 0.8
    print(
        f"\n3. Nightly histories ({length} sweeps, AL ~{expected_al(mean, CONC, DEPTH):.2f}; "
        f"alert = drop >= 2% confirmed by 2 sweeps), {n} series per row; "
        "'on time' = alert within one sweep of the true change"
    )
    print(
        f"   {'scenario':<34} {'night sd':>8}  {'e-divisive':>10} {'on time':>8}  "
        f"{'windowed t':>10} {'on time':>8}"
    )
    scenarios: list[tuple[str, float, int | None, bool, float]] = []
    for jitter in (0.0, 0.01):
        tag = f", +{100 * jitter:.0f}% jitter" if jitter else ""
        scenarios += [("flat" + tag, 0.0, None, False, jitter)]
        scenarios += [("one-night 10% dip" + tag, 0.10, 20, True, jitter)]
        for drop in (0.02, 0.03, 0.05, 0.10):
            scenarios.append((f"{100 * drop:.0f}% step at 20{tag}", drop, 20, False, jitter))
        for after in (2, 3):
            scenarios.append(
                (f"5% step, last {after} sweeps{tag}", 0.05, length - after, False, jitter)
            )
    tests: list[ChangePointTest] = [EDivisive(), WindowedTTest()]
    for name, drop, at, dip, jitter in scenarios:
        factor = _factor_for_drop(mean, drop)
        alerts, on_time, spread = [0, 0], [0, 0], []
        for _ in range(n):
            p = prompt_acceptance(PROMPTS, mean=mean, concentration=CONC, rng=rng)
            factors = [1.0] * length
            if at is not None:
                for i in range(at, at + 1 if dip else length):
                    factors[i] = factor
            points = _nightly(factors, jitter, rng, p)
            head = np.array([pt.value for pt in points[: at or length]])
            spread.append(float(head.std(ddof=1) / head.mean()))
            for k, test in enumerate(tests):
                seed = int(rng.integers(1 << 30))
                found = analyze_history(points, test=test, rng=np.random.default_rng(seed))
                alerts[k] += bool(found.alerts)
                on_time[k] += any(at is not None and abs(a.index - at) <= 1 for a in found.alerts)
        cols = []
        for k in range(2):
            hit = f"{100 * on_time[k] / n:.0f}%" if at is not None and not dip else "-"
            cols.append(f"{100 * alerts[k] / n:>9.0f}% {hit:>8}")
        sd = f"{100 * float(np.mean(spread)):.2f}%"
        print(f"   {name:<34} {sd:>8}  {cols[0]}  {cols[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--replicates",
        type=int,
        default=100,
        help="replicates per power cell and series per history scenario",
    )
    parser.add_argument("--sweeps", type=int, default=10, help="whole sweeps per row")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--recorded",
        type=Path,
        metavar="DIR",
        help="also tables 4-7 on real sweeps exported there (see bench/detection_recorded.py)",
    )
    parser.add_argument("--no-synthetic", action="store_true", help="skip tables 1-3")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.monotonic()
    tables: list[Callable[[], None]] = []
    if not args.no_synthetic:
        tables += [
            lambda: table_power(args.replicates, args.resamples, rng),
            lambda: table_sweeps(args.sweeps, args.resamples, rng),
            lambda: table_history(args.replicates, rng),
        ]
    if args.recorded:
        tables.append(lambda: run_recorded(args.recorded, rng, args.resamples, args.replicates))
    for table in tables:
        start = time.monotonic()
        table()
        print(f"   ({time.monotonic() - start:.0f} s)")
    print(f"\n({time.monotonic() - t0:.0f} s, seed {args.seed})")


if __name__ == "__main__":
    main()

"""First-night power and device time of confirmation in the same night (#39 item 1).

    python bench/confirmation.py [--nights N] [--run-sd 0.0172] [--al 2.9] [--seed S]

One cell, one night, by simulation with the farm's own rules: each run's AL is the
key's level times ``1 + drop + e``, ``e ~ N(0, run_sd)``: the run-level spread read
from the 20 recorded clean nights in bench/data/recorded-noise (1.72% of AL for
tiny-step at 32 prompts, thinking on; it holds the prompt-level jitter of those 32
prompts too, so no second noise term is added). The key has ``--history`` earlier
clean nights (its calibration, :mod:`farm.analysis.noise`: spread by
``night_to_night_sd``, reference re-centred on the median of the last 10).

- R = 0: the calibrated rule as the nightly judges without confirmation.
- R = 2, 4: a first run that is suspicious (:func:`farm.analysis.confirm.suspicious`)
  is confirmed by up to R reruns of each side, interleaved, stopped early by
  :func:`farm.analysis.confirm.settled`, decided by :func:`farm.analysis.confirm.decide`.

Prints, per true drop: the share of nights the cell is called a regression (the false
alarm rate at 0, with a Wilson interval), and the device time of the cell's night
against the one-run night (1 + reruns of both sides, each as long as the first run).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.analysis.check_rules import CheckConfig
from farm.analysis.confirm import ConfirmRule, decide, settled, suspicious
from farm.analysis.noise import KeyNoise, NoiseRule, calibrated, night_to_night_sd
from farm.analysis.stats import Interval, wilson_interval

DROPS = (0.0, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08)


def one_night(
    rng: np.random.Generator, drop: float, runs: int, args: argparse.Namespace
) -> tuple[bool, int]:
    """(called a regression, reruns made) for one cell's night."""
    cfg, rule = CheckConfig(), NoiseRule()
    level = args.al
    history = level * (1 + rng.normal(0, args.run_sd, args.history))
    sd = night_to_night_sd(list(history))
    centre = float(np.median(history[-rule.centre_nights :]))
    noise = KeyNoise(
        nights=args.history, al_sd=sd, centre=centre, centre_nights=min(10, args.history)
    )
    reference_night = float(history[-1])
    first = level * (1 - drop + rng.normal(0, args.run_sd))
    floor = cfg.min_al_effect(reference_night)
    raw = Interval(
        estimate=first - reference_night,
        low=first - reference_night,
        high=first - reference_night,
        level=cfg.level,
    )
    diff, threshold = calibrated(raw, floor, noise, rule, reference_al=reference_night)
    regress = diff.high < 0 and -diff.estimate >= threshold.min_effect
    if runs == 0 or not suspicious(
        "regress" if regress else "pass",
        diff.estimate / centre,
        threshold.calibrated,
        threshold.run_sd,
        floor / reference_night,
    ):
        return regress, 0
    confirm = ConfirmRule(runs=runs)
    candidate, reference = [first], []
    made = 0
    for _ in range(runs):
        candidate.append(level * (1 - drop + rng.normal(0, args.run_sd)))
        reference.append(level * (1 + rng.normal(0, args.run_sd)))
        made += 2
        done = settled(
            candidate,
            reference,
            history_sd=sd,
            history_nights=args.history,
            floor=floor,
            rule=confirm,
        )
        if done is not None:
            return done.outcome == "regress", made
    final = decide(
        candidate,
        reference,
        history_sd=sd,
        history_nights=args.history,
        floor=floor,
        level=confirm.level,
    )
    return final.outcome == "regress", made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nights", type=int, default=4000)
    parser.add_argument("--run-sd", type=float, default=0.0172)
    parser.add_argument("--al", type=float, default=2.9)
    parser.add_argument("--history", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"one cell, AL {args.al}, run-level sd {args.run_sd:.2%} of AL, {args.history} "
        f"earlier nights, {args.nights} simulated nights per row"
    )
    header = f"{'drop':>5} | " + " | ".join(f"R={r}: called  device" for r in (0, 2, 4))
    print(header)
    print("-" * len(header))
    for drop in DROPS:
        cols = []
        for runs in (0, 2, 4):
            rng = np.random.default_rng([args.seed, runs, int(drop * 1000)])
            called = reruns = 0
            for _ in range(args.nights):
                hit, made = one_night(rng, drop, runs, args)
                called += hit
                reruns += made
            share = called / args.nights
            if drop == 0:
                ci = wilson_interval(called, args.nights)
                text = f"{share:6.2%} [{ci.low:.2%},{ci.high:.2%}]"
            else:
                text = f"{share:6.1%}"
            cols.append(f"{text:>14} {1 + reruns / args.nights:5.2f}x")
        print(f"{drop:5.0%} | " + " | ".join(cols))
    print(
        "device: the cell's device time over the one-run night's (1.00x: no reruns);"
        f" minimum effect floor max(2% of AL, 0.05) = {max(0.02 * args.al, 0.05):.3f} AL"
    )
    assert math.isfinite(args.run_sd)


if __name__ == "__main__":
    main()

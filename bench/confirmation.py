"""First-night power and device time of confirmation in the same night.

    python bench/confirmation.py [--nights N] [--rs 0,2,4] [--run-sd 0.0172] [--al 2.9]

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

    python bench/confirmation.py --recorded bench/data/recorded-noise [--draws 200]

replays the recorded real-engine nights instead (20 clean nights of tiny-step with the
noise patch, thinking on and off, 32 prompts, then two canary nights): each night from
the sixth on is judged as `farm nightly` judges it (its earlier nights its history, the
last one judged clean its baseline); a suspicious cell is confirmed with reruns that
are other recorded clean nights of the same build (drawn at random without the judged
night and its reference, ``--draws`` times), and the night judged again with them, so
the false alarms are those of real run-to-run noise. A canary night's candidate reruns
are its own run plus the spread of a clean night about the clean median (the canary
was recorded once). Nights recorded with their reruns (bench/data/recorded-confirm, by
bench/noisy_nights.py) are also judged with their own reruns: the "own reruns" column,
and the verdict of every check with them.
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
from farm.analysis.confirm_plan import ConfirmPlan, confirmation_settled, plan_confirmations
from farm.analysis.history import series_from_sweeps
from farm.analysis.judgement import BASELINE_CHECK
from farm.analysis.noise import KeyNoise, NoiseRule, calibrated, night_to_night_sd
from farm.analysis.rules import night_rules
from farm.analysis.stats import Interval, wilson_interval
from farm.records import CellResult, ConfirmationRun, SweepRecord
from farm.results.verdict import SweepVerdict
from farm.store.export import read_sweep_export
from farm.workflows.nightly.decide import judge_night

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
    candidate: list[float] = []
    reference: list[float] = []
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


def replay_recorded(directory: Path, draws: int, runs: int, seed: int) -> None:
    """The recorded nights judged with and without confirmation (module docstring)."""
    nights = [read_sweep_export(p) for p in sorted(directory.glob("night-*.json"))]
    clean = [n for n in nights if not _is_canary(n)]
    rule = NoiseRule(confirm=ConfirmRule(runs=runs, budget_s=1e9))
    rng = np.random.default_rng(seed)
    print(
        f"{len(nights)} recorded nights ({len(clean)} clean), R = {runs}, "
        f"{draws} draws of reruns per suspicious night"
    )
    print(
        f"{'night':>5} {'one run':>8} {'suspicious':>10} {'confirmed':>9} {'reruns':>6} "
        f"{'own reruns':>10} {'verdict':>10}"
    )
    last_good, alarms, confirmed_alarms, judged, verdicts = nights[0], 0, 0.0, 0, 0
    for i in range(NoiseRule().min_nights, len(nights)):
        night = nights[i]
        history = series_from_sweeps(nights[: i + 1], resamples=200)
        rules = night_rules(base_of={}, noise=rule)
        # The night as its first runs alone would have been judged; its own recorded
        # reruns (a night recorded with them) decide it again below.
        alone = night.model_copy(update={"confirmations": ()})
        first = judge_night(alone, last_good=last_good, history=history, rules=rules)
        flagged = _flagged(first.verdict)
        own = judge_night(night, last_good=last_good, history=history, rules=rules).verdict
        comparison = first.judgement.comparison
        plans, _ = plan_confirmations(alone, last_good, comparison, rule.confirm)
        called, reruns = 0, 0
        pool = [n for n in clean if n.sweep_id not in (night.sweep_id, last_good.sweep_id)]
        for _ in range(draws if plans else 0):
            runs_made = _reruns(night, plans, pool, clean, rng, rule.confirm)
            reruns += len(runs_made)
            again = judge_night(
                night.model_copy(update={"confirmations": tuple(runs_made)}),
                last_good=last_good,
                history=history,
                rules=rules,
            )
            called += bool(_flagged(again.verdict))
        share = called / draws if plans else float(bool(flagged))
        canary = _is_canary(night)
        name = f"{i + 1}{'c' if canary else ''}"
        own_text = (
            ("regress" if _flagged(own) else "clean") + f" {len(night.confirmations)}"
            if night.confirmations
            else "-"
        )
        print(
            f"{name:>5} {('regress' if flagged else 'clean'):>8} {len(plans):>10} "
            f"{share:>9.0%} {reruns / max(draws, 1) if plans else 0:>6.1f} {own_text:>10} "
            f"{own.outcome:>10}"
        )
        if not canary:
            judged += 1
            alarms += bool(flagged)
            confirmed_alarms += share
            verdicts += own.outcome == "regression"
            if not flagged:
                last_good = night
    print(
        f"clean nights judged: {judged}; false alarms with one run: {alarms}; "
        f"with confirmation (expected over the draws): {confirmed_alarms:.2f}; "
        f"verdicts 'regression' with the night's own reruns (every check): {verdicts}"
    )


def _flagged(verdict: SweepVerdict) -> list[str]:
    return [f.summary for f in verdict.findings if f.check == BASELINE_CHECK and f.is_regression]


def _is_canary(sweep: SweepRecord) -> bool:
    return any(p.startswith("canary-") for b in sweep.builds for p in b.patches)


def _reruns(
    night: SweepRecord,
    plans: tuple[ConfirmPlan, ...],
    pool: list[SweepRecord],
    clean: list[SweepRecord],
    rng: np.random.Generator,
    rule: ConfirmRule,
) -> list[ConfirmationRun]:
    """Reruns of each planned cell from recorded clean nights, pair by pair until its
    runs settle it as the runner would (a canary's candidate side: its own run moved by
    a clean night's offset from the clean median)."""
    out: list[ConfirmationRun] = []
    for plan in plans:
        picks = rng.choice(len(pool), size=2 * plan.runs, replace=False)
        made: list[ConfirmationRun] = []
        for k in range(plan.runs):
            for side, j in (("candidate", picks[2 * k]), ("reference", picks[2 * k + 1])):
                result = _cell(pool[int(j)], plan.cell_id)
                if side == "candidate" and _is_canary(night):
                    result = _moved(_cell(night, plan.cell_id), pool[int(j)], clean, plan.cell_id)
                made.append(
                    ConfirmationRun(
                        cell_id=plan.cell_id, side=side, run=k + 1, build_id="b", result=result
                    )
                )
            if confirmation_settled(plan.targets, made, rule):
                break
        out += made
    return out


def _cell(night: SweepRecord, cell_id: str) -> CellResult:
    (found,) = [c.result for c in night.cells if c.cell.cell_id == cell_id and c.result]
    return found


def _moved(
    canary: CellResult, donor: SweepRecord, clean: list[SweepRecord], cell_id: str
) -> CellResult:
    """``canary``'s variants with their accepted counts scaled by the donor night's AL
    over the clean nights' median AL (per variant): a rerun of the canary at that
    night's run-level draw."""

    def al(n: SweepRecord, axes: dict[str, object]) -> float:
        (w,) = [x for x in _cell(n, cell_id).variants if x.axes == axes]
        return w.counters.mean_acceptance_length or 0.0

    variants = []
    for v in canary.variants:
        factor = al(donor, v.axes) / float(np.median([al(n, v.axes) for n in clean]))
        c = v.counters
        accepted = round(((1 + c.accepted / c.drafts) * factor - 1) * c.drafts) if c.drafts else 0
        variants.append(
            v.model_copy(update={"counters": c.model_copy(update={"accepted": accepted})})
        )
    return canary.model_copy(update={"variants": tuple(variants)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nights", type=int, default=4000)
    parser.add_argument("--run-sd", type=float, default=0.0172)
    parser.add_argument("--al", type=float, default=2.9)
    parser.add_argument("--history", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recorded", type=Path, default=None)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--runs", type=int, default=6, help="R of the --recorded replay")
    parser.add_argument(
        "--rs",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        default=(0, 2, 4),
        help="the R values of the simulated table (comma-separated)",
    )
    args = parser.parse_args()
    if args.recorded is not None:
        replay_recorded(args.recorded, args.draws, args.runs, args.seed)
        return
    print(
        f"one cell, AL {args.al}, run-level sd {args.run_sd:.2%} of AL, {args.history} "
        f"earlier nights, {args.nights} simulated nights per row"
    )
    header = f"{'drop':>5} | " + " | ".join(f"R={r}: called  device" for r in args.rs)
    print(header)
    print("-" * len(header))
    for drop in DROPS:
        cols = []
        for runs in args.rs:
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

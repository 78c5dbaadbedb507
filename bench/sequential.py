"""The sequential AL rule against the fixed-sample rule: false alarms, power, prompts.

    python bench/sequential.py [--replicates N] [--seed S] [--recorded DIR]
        [--bootstrap-check M] [--run-sd X [--nights M]]

Each replicate is one paired comparison of a candidate against its reference on the
same 200 prompts, in prompt order. Per-prompt counters are drawn as in
tests/fakes/simulate.py (acceptance p ~ Beta(0.8*8, 0.2*8) per prompt, shared by both
sides; Poisson(40) verify steps; depth 3; AL ~2.9), or with --recorded from the real
engine's clean repeats (bench/data/recorded: prompts resampled from repeat 1 as the
reference and the same prompts of repeat 2 as the candidate, whose accepted drafts are
thinned to the drop, as bench/detection_recorded.py table 7 does). The candidate's AL
is lowered by 0, 1, 2, 3, 5 and 10%.

Both rules see the same draws. Fixed: farm.analysis.check_rules at 200 prompts (drop
>= max(2% AL, 0.05) and significant at 95%). Sequential: farm.analysis.sequential,
looks every 16 prompts up to 200. Both use the normal (delta-method) interval at 200
prompts so that 10,000 replicates run in minutes; the last column block checks, on
--bootstrap-check replicates per drop, how often that decision equals the one with
the fixed rule's request-level bootstrap (2000 resamples).

The Wald column is a lower bound on the expected prompts of ANY sequential test that
tells "no drop" from "this drop" with the fixed rule's two error rates (Wald 1945,
sec. 4.4: E[N] >= error-rate term / Kullback-Leibler information per prompt; the
per-prompt spread is the simulated one). Where it exceeds 100, a target of
<= 50% of the fixed sample cannot be met by any rule at these error rates.

``--run-sd X`` adds a second table under run-to-run noise: each run of each
side draws a shift of its AL common to all its prompts, sd X relative (1.7% is what 20
real-engine nights at the noise patch's defaults gave, thinking on:
bench/data/recorded-noise). Rules there: fixed prompt-only (as above); fixed
calibrated (farm.analysis.noise with the spread known: the reference re-centred on the
median of ``--nights`` earlier nights, run variance added, min effect k x sqrt(1 + c_m)
x sd); looks under the prompt-only rule whose prompts the calibrated fixed rule judges
(the farm before its looks were calibrated); and looks under the calibrated rule (each
look's drop re-centred, the run variance in its se and boundaries, the calibrated min
effect: the adjustments farm.analysis.sequential.decide_look makes with a
LookCalibration, as the farm's nightly runs them).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from farm.analysis.check_rules import CheckConfig, classify_difference
from farm.analysis.sequential import (
    PASS,
    REGRESS,
    SequentialDesign,
    decide_drops,
    paired_al_statistics,
)
from farm.analysis.stats import AcceptanceSample, compare_acceptance
from tests.fakes.simulate import factor_for_drop

FloatArray = npt.NDArray[np.float64]
DEPTH, PROMPTS, CONC, MEAN, STEPS = 3, 200, 8.0, 0.8, 40.0
DROPS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.10)
CHUNK = 1000


@dataclass(frozen=True)
class Draws:
    """Per-prompt counters of ``R`` paired comparisons: (R x PROMPTS) arrays."""

    ref_acc: FloatArray
    ref_drafts: FloatArray
    cand_acc: FloatArray
    cand_drafts: FloatArray


def _factor_for_drop(drop: float) -> float:
    return factor_for_drop(MEAN, CONC, DEPTH, drop)


def _accepted(p: FloatArray, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
    """(accepted, verify steps) per request, the model of tests/fakes/simulate.py."""
    steps = np.maximum(rng.poisson(STEPS, size=p.shape), 1)
    powers = p[..., None] ** np.arange(DEPTH + 1)
    probs = powers.copy()
    probs[..., :-1] *= 1.0 - p[..., None]
    lengths = rng.multinomial(steps, probs / probs.sum(axis=-1, keepdims=True))
    return (lengths * np.arange(DEPTH + 1)).sum(axis=-1).astype(np.float64), steps.astype(
        np.float64
    )


Draw = Callable[[int, float, np.random.Generator], "Draws"]


def synthetic(reps: int, drop: float, rng: np.random.Generator) -> Draws:
    still = np.zeros(reps)
    return synthetic_noisy(reps, drop, rng, RunNoise(still, still, still, math.sqrt(2.0)))


@dataclass(frozen=True)
class Recorded:
    """Paired per-prompt counters of one variant in two clean repeats."""

    name: str
    ref_pos: FloatArray  # prompt x position
    ref_drafts: FloatArray
    cand_pos: FloatArray
    cand_drafts: FloatArray

    def keep_for_drop(self, drop: float) -> float:
        """Per-position keep probability s (position i kept with s**(i+1))."""
        cols = self.cand_pos.sum(axis=0)
        drafts = self.cand_drafts.sum()
        base = 1 + cols.sum() / drafts
        lo, hi = 0.0, 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            al = 1 + sum(c * mid ** (i + 1) for i, c in enumerate(cols)) / drafts
            lo, hi = (mid, hi) if al < base * (1 - drop) else (lo, mid)
        return (lo + hi) / 2

    def draw(self, reps: int, drop: float, rng: np.random.Generator) -> Draws:
        idx = rng.integers(len(self.ref_drafts), size=(reps, PROMPTS))
        keep = self.keep_for_drop(drop)
        pos = self.cand_pos[idx].astype(np.int64)
        thinned = rng.binomial(pos, keep ** np.arange(1, pos.shape[-1] + 1))
        thinned = np.minimum.accumulate(thinned, axis=-1)  # accepted left to right
        return Draws(
            self.ref_pos[idx].sum(axis=-1),
            self.ref_drafts[idx],
            thinned.sum(axis=-1).astype(np.float64),
            self.cand_drafts[idx],
        )


def load_recorded(directory: Path) -> list[Recorded]:
    from farm.store.export import read_sweep_export

    paths = sorted(directory.glob("clean-repeat-*.json"))
    if len(paths) < 2:
        raise SystemExit(f"{directory}: need two clean-repeat-*.json files")
    a, b = (read_sweep_export(p) for p in paths[:2])
    out = []
    for sa, sb in zip(a.cells, b.cells, strict=True):
        if not (sa.result and sb.result):
            continue
        for va, vb in zip(sa.result.variants, sb.result.variants, strict=True):
            ra = {r.prompt_id: r.counters for r in va.requests if r.counters and r.counters.drafts}
            rb = {r.prompt_id: r.counters for r in vb.requests if r.counters and r.counters.drafts}
            ids = sorted(set(ra) & set(rb))
            if len(ids) < 8:
                continue
            out.append(
                Recorded(
                    name=f"{sa.cell.cell_id} think-{va.thinking}",
                    ref_pos=np.array([ra[i].accepted_per_pos for i in ids], dtype=np.float64),
                    ref_drafts=np.array([ra[i].drafts for i in ids], dtype=np.float64),
                    cand_pos=np.array([rb[i].accepted_per_pos for i in ids], dtype=np.float64),
                    cand_drafts=np.array([rb[i].drafts for i in ids], dtype=np.float64),
                )
            )
    return out


def _look(d: Draws, n: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(drop, se, per-prompt spread, min effect) over the first ``n`` prompts."""
    cfg = CheckConfig()
    ref_al, cand_al, spread = paired_al_statistics(
        d.ref_acc[:, :n], d.ref_drafts[:, :n], d.cand_acc[:, :n], d.cand_drafts[:, :n]
    )
    m = np.array([cfg.min_al_effect(float(al)) for al in ref_al])
    return ref_al - cand_al, spread / math.sqrt(n), spread, m


@dataclass
class Tally:
    reps: int = 0
    fixed: int = 0
    seq: int = 0
    differ: int = 0
    early_regress: int = 0
    early_pass: int = 0
    prompts: float = 0.0
    spread: float = 0.0
    ref_al: float = 0.0

    def add(self, d: Draws, design: SequentialDesign) -> None:
        r = d.ref_acc.shape[0]
        decided = np.zeros(r, dtype=np.int64)
        used = np.full(r, float(PROMPTS))
        last = len(design.looks) - 1
        for k, n in enumerate(design.looks):
            drop, se, spread, m = _look(d, n)
            codes = decide_drops(design, k, drop, se, spread, m)
            new = (decided == 0) & (codes != 0)
            used[new] = n
            if k < last:
                self.early_regress += int((new & (codes == REGRESS)).sum())
                self.early_pass += int((new & (codes == PASS)).sum())
            decided[new] = codes[new]
        fixed = codes == REGRESS  # the last look is the fixed rule on all 200 prompts
        self.reps += r
        self.fixed += int(fixed.sum())
        self.seq += int((decided == REGRESS).sum())
        self.differ += int(((decided == REGRESS) != fixed).sum())
        self.prompts += float(used.sum())
        self.spread += float(spread.sum())
        self.ref_al += float((d.ref_acc.sum(axis=1) / d.ref_drafts.sum(axis=1) + 1).sum())


@dataclass(frozen=True)
class RunNoise:
    """Per-run AL shifts of each replicate (relative): the last good night's, the
    baseline window's median's and the candidate's; and the calibrated rule's factor."""

    reference: FloatArray
    centre: FloatArray
    candidate: FloatArray
    factor: float


def draw_run_noise(reps: int, run_sd: float, nights: int, rng: np.random.Generator) -> RunNoise:
    from farm.analysis.noise import KeyNoise

    c_m = KeyNoise(nights=nights, al_sd=run_sd, centre=0.0, centre_nights=nights)
    return RunNoise(
        reference=rng.normal(0.0, run_sd, reps),
        centre=rng.normal(0.0, run_sd * math.sqrt(c_m.centre_variance()), reps),
        candidate=rng.normal(0.0, run_sd, reps),
        factor=math.sqrt(1.0 + c_m.centre_variance()),
    )


def synthetic_noisy(reps: int, drop: float, rng: np.random.Generator, noise: RunNoise) -> Draws:
    """``synthetic`` with each side's run shift applied to its per-prompt acceptance."""
    slope = (1.0 - _factor_for_drop(0.01)) / 0.01  # p factor per unit of relative AL
    p = rng.beta(MEAN * CONC, (1 - MEAN) * CONC, size=(reps, PROMPTS))
    ref = np.clip(p * (1.0 + slope * noise.reference[:, None]), 0, 1)
    cand = np.clip(p * _factor_for_drop(drop) * (1.0 + slope * noise.candidate[:, None]), 0, 1)
    ref_acc, ref_d = _accepted(ref, rng)
    cand_acc, cand_d = _accepted(cand, rng)
    return Draws(ref_acc, ref_d, cand_acc, cand_d)


@dataclass
class NoisyTally:
    reps: int = 0
    prompt_only: int = 0
    calibrated: int = 0
    looks: int = 0
    prompts: float = 0.0
    calibrated_looks: int = 0
    calibrated_prompts: float = 0.0

    def add(self, d: Draws, noise: RunNoise, design: SequentialDesign, run_sd: float) -> None:
        from farm.analysis.noise import NoiseRule

        k, z = NoiseRule().k, 1.959964
        r = d.ref_acc.shape[0]

        def calibrated_look(n: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
            """(drop, se, spread, min effect) at ``n`` prompts, calibrated: the drop
            re-centred on the window's median, the run variance in the se (and in the
            spread, so that spread / sqrt(max prompts) is the fixed rule's se)."""
            drop, se, spread, m = _look(d, n)
            ref_al = d.ref_acc[:, :n].sum(axis=1) / d.ref_drafts[:, :n].sum(axis=1) + 1
            level = ref_al / (1.0 + noise.reference)
            drop = drop - level * (noise.reference - noise.centre)
            run = (noise.factor * run_sd * level) ** 2
            return (
                drop,
                np.sqrt(se**2 + run),
                np.sqrt(spread**2 + PROMPTS * run),
                np.maximum(m, k * noise.factor * run_sd * level),
            )

        def calibrated_regress(n: int) -> npt.NDArray[np.bool_]:
            drop, se, _, m = calibrated_look(n)
            return np.asarray((drop - z * se > 0) & (drop >= m), dtype=bool)

        stopped = np.zeros(r, dtype=np.int64)
        for i, n in enumerate(design.looks):
            codes = decide_drops(design, i, *calibrated_look(n))
            new = (stopped == 0) & (codes != 0)
            self.calibrated_prompts += float(n * new.sum())
            self.calibrated_looks += int((new & (codes == REGRESS)).sum())
            stopped[new] = codes[new]

        decided = np.zeros(r, dtype=np.int64)
        used = np.full(r, float(PROMPTS))
        looks_regress = np.zeros(r, dtype=bool)
        for i, n in enumerate(design.looks):
            drop, se, spread, m = _look(d, n)
            codes = decide_drops(design, i, drop, se, spread, m)
            new = (decided == 0) & ((codes != 0) | (i == len(design.looks) - 1))
            used[new] = n
            if new.any():
                looks_regress[new] = calibrated_regress(n)[new]
            decided[new] = np.where(codes[new] != 0, codes[new], 1)
        self.reps += r
        self.prompt_only += int((codes == REGRESS).sum())  # the last look: 200 prompts
        self.calibrated += int(calibrated_regress(PROMPTS).sum())
        self.looks += int(looks_regress.sum())
        self.prompts += float(used.sum())


def run_noisy(
    reps: int,
    run_sd: float,
    nights: int,
    rng: np.random.Generator,
    design: SequentialDesign,
) -> None:
    t0 = time.monotonic()
    print(
        f"\nunder run-to-run noise: each run's AL shifted by sd {100 * run_sd:.1f}%\n"
        f"(the reference re-centred on {nights} nights); {reps} replicates per drop;\n"
        "regress % by rule"
    )
    print(
        f"{'drop':>5} {'prompt-only':>11} {'calibrated':>10} {'looks+cal':>9} {'E[N]':>5}"
        f" {'cal looks':>9} {'E[N]':>5}"
    )
    for drop in DROPS:
        tally = NoisyTally()
        while tally.reps < reps:
            n = min(CHUNK, reps - tally.reps)
            noise = draw_run_noise(n, run_sd, nights, rng)
            tally.add(synthetic_noisy(n, drop, rng, noise), noise, design, run_sd)
        t = tally
        print(
            f"{100 * drop:>4.0f}% {100 * t.prompt_only / t.reps:>11.2f} "
            f"{100 * t.calibrated / t.reps:>10.2f} {100 * t.looks / t.reps:>9.2f} "
            f"{t.prompts / t.reps:>5.0f} {100 * t.calibrated_looks / t.reps:>9.2f} "
            f"{t.calibrated_prompts / t.reps:>5.0f}",
            flush=True,
        )
    print(
        "(prompt-only: the fixed rule at 200 prompts against the last good night;\n"
        " calibrated: the farm's rule under noise at 200 prompts; looks+cal: prompts\n"
        " stopped by the prompt-only looks, judged by the calibrated rule (the farm\n"
        " before its looks were calibrated); cal looks: the looks under the\n"
        f" calibrated rule, as the farm runs them; {time.monotonic() - t0:.0f} s)"
    )


def wald_bound(theta: float, sigma: float, alpha: float, power: float, under_h1: bool) -> float:
    """Wald's lower bound on E[N] of a test of 0 vs ``theta`` with these error rates
    (normal per-prompt differences of SD ``sigma``); nan where it says nothing."""
    if sigma <= 0 or theta <= 0 or power < 0.5:
        return math.nan
    a, b = min(alpha, 0.5), min(max(1 - power, 1e-12), 0.5)
    kl = theta * theta / (2 * sigma * sigma)
    if under_h1:
        num = (1 - b) * math.log((1 - b) / a) + b * math.log(b / (1 - a))
    else:
        num = (1 - a) * math.log((1 - a) / b) + a * math.log(a / (1 - b))
    return max(num, 0.0) / kl


def bootstrap_agreement(d: Draws, rows: int, rng: np.random.Generator) -> float:
    """Share of rows whose normal-interval fixed decision equals the bootstrap one."""
    drop, se, spread, m = _look(d, PROMPTS)
    design = SequentialDesign(final="normal")
    normal = decide_drops(design, len(design.looks) - 1, drop, se, spread, m) == REGRESS
    cfg = CheckConfig()
    same = 0
    for i in range(rows):
        ids = [f"p{j}" for j in range(PROMPTS)]
        sides = []
        for acc, drafts in ((d.ref_acc[i], d.ref_drafts[i]), (d.cand_acc[i], d.cand_drafts[i])):
            sides.append(AcceptanceSample(tuple(ids), drafts, drafts * DEPTH, acc, acc[:, None]))
        diff = compare_acceptance(sides[0], sides[1], rng=rng, resamples=cfg.resamples)
        _, bad = classify_difference(
            diff.mean_acceptance_length, cfg.min_al_effect(diff.reference_al.estimate), "lower"
        )
        same += bad == bool(normal[i])
    return same / rows


def run(
    label: str,
    draw: Draw,
    reps: int,
    check_rows: int,
    rng: np.random.Generator,
    design: SequentialDesign,
) -> None:
    """Measure both rules at every drop and print one table."""
    t0 = time.monotonic()
    tallies: dict[float, Tally] = {}
    agree: dict[float, float] = {}
    for drop in DROPS:
        tally = Tally()
        first: Draws | None = None
        while tally.reps < reps:
            d = draw(min(CHUNK, reps - tally.reps), drop, rng)
            first = first or d
            tally.add(d, design)
            print(
                f"  {label}: drop {100 * drop:.0f}%, {tally.reps}/{reps} replicates, "
                f"{time.monotonic() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        tallies[drop] = tally
        assert first is not None
        agree[drop] = bootstrap_agreement(first, check_rows, rng) if check_rows else math.nan
    # The fixed rule's false-alarm rate; at 0 of n, its 95% upper bound 3/n (a larger
    # alpha only lowers Wald's bound, which stays a bound).
    alpha = max(tallies[0.0].fixed, 3) / tallies[0.0].reps
    print(
        f"\n{label}\n{reps} replicates per drop; looks every {design.look_every} up to "
        f"{PROMPTS} prompts;\npass boundary built at the fixed rule's "
        f"{100 * design.power:.0f}%-power drop, regress spending {design.regress_spending}"
    )
    print(
        f"{'drop':>5} {'regress %':>15} {'seq/fix':>7} {'early %':>13} {'E[prompts]':>12}"
        f" {'Wald':>5} {'boot':>5}"
    )
    print(
        f"{'':>5} {'fixed':>7} {'seq':>7} {'differ%':>7} {'regr':>6} {'pass':>6}"
        f" {'seq':>5} {'ratio':>6} {'E[N]':>5} {'agr%':>5}"
    )
    for drop, t in tallies.items():
        n = t.reps
        sigma = t.spread / n
        # Wald's bound: at a drop, against no drop; at no drop, against a 3% drop.
        theta = (drop if drop else 0.03) * t.ref_al / n
        power = (t if drop else tallies.get(0.03, t)).fixed / n
        wald = wald_bound(theta, sigma, alpha, power, under_h1=drop > 0)
        print(
            f"{100 * drop:>4.0f}% {100 * t.fixed / n:>7.2f} {100 * t.seq / n:>7.2f}"
            f" {100 * t.differ / n:>7.2f} {100 * t.early_regress / n:>6.1f}"
            f" {100 * t.early_pass / n:>6.1f} {t.prompts / n:>5.0f}"
            f" {t.prompts / n / PROMPTS:>6.2f} {_num(wald, 1):>5} {_num(agree[drop], 100):>5}"
        )
    clean = tallies[0.0]
    print(
        f"(at 0%: fixed {clean.fixed}, sequential {clean.seq} false alarms of {clean.reps};"
        f" per-prompt SD\n of the paired AL difference {clean.spread / clean.reps:.3f};"
        f" {time.monotonic() - t0:.0f} s)"
    )


def _num(x: float, scale: float) -> str:
    return "-" if math.isnan(x) else f"{scale * x:.0f}" if scale == 1 else f"{scale * x:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicates", type=int, default=10_000, help="per drop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recorded", type=Path, metavar="DIR", help="also the real repeats")
    parser.add_argument(
        "--bootstrap-check", type=int, default=100, help="replicates per drop checked"
    )
    parser.add_argument("--look-every", type=int, default=16)
    parser.add_argument("--run-sd", type=float, default=0.0, help="relative AL sd per run")
    parser.add_argument("--nights", type=int, default=10, help="the baseline window")
    parser.add_argument("--power", type=float, default=0.8, help="SequentialDesign.power")
    parser.add_argument(
        "--regress-spending",
        choices=("no_drop", "oc"),
        default="no_drop",
        help="SequentialDesign.regress_spending",
    )
    args = parser.parse_args()
    design = SequentialDesign(
        look_every=args.look_every,
        max_prompts=PROMPTS,
        power=args.power,
        final="normal",
        regress_spending=args.regress_spending,
    )
    rng = np.random.default_rng(args.seed)
    t0 = time.monotonic()
    run(
        "synthetic (tests/fakes/simulate.py)",
        synthetic,
        args.replicates,
        args.bootstrap_check,
        rng,
        design,
    )
    if args.recorded:
        for rec in load_recorded(args.recorded):
            run(f"recorded {rec.name}", rec.draw, args.replicates, 0, rng, design)
    if args.run_sd:
        run_noisy(args.replicates, args.run_sd, args.nights, rng, design)
    print(f"\n({time.monotonic() - t0:.0f} s, seed {args.seed})")


if __name__ == "__main__":
    main()

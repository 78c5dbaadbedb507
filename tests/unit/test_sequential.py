"""The sequential AL rule: boundaries, the fixed rule at the last look, early stops."""

from __future__ import annotations

import numpy as np
import pytest

from farm.analysis.check_rules import CheckConfig, classify_difference
from farm.analysis.noise import KeyNoise, NoiseRule, calibrated, look_calibration
from farm.analysis.sequential import (
    SequentialDesign,
    decide_drops,
    decide_look,
    look_statistics,
    obrien_fleming_spend,
    run_sequential,
    spending_boundaries,
)
from farm.analysis.stats import AcceptanceSample, Interval, compare_acceptance
from farm.records import LookCalibration
from tests.fakes.simulate import prompt_acceptance, simulate_sample

DEPTH = 3


def _pair(
    seed: int, factor: float, n: int = 200, steps: float = 40.0
) -> tuple[AcceptanceSample, AcceptanceSample]:
    """Reference and candidate on the same prompts; candidate acceptance times ``factor``."""
    rng = np.random.default_rng(seed)
    p = prompt_acceptance(n, mean=0.8, concentration=8.0, rng=rng)
    ref = simulate_sample(p, depth=DEPTH, rng=rng, verify_steps=steps)
    cand = simulate_sample(np.clip(p * factor, 0, 1), depth=DEPTH, rng=rng, verify_steps=steps)
    return ref, cand


def _fixed_rule(ref: AcceptanceSample, cand: AcceptanceSample, cfg: CheckConfig) -> bool:
    d = compare_acceptance(ref, cand, rng=cfg.rng(""), paired=True, resamples=cfg.resamples)
    return classify_difference(
        d.mean_acceptance_length, cfg.min_al_effect(d.reference_al.estimate), "lower"
    )[1]


def test_design_looks_end_at_max() -> None:
    design = SequentialDesign(look_every=16, max_prompts=200)
    assert design.looks[:2] == (16, 32) and design.looks[-2:] == (192, 200)
    assert SequentialDesign(look_every=50, max_prompts=200).looks == (50, 100, 150, 200)
    with pytest.raises(ValueError, match="look_every"):
        SequentialDesign(look_every=300, max_prompts=200)


def test_spending_is_obrien_fleming_shaped() -> None:
    assert obrien_fleming_spend(1.0, 0.05) == pytest.approx(0.05)
    assert obrien_fleming_spend(0.0, 0.05) == 0.0
    spent = [obrien_fleming_spend(t, 0.05) for t in (0.1, 0.3, 0.5, 0.8)]
    assert spent == sorted(spent) and spent[0] < 1e-6


def test_one_look_boundary_is_the_normal_quantile() -> None:
    assert spending_boundaries((1.0,), (0.025,))[0] == pytest.approx(1.96, abs=0.01)


def test_boundaries_fall_monotonically_and_cross_with_their_spend() -> None:
    fractions = tuple(k / 10 for k in range(1, 11))
    total = 0.025
    cumulative = [obrien_fleming_spend(t, total) for t in fractions]
    spend = tuple(np.diff([0.0, *cumulative]))
    bounds = spending_boundaries(fractions, spend)
    assert np.all(np.diff(bounds) < 0), bounds
    # A smaller total spend gives higher boundaries at every look.
    smaller = tuple(s / 10 for s in spend)
    assert np.all(spending_boundaries(fractions, smaller) > bounds)
    # Monte Carlo: a zero-drift statistic crosses them with the total spend.
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((40_000, len(fractions))) * np.sqrt(np.diff([0.0, *fractions]))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = float((z >= bounds).any(axis=1).mean())
    assert crossed == pytest.approx(total, abs=0.004)


def test_single_look_design_is_the_fixed_rule() -> None:
    design = SequentialDesign(look_every=200, max_prompts=200)
    for seed, factor in [(1, 1.0), (2, 0.97), (3, 0.95), (4, 0.9), (5, 0.985)]:
        ref, cand = _pair(seed, factor)
        record = run_sequential(ref, cand, design)
        assert record.prompts_used == 200
        assert (record.decision == "regress") == _fixed_rule(ref, cand, design.check)


def test_last_look_of_many_is_the_fixed_rule() -> None:
    design = SequentialDesign()
    last = len(design.looks) - 1
    decisions = set()
    for seed, factor in [(6, 1.0), (7, 0.96), (8, 0.95), (9, 0.9)]:
        ref, cand = _pair(seed, factor)
        look = decide_look(ref, cand, design, last)
        assert look.decision != "continue"
        assert (look.decision == "regress") == _fixed_rule(ref, cand, design.check)
        decisions.add(look.decision)
    assert decisions == {"regress", "pass"}


def test_big_drop_stops_early_as_regress() -> None:
    ref, cand = _pair(10, 0.85)  # about a 15% AL drop
    record = run_sequential(ref, cand, SequentialDesign())
    assert record.decision == "regress"
    assert record.prompts_used < 100 and record.stopped_early
    assert record.describe().startswith(f"regress: decided after {record.prompts_used} of 200")
    last = record.looks[-1]
    assert last.statistics.difference <= last.regress_at
    assert all(look.decision == "continue" for look in record.looks[:-1])


def test_oc_spending_stops_a_drop_no_later() -> None:
    ref, cand = _pair(20, 0.93)
    late = run_sequential(ref, cand, SequentialDesign())
    early = run_sequential(ref, cand, SequentialDesign(regress_spending="oc"))
    assert late.decision == early.decision == "regress"
    assert early.prompts_used < late.prompts_used
    assert early.parameters["regress_spending"] == "oc"


def test_clean_cell_stops_as_pass_with_the_change_bounded() -> None:
    ref, cand = _pair(11, 1.0, steps=400.0)  # long requests: a tight interval early
    design = SequentialDesign()
    record = run_sequential(ref, cand, design)
    assert record.decision == "pass" and record.prompts_used <= 64
    st = record.looks[-1].statistics
    half = design.z_level * st.se
    assert -st.min_effect < st.difference - half and st.difference + half < st.min_effect
    assert st.difference >= record.looks[-1].pass_at


def test_undecided_first_look_continues() -> None:
    design = SequentialDesign()
    for seed, factor in [(12, 0.98), (13, 0.97), (14, 1.0)]:
        ref, cand = _pair(seed, factor, n=16)
        look = decide_look(ref, cand, design, 0)
        assert look.decision == "continue"
        assert look.regress_at < look.statistics.difference < look.pass_at


def test_deterministic_given_the_seed() -> None:
    ref, cand = _pair(15, 0.98)
    design = SequentialDesign(check=CheckConfig(seed=3))
    a = run_sequential(ref, cand, design, name="cell-a")
    b = run_sequential(ref, cand, design, name="cell-a")
    assert a == b
    assert a.rule.startswith("group-sequential") and a.parameters["look_every"] == 16
    assert a.planned_looks == design.looks and len(a.looks) <= len(design.looks)


def test_vectorised_core_agrees_with_the_look() -> None:
    design = SequentialDesign()
    for seed, factor in [(16, 1.0), (17, 0.9), (18, 0.97)]:
        ref, cand = _pair(seed, factor, n=64)
        look = decide_look(ref, cand, design, 3)
        st = look_statistics(ref, cand, design.check)
        code = decide_drops(
            design,
            3,
            np.array([-st.difference]),
            np.array([st.se]),
            np.array([st.se * np.sqrt(st.prompts)]),
            np.array([st.min_effect]),
        )[0]
        assert ("continue", "regress", "pass")[code] == look.decision


def test_unpaired_samples_are_refused() -> None:
    ref, cand = _pair(19, 1.0, n=20)
    other = AcceptanceSample(
        prompt_ids=tuple(f"q{k}" for k in range(20)),
        drafts=cand.drafts,
        draft_tokens=cand.draft_tokens,
        accepted=cand.accepted,
        per_pos=cand.per_pos,
    )
    with pytest.raises(ValueError, match="paired"):
        look_statistics(ref, other, CheckConfig())


def test_a_calibrated_look_reads_a_run_shift_within_the_spread_as_noise() -> None:
    # The candidate run's acceptance is 7% lower on every prompt: a per-run shift the
    # prompt-only rule reads as a drop; a key whose nights move AL by sd 0.1 does not.
    ref, cand = _pair(10, 0.93)
    design = SequentialDesign()
    assert run_sequential(ref, cand, design).decision == "regress"
    noisy = LookCalibration(run_sd=0.1 * 2**0.5, min_effect=3 * 0.1 * 2**0.5)
    record = run_sequential(ref, cand, design, calibration=noisy)
    assert record.decision == "pass" and record.calibration == noisy
    last = record.looks[-1]
    assert last.pass_at <= last.statistics.difference
    # A drop beyond the calibrated minimum effect is still caught.
    _, big = _pair(10, 0.80)
    assert run_sequential(ref, big, design, calibration=noisy).decision == "regress"


def test_a_calibrated_look_measures_the_drop_from_the_windows_centre() -> None:
    # The reference night drew 0.25 above its key's window: against the centre the
    # candidate's 7% lower run is no drop at all, and the boundaries move with it.
    ref, cand = _pair(10, 0.93)
    al = look_statistics(ref, cand, CheckConfig()).reference_al
    small = 0.02
    at_night = LookCalibration(run_sd=small, min_effect=3 * small)
    at_centre = at_night.model_copy(update={"centre": al - 0.25})
    design = SequentialDesign()
    assert run_sequential(ref, cand, design, calibration=at_night).decision == "regress"
    record = run_sequential(ref, cand, design, calibration=at_centre)
    assert record.decision == "pass"
    ids = ref.prompt_ids[:32]
    first, second = ref.take(ids), cand.take(ids)
    night = decide_look(first, second, design, 1, calibration=at_night)
    moved = decide_look(first, second, design, 1, calibration=at_centre)
    shift = look_statistics(first, second, CheckConfig()).reference_al - (al - 0.25)
    # Both boundaries, on the raw difference, move by the reference's lead on the centre.
    assert moved.regress_at == pytest.approx(night.regress_at - shift)
    assert moved.pass_at == pytest.approx(night.pass_at - shift)


def test_the_looks_calibration_is_the_rule_the_night_is_judged_by() -> None:
    noise = KeyNoise(nights=12, al_sd=0.03, centre=2.9, centre_nights=10)
    rule = NoiseRule()
    looks = look_calibration(noise, rule)
    assert looks is not None and looks.centre == 2.9
    diff = Interval(estimate=-0.1, low=-0.2, high=0.0, level=0.95)
    _, threshold = calibrated(diff, 0.06, noise, rule, reference_al=3.0)
    assert threshold.matches(looks) and "re-centred" in looks.rule
    other = KeyNoise(nights=12, al_sd=0.04, centre=2.9, centre_nights=10)
    assert not calibrated(diff, 0.06, other, rule, reference_al=3.0)[1].matches(looks)
    assert look_calibration(KeyNoise(nights=3, al_sd=0.03), rule) is None  # too few nights
    assert look_calibration(KeyNoise(nights=12, al_sd=0.0), rule) is None  # deterministic

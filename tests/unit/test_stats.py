"""Request-level bootstrap and Wilson intervals: coverage, pairing, false positives."""

from __future__ import annotations

import numpy as np
import pytest

from farm.analysis.stats import (
    AcceptanceSample,
    BinarySample,
    acceptance_stats,
    accuracy,
    compare_acceptance,
    compare_proportions,
    greedy_divergence,
    wilson_interval,
)
from farm.records import RequestRecord, SpecCounters
from tests.fakes.simulate import (
    expected_al,
    prompt_acceptance,
    simulate_requests,
    simulate_sample,
)

MEAN, CONC, DEPTH = 0.8, 8.0, 3


def _request(pid: str, counters: SpecCounters | None, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        prompt_id=pid,
        output_text="x",
        completion_tokens=1,
        finish_reason="stop",
        latency_s=0.1,
        counters=counters,
        error=error,
    )


def test_al_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    long = SpecCounters(drafts=90, draft_tokens=270, accepted=180, accepted_per_pos=(80, 60, 40))
    short = SpecCounters(drafts=10, draft_tokens=30, accepted=0, accepted_per_pos=(0, 0, 0))
    sample = AcceptanceSample.from_counters(["a", "b"], [long, short])
    stats = acceptance_stats(sample, rng=0, resamples=200)
    assert stats.mean_acceptance_length is not None and stats.acceptance_rate is not None
    assert stats.mean_acceptance_length.estimate == pytest.approx(1 + 180 / 100)
    assert stats.acceptance_rate.estimate == pytest.approx(180 / 300)
    assert [p.estimate for p in stats.per_position] == pytest.approx([0.8, 0.6, 0.4])


def test_requests_without_counters_or_with_errors_are_left_out() -> None:
    c = SpecCounters(drafts=10, draft_tokens=30, accepted=15, accepted_per_pos=(8, 5, 2))
    sample = AcceptanceSample.from_requests(
        [_request("a", c), _request("b", None), _request("c", c, error="timeout")]
    )
    assert sample.prompt_ids == ("a",)
    off = acceptance_stats(AcceptanceSample.from_counters(["a"], [SpecCounters()]), rng=0)
    assert off.mean_acceptance_length is None and off.per_position == ()


def test_bootstrap_interval_covers_the_true_al() -> None:
    """>= 90% of 95% intervals cover the population AL over 200 simulated datasets."""
    rng = np.random.default_rng(7)
    truth = expected_al(MEAN, CONC, DEPTH)
    pos0 = expected_al(MEAN, CONC, 1) - 1.0
    covered = covered_pos = 0
    for _ in range(200):
        p = prompt_acceptance(60, mean=MEAN, concentration=CONC, rng=rng)
        stats = acceptance_stats(simulate_sample(p, depth=DEPTH, rng=rng), rng=rng, resamples=400)
        al = stats.mean_acceptance_length
        assert al is not None
        covered += al.low <= truth <= al.high
        covered_pos += stats.per_position[0].low <= pos0 <= stats.per_position[0].high
    assert covered >= 180
    assert covered_pos >= 180


def test_paired_interval_is_narrower_when_prompts_are_shared() -> None:
    rng = np.random.default_rng(3)
    p = prompt_acceptance(200, mean=MEAN, concentration=CONC, rng=rng)
    a = simulate_sample(p, depth=DEPTH, rng=rng)
    b = simulate_sample(p, depth=DEPTH, rng=rng)
    paired = compare_acceptance(a, b, rng=1, resamples=1000)
    unpaired = compare_acceptance(a, b, rng=1, resamples=1000, paired=False)
    assert paired.paired and paired.pairs == 200 and not unpaired.paired
    width = paired.mean_acceptance_length.high - paired.mean_acceptance_length.low
    width_unpaired = unpaired.mean_acceptance_length.high - unpaired.mean_acceptance_length.low
    assert width < 0.6 * width_unpaired


def test_different_prompt_sets_compare_unpaired() -> None:
    rng = np.random.default_rng(4)
    p = prompt_acceptance(50, mean=MEAN, concentration=CONC, rng=rng)
    a = simulate_sample(p, depth=DEPTH, rng=rng, prefix="a")
    b = simulate_sample(p, depth=DEPTH, rng=rng, prefix="b")
    assert not compare_acceptance(a, b, rng=0, resamples=200).paired


def test_same_distribution_false_positive_rate_is_near_nominal() -> None:
    rng = np.random.default_rng(11)
    significant = 0
    for _ in range(100):
        p = prompt_acceptance(80, mean=MEAN, concentration=CONC, rng=rng)
        a = simulate_sample(p, depth=DEPTH, rng=rng)
        b = simulate_sample(p, depth=DEPTH, rng=rng)
        d = compare_acceptance(a, b, rng=rng, resamples=400)
        significant += d.mean_acceptance_length.excludes(0.0)
    assert significant <= 12  # nominal 5 of 100; binomial 99th percentile is 11


def test_a_ten_percent_drop_is_significant() -> None:
    rng = np.random.default_rng(5)
    p = prompt_acceptance(200, mean=MEAN, concentration=CONC, rng=rng)
    a = simulate_sample(p, depth=DEPTH, rng=rng)
    b = simulate_sample(p * 0.9, depth=DEPTH, rng=rng)
    d = compare_acceptance(a, b, rng=0, resamples=1000)
    assert d.mean_acceptance_length.high < 0
    assert d.relative.estimate == pytest.approx(-0.14, abs=0.04)
    assert all(pos.high < 0 for pos in d.per_position)


def test_results_are_reproducible_with_a_seed() -> None:
    rng = np.random.default_rng(2)
    sample = simulate_sample(
        prompt_acceptance(30, mean=MEAN, concentration=CONC, rng=rng), depth=DEPTH, rng=rng
    )
    assert acceptance_stats(sample, rng=9) == acceptance_stats(sample, rng=9)


def test_wilson_interval_matches_published_values() -> None:
    # Newcombe (1998), Statistics in Medicine 17:857, table I.
    assert wilson_interval(0, 10).high == pytest.approx(0.2775, abs=1e-4)
    five = wilson_interval(5, 10)
    assert (five.low, five.high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0).low == 0.0 and wilson_interval(0, 0).high == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_accuracy_and_greedy_divergence() -> None:
    rng = np.random.default_rng(6)
    p = prompt_acceptance(100, mean=MEAN, concentration=CONC, rng=rng)
    correct = list(rng.random(100) < 0.7)
    base = simulate_requests(p, depth=0, rng=rng, correct=correct)
    same = simulate_requests(p, depth=3, rng=rng, correct=correct)
    drift = simulate_requests(p, depth=3, rng=rng, correct=correct, divergence=0.3)
    acc = accuracy(base)
    assert acc is not None and acc.successes == sum(correct) and acc.n == 100
    div = greedy_divergence(same, base)
    assert div is not None and div.successes == 0 and div.interval.high < 0.05
    div = greedy_divergence(drift, base)
    assert div is not None and 0.15 < div.interval.estimate < 0.45
    assert greedy_divergence(same, []) is None


def test_paired_proportion_difference() -> None:
    ids = tuple(f"p{i}" for i in range(200))
    ref = BinarySample(prompt_ids=ids, outcomes=np.ones(200))
    worse = np.ones(200)
    worse[:30] = 0
    d = compare_proportions(
        ref, BinarySample(prompt_ids=ids, outcomes=worse), rng=0, resamples=1000
    )
    assert d.paired and d.difference.estimate == pytest.approx(-0.15)
    assert d.difference.high < 0
    assert d.candidate.interval.low < 0.85 < d.candidate.interval.high

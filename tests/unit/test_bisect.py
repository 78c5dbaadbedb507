"""The pure search of `farm bisect`: midpoints, skips, inconclusive answers, the step
bound, PR numbers in subjects (farm.workflows.bisect)."""

from __future__ import annotations

import itertools
import math

import pytest

from farm.workflows.bisect import (
    Commit,
    StepVerdict,
    max_steps,
    next_position,
    pr_number,
    search_outcome,
)


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

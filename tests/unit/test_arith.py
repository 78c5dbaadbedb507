"""Unit tests of the synthetic arithmetic workload (generator, scratchpad, scorer)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest

from farm.workload.arith import (
    Problem,
    extract_answer,
    make_problems,
    parse_operands,
    render_completion,
    render_reasoning,
    score,
)

REPO = Path(__file__).resolve().parents[2]


def test_make_problems_is_deterministic_and_distinct():
    a = make_problems(50, seed=7)
    b = make_problems(50, seed=7)
    c = make_problems(50, seed=8)
    assert a == b
    assert a != c
    assert len({p.prompt for p in a}) == 50
    assert len({p.id for p in a}) == 50


def test_problem_fields_and_answers():
    for p in make_problems(100, seed=3, min_digits=1, max_digits=7):
        x, y = parse_operands(p.prompt)
        assert p.answer == str(x + y)
        assert 1 <= len(str(x)) <= 7 and 1 <= len(str(y)) <= 7
        assert p.prompt == f"What is {x} + {y}?"


def test_problem_is_frozen():
    p = make_problems(1, seed=1)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.answer = "0"  # type: ignore[misc]


def test_exclude_and_bad_args():
    first = make_problems(5, seed=11)
    excl = {parse_operands(p.prompt) for p in first}
    again = make_problems(5, seed=11, exclude=excl)
    assert not excl & {parse_operands(p.prompt) for p in again}
    with pytest.raises(ValueError):
        make_problems(-1, seed=0)
    with pytest.raises(ValueError):
        make_problems(1, seed=0, min_digits=3, max_digits=2)
    with pytest.raises(ValueError):
        parse_operands("What is two plus two?")


def test_render_reasoning_example():
    p = Problem(id="x", prompt="What is 57 + 968?", answer="1025")
    assert render_reasoning(p) == (
        "057+968 c0 r\n7+8+0=15\n05+96 c1 r5\n5+6+1=12\n0+9 c1 r25\n0+9+1=10\ndone 1025\n"
    )


def _replay(scratch: str) -> int:
    """Check every step of a scratchpad only from the previous lines."""
    lines = scratch.rstrip("\n").split("\n")
    m = re.fullmatch(r"(\d+)\+(\d+) c([01]) r(\d*)", lines[0])
    assert m
    a, b, c, r = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    assert len(a) == len(b) and c == 0 and r == ""
    i = 1
    while True:
        step = re.fullmatch(r"(\d)\+(\d)\+([01])=(\d+)", lines[i])
        assert step, lines[i]
        x, y, cc, t = (int(g) for g in step.groups())
        assert (x, y, cc) == (int(a[-1]), int(b[-1]), c) and t == x + y + c
        a, b, c, r = a[:-1], b[:-1], t // 10, str(t % 10) + r
        i += 1
        if not a:
            break
        assert lines[i] == f"{a}+{b} c{c} r{r}"
        i += 1
    assert lines[i] == f"done {'1' if c else ''}{r}" and i == len(lines) - 1
    return int(lines[i].split()[1])


def test_scratchpad_is_a_correct_procedure():
    for p in make_problems(200, seed=5, min_digits=1, max_digits=8):
        assert _replay(render_reasoning(p)) == int(p.answer)


def test_scratchpad_lines_are_short():
    # Every step needs only the previous line, which must stay well inside a 64-token
    # sliding window (the tokenizer is byte-level: one character is one token).
    for p in make_problems(100, seed=9, min_digits=6, max_digits=6):
        lines = render_reasoning(p).split("\n")
        assert max(len(a) + len(b) + 2 for a, b in itertools.pairwise(lines)) < 64


def test_completion_round_trip():
    for p in make_problems(20, seed=2):
        on = render_completion(p, thinking=True)
        off = render_completion(p, thinking=False)
        assert on.startswith(render_reasoning(p)) and "</think>\n\nAnswer: " in on
        assert off == f"Answer: {p.answer}"
        assert score(on, p.answer) and score(off, p.answer)
        assert extract_answer(on) == p.answer


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Answer: 42", "42"),
        ("  Answer:   42  ", "42"),
        ("1+2+0=3\ndone 3\n</think>\n\nAnswer: 3", "3"),
        ("<think>\nAnswer: 1\n</think>\n\nAnswer: 2", "2"),
        ("Answer: 1\n</think>\n\nno answer here", None),
        ("<think>\n12+34 c0 r\n", None),  # truncated thinking
        ("12+34 c0 r\n4+2+0=6", None),  # thinking in progress, no tags
        ("", None),
        ("Answer: 5\nAnswer: 7", "7"),
        ("Answer: -3", "-3"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_score():
    assert score("</think>\n\nAnswer: 1025", "1025")
    assert score("Answer: 01025", "1025")
    assert not score("Answer: 1024", "1025")
    assert not score("1025", "1025")  # the answer format is required
    assert not score("<think>\nAnswer: 1025", "1025")


def test_shipped_workload_is_held_out_set():
    path = REPO / "workloads" / "arith.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 200
    assert all(set(r) == {"id", "prompt", "answer"} for r in rows)
    expected = make_problems(200, seed=20260101)
    assert [Problem(**r) for r in rows] == expected

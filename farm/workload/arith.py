"""Synthetic multi-digit addition with a deterministic thinking scratchpad.

Pure module: no I/O and no heavy imports. It is the task that the embedded tiny MTP
model (``models/tiny-mtp``) was trained on, and the scorer that checks its answers.

A problem asks ``What is A + B?``. With thinking on, the model writes the scratchpad
of :func:`render_reasoning` (one column per step, right to left, each step restating
the remaining operands, the carry and the partial result, so that every step only
needs the previous ~30 tokens and a sliding-window model can follow it), then
``</think>``, a blank line and ``Answer: N``. With thinking off it writes
``Answer: N`` directly.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = [
    "Problem",
    "extract_answer",
    "make_problems",
    "parse_operands",
    "render_completion",
    "render_reasoning",
    "score",
]

_PROMPT_RE = re.compile(r"What is (\d+) \+ (\d+)\?")
_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer (decimal string)."""

    id: str
    prompt: str
    answer: str


def _prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def make_problems(
    n: int,
    seed: int,
    *,
    min_digits: int = 3,
    max_digits: int = 6,
    exclude: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
) -> list[Problem]:
    """Return ``n`` distinct addition problems, deterministic in ``seed``.

    Each operand has a uniformly drawn number of digits in
    ``[min_digits, max_digits]`` (no leading zero). Pairs in ``exclude`` are skipped
    (used to keep training data apart from the shipped held-out set).
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not 1 <= min_digits <= max_digits:
        raise ValueError("need 1 <= min_digits <= max_digits")
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out: list[Problem] = []
    while len(out) < n:
        na = rng.randint(min_digits, max_digits)
        nb = rng.randint(min_digits, max_digits)
        a = rng.randint(10 ** (na - 1) if na > 1 else 0, 10**na - 1)
        b = rng.randint(10 ** (nb - 1) if nb > 1 else 0, 10**nb - 1)
        if (a, b) in seen or (a, b) in exclude:
            continue
        seen.add((a, b))
        out.append(
            Problem(id=f"arith-{seed}-{len(out):04d}", prompt=_prompt(a, b), answer=str(a + b))
        )
    return out


def parse_operands(prompt: str) -> tuple[int, int]:
    """Operands of a prompt made by :func:`make_problems`."""
    m = _PROMPT_RE.search(prompt)
    if m is None:
        raise ValueError(f"not an arith prompt: {prompt!r}")
    return int(m.group(1)), int(m.group(2))


def render_reasoning(problem: Problem) -> str:
    """The thinking scratchpad (the text between ``<think>\\n`` and ``</think>``).

    Example for ``57 + 968``::

        057+968 c0 r
        7+8+0=15
        05+96 c1 r5
        5+6+1=12
        0+9 c1 r25
        0+9+1=10
        done 1025
    """
    a, b = parse_operands(problem.prompt)
    width = max(len(str(a)), len(str(b)))
    sa, sb = str(a).zfill(width), str(b).zfill(width)
    carry, res = 0, ""
    lines = [f"{sa}+{sb} c{carry} r{res}"]
    while sa:
        x, y = int(sa[-1]), int(sb[-1])
        t = x + y + carry
        lines.append(f"{x}+{y}+{carry}={t}")
        sa, sb = sa[:-1], sb[:-1]
        carry, res = t // 10, str(t % 10) + res
        if sa:
            lines.append(f"{sa}+{sb} c{carry} r{res}")
    final = ("1" if carry else "") + res
    lines.append(f"done {final}")
    return "\n".join(lines) + "\n"


def render_completion(problem: Problem, thinking: bool) -> str:
    """What the model writes after the chat template's generation prompt.

    The template already emits ``<think>\\n`` (thinking on) or the empty
    ``<think>\\n\\n</think>\\n\\n`` block (thinking off).
    """
    answer = f"Answer: {problem.answer}"
    if thinking:
        return render_reasoning(problem) + "</think>\n\n" + answer
    return answer


def extract_answer(text: str) -> str | None:
    """The final answer in a completion, or None.

    Only text after the last ``</think>`` counts; a completion that opened
    ``<think>`` without closing it (truncated thinking) has no answer.
    """
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None
    found = _ANSWER_RE.findall(text)
    return found[-1] if found else None


def _norm(s: str) -> str:
    s = s.strip()
    if re.fullmatch(r"-?\d+", s):
        return str(int(s))
    return s


def score(text: str, answer: str) -> bool:
    """True when the completion's final answer equals the reference."""
    got = extract_answer(text)
    return got is not None and _norm(got) == _norm(answer)

"""The prompt-file formats a workload reads: the farm's own records and the field's
standard speculative-decoding prompt sets, each turned into :class:`Prompt` records.

- ``farm``: ``{"id", "prompt", "answer"?, "turns"?: [{"prompt", "answer"?}], "category"?}``.
- ``mt-bench``: FastChat's ``data/mt_bench/question.jsonl`` (vLLM's acceptance test
  prompts): ``{"question_id", "category", "turns": [str, ...], "reference"?}``; every
  turn is sent, the second with the first answer in its context, as MT-Bench does.
- ``speed-bench``: a SPEED-Bench subset as NeMo-Skills' ``prepare.py`` writes it (the
  file ``vllm bench serve --dataset-name speed_bench`` reads, e.g.
  ``qualitative.jsonl``): ``{"category", "messages": [{"role": "user", "content"}],
  "question_id"?}``. vLLM's loader sends only the first message; the farm sends each
  user message as a turn of one conversation.

MT-Bench and SPEED-Bench are judged by a model, not by answer matching: their prompts
carry no answer, and a workload of them measures acceptance (per category), greedy
agreement and speed. Both files list their prompts category by category, so the first
``count`` records would all be of one category: :func:`select_prompts` takes them
round-robin across categories instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from farm.frozen import Frozen
from farm.spec.parts import PromptFormat

__all__ = ["Prompt", "Turn", "parse_record", "select_prompts"]

# Each model below reads records of a prompt file (the farm's own or a public data
# set's, such as MT-Bench's): keys the farm does not read are ignored (extra="ignore").


class Turn(Frozen):
    """A follow-up user turn of a conversation, with its expected answer."""

    model_config = ConfigDict(extra="ignore")

    prompt: str
    answer: str | None = None


class Prompt(Frozen):
    """One prompt record; with ``turns``, the first turn of a conversation.

    Each follow-up turn is sent once the answer before it came back, with every
    earlier turn and answer in its context: the engine's prefix cache then finds the
    conversation so far (multi-turn chat: the prefix reuse under which the second
    seed bug, sglang PR #27202, shows). Turn ``k >= 2`` is recorded as request
    ``{id}#{k}``. ``category`` (MT-Bench's and SPEED-Bench's own) goes with every
    request of the record, so a report can break acceptance down by it.
    """

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1)
    prompt: str
    answer: str | None = None
    turns: tuple[Turn, ...] = ()
    category: str | None = Field(default=None, min_length=1)

    def conversation(self) -> tuple[tuple[str, Turn], ...]:
        """``(request id, turn)`` of every turn, the first one included."""
        first = Turn(prompt=self.prompt, answer=self.answer)
        return ((self.id, first), *((f"{self.id}#{k}", t) for k, t in enumerate(self.turns, 2)))


class _MtBench(Frozen):
    model_config = ConfigDict(extra="ignore")

    question_id: int | str
    category: str = Field(min_length=1)
    turns: tuple[str, ...] = Field(min_length=1)


class _Message(Frozen):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str


class _SpeedBench(Frozen):
    model_config = ConfigDict(extra="ignore")

    question_id: int | str | None = None
    id: int | str | None = None
    category: str = Field(min_length=1)
    messages: tuple[_Message, ...] = Field(min_length=1)


def _farm(data: dict[str, Any], number: int) -> Prompt:
    return Prompt.model_validate(data)


def _mt_bench(data: dict[str, Any], number: int) -> Prompt:
    q = _MtBench.model_validate(data)
    return Prompt(
        id=f"mt-bench-{q.question_id}",
        prompt=q.turns[0],
        turns=tuple(Turn(prompt=t) for t in q.turns[1:]),
        category=q.category,
    )


def _speed_bench(data: dict[str, Any], number: int) -> Prompt:
    q = _SpeedBench.model_validate(data)
    users = [m.content for m in q.messages if m.role == "user"]
    if not users:
        raise ValueError("messages: no message of role user")
    # Prepared subsets may lack an id column: the line number is stable for a file.
    key = q.question_id if q.question_id is not None else q.id
    return Prompt(
        id=f"speed-bench-{key if key is not None else number}",
        prompt=users[0],
        turns=tuple(Turn(prompt=t) for t in users[1:]),
        category=q.category,
    )


_PARSERS: dict[str, Callable[[dict[str, Any], int], Prompt]] = {
    "farm": _farm,
    "mt-bench": _mt_bench,
    "speed-bench": _speed_bench,
}


_KEYS = {
    "farm": "id and prompt",
    "mt-bench": "question_id, category and turns",
    "speed-bench": "category and messages",
}


def parse_record(data: object, fmt: PromptFormat, number: int) -> Prompt | str:
    """The prompt record of one decoded JSON line (line ``number``) of a ``fmt`` file,
    or what is wrong with it."""
    kind = "prompt record" if fmt == "farm" else f"{fmt} record"
    if not isinstance(data, dict):
        return f"not a {kind}: a JSON object with {_KEYS[fmt]}, not {type(data).__name__}"
    try:
        return _PARSERS[fmt](data, number)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in exc.errors()
        )
        return f"not a {kind}: {problems}"
    except ValueError as exc:
        return f"not a {kind}: {exc}"


def select_prompts(prompts: Sequence[Prompt], count: int) -> tuple[Prompt, ...]:
    """The first ``count`` prompts; where the records have categories, taken
    round-robin across the categories (in the order they first appear), so that any
    count covers every category as evenly as it can."""
    if not any(p.category for p in prompts):
        return tuple(prompts[:count])
    queues: dict[str | None, list[Prompt]] = {}
    for p in prompts:
        queues.setdefault(p.category, []).append(p)
    taken: list[Prompt] = []
    rank = 0
    while len(taken) < count:
        row = [q[rank] for q in queues.values() if rank < len(q)]
        if not row:
            break
        taken += row[: count - len(taken)]
        rank += 1
    return tuple(taken)

"""Multi-turn prompt records: each turn goes with the conversation so far.

The HTTP side is httpx's own MockTransport standing in for an engine's chat endpoint
(the runner's request logic, not an engine, is under test here; the real engine
serves conversations in tests/integration/test_sweep_engine.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.engines import adapter_for
from farm.engines.base import chat_messages
from farm.engines.process import ServerLaunch
from farm.plan import Variant
from farm.runner.variants import _Chat, _Silence
from farm.spec import WorkloadSpec
from farm.workload.context import RequestContext
from farm.workload.prompts import Prompt, scorer_for

WORKLOAD = WorkloadSpec(name="w", prompts="p.jsonl", scorer="arith", concurrency=2)
RECORD = Prompt.model_validate(
    {
        "id": "c1",
        "prompt": "What is 1 + 1?",
        "answer": "2",
        "turns": [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 3 + 3?"}],
    }
)


def _answer(text: str) -> dict[str, Any]:
    return {
        "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 3},
    }


def _converse(handler: Any, context: RequestContext | None = None) -> list[Any]:
    async def go() -> list[Any]:
        async with httpx.AsyncClient(
            base_url="http://engine", transport=httpx.MockTransport(handler)
        ) as client:
            chat = _Chat(
                client,
                None,  # type: ignore[arg-type]  # only read once the engine is gone
                adapter_for("vllm"),
                ServerLaunch(argv=(), env={}),
                Variant(thinking="on", workload="w"),
                WORKLOAD,
                "tiny",
                scorer_for("arith"),
                asyncio.Semaphore(2),
                _Silence(2, 30),
                Path("no-log"),  # read only for counters the engine logged
                {RECORD.id: context} if context else {},
            )
            return await chat.converse(RECORD)

    return asyncio.run(go())


def test_each_turn_carries_the_earlier_turns_and_answers() -> None:
    seen: list[list[dict[str, str]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        seen.append(messages)
        return httpx.Response(
            200, json=_answer(f"<think>\nsum\n</think>\n\nAnswer: {2 * len(seen)}")
        )

    records = _converse(handler)
    assert [r.prompt_id for r in records] == ["c1", "c1#2", "c1#3"]
    assert [r.correct for r in records] == [True, True, None]  # the third has no answer
    assert seen[0] == chat_messages("What is 1 + 1?")
    # The answers go back as the engine gave them, thinking included.
    assert seen[2] == [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "<think>\nsum\n</think>\n\nAnswer: 2"},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "<think>\nsum\n</think>\n\nAnswer: 4"},
        {"role": "user", "content": "What is 3 + 3?"},
    ]


def test_a_context_goes_before_the_conversation_and_stays_in_every_turn() -> None:
    seen: list[list[dict[str, str]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["messages"])
        return httpx.Response(200, json=_answer(f"Answer: {2 * len(seen)}"))

    context = RequestContext(history=(("What is 9 + 9?", "18"),), document="DOC", tokens=12)
    records = _converse(handler, context)
    assert [r.correct for r in records] == [True, True, None]
    assert seen[0] == chat_messages("DOC\n\nWhat is 1 + 1?", [("What is 9 + 9?", "18")])
    # Later turns carry the context and the first turn as it was sent.
    assert seen[2][:3] == [
        {"role": "user", "content": "What is 9 + 9?"},
        {"role": "assistant", "content": "18"},
        {"role": "user", "content": "DOC\n\nWhat is 1 + 1?"},
    ]
    assert len(seen[2]) == 7


def test_a_failed_turn_ends_its_conversation_and_the_rest_is_recorded_unsent() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 2:
            return httpx.Response(500, text="boom")
        return httpx.Response(200, json=_answer("2"))

    records = _converse(handler)
    assert len(calls) == 2 and len(records) == 3
    assert records[0].error is None
    assert records[1].error is not None and "HTTP 500" in records[1].error
    assert records[2].error == "not sent: turn 2 of the conversation failed"


def test_a_workload_system_prompt_leads_every_request_and_names_the_workload() -> None:
    from farm.plan import workload_identity

    system = WORKLOAD.model_copy(update={"system_prompt": "Add digit by digit."})
    body = adapter_for("vllm").chat_request(
        "tiny", "What is 2 + 2?", Variant(thinking="on", workload="w"), system, [("a", "b")]
    )
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == "Add digit by digit."
    # Another system prompt measures something else; none keeps earlier identities.
    assert workload_identity(system) != workload_identity(WORKLOAD)
    assert workload_identity(WORKLOAD) == workload_identity(WORKLOAD.model_copy())
    with pytest.raises(ValueError, match="a harness writes its own messages"):
        WorkloadSpec(name="h", harness={"task": "gsm8k"}, system_prompt="x")


def test_workload_template_switches_go_with_every_request_and_name_the_workload() -> None:
    from farm.plan import workload_identity

    kept = WORKLOAD.model_copy(update={"chat_template_kwargs": {"preserve_thinking": True}})
    for family in ("vllm", "sglang"):
        for thinking in ("on", "off"):
            body = adapter_for(family).chat_request(
                "tiny", "What is 2 + 2?", Variant(thinking=thinking, workload="w"), kept
            )
            assert body["chat_template_kwargs"] == {
                "preserve_thinking": True,
                "enable_thinking": thinking == "on",
            }
    assert workload_identity(kept) != workload_identity(WORKLOAD)
    with pytest.raises(ValueError, match="enable_thinking is set by the thinking axis"):
        WorkloadSpec(name="w", prompts="p.jsonl", chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(ValueError, match="a harness writes its own requests"):
        WorkloadSpec(name="h", harness={"task": "gsm8k"}, chat_template_kwargs={"x": 1})
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        WorkloadSpec(name="w", prompts="p.jsonl", chat_template_kwargs={"x": [1]})


@pytest.mark.parametrize("model", ["tiny-step", "tiny-hybrid", "tiny-mtp"])
def test_preserve_thinking_sends_back_the_exact_text_the_engine_decoded(model: str) -> None:
    # The stale-prefix canary's condition: the next turn's prompt starts with the
    # previous prompt and its decoded answer, so the prefix cache can reuse decoded
    # blocks. Without the switch the template drops the thinking, as Qwen3's does.
    import jinja2

    config = json.loads(
        (Path(__file__).parents[2] / "models" / model / "tokenizer_config.json").read_text()
    )
    template = jinja2.Environment().from_string(config["chat_template"])
    answer = "12+34 c0 r\n</think>\n\nAnswer: 46<|im_end|>"
    first = template.render(messages=chat_messages("What is 12 + 34?"), add_generation_prompt=True)
    history = [("What is 12 + 34?", answer.removesuffix("<|im_end|>"))]
    for preserve, continues in ((True, True), (False, False)):
        kwargs = {"preserve_thinking": True} if preserve else {}
        second = template.render(
            messages=chat_messages("And 1 + 1?", history), add_generation_prompt=True, **kwargs
        )
        assert second.startswith(first + answer) is continues

"""The field's prompt sets as workloads: MT-Bench and SPEED-Bench records, selection
across categories, bad records named by line, and acceptance by category."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.analysis import acceptance_by_category
from farm.errors import SpecError
from farm.records import RequestRecord, SpecCounters
from farm.spec import WorkloadSpec
from farm.workload.formats import Prompt, select_prompts
from farm.workload.prompts import load_prompts, read_prompt_file

REPO = Path(__file__).resolve().parents[2]
MT_BENCH = REPO / "workloads" / "mt-bench-sample.jsonl"
SPEED_BENCH = REPO / "workloads" / "speed-bench-sample" / "qualitative.jsonl"


def _lines(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mt_bench_records_become_two_turn_conversations_with_their_category() -> None:
    prompts, problems = read_prompt_file(MT_BENCH, "mt-bench")
    assert problems == [] and len(prompts) == 8
    first = prompts[0]
    assert first.id == "mt-bench-81" and first.category == "writing"
    assert [rid for rid, _ in first.conversation()] == ["mt-bench-81", "mt-bench-81#2"]
    assert first.answer is None  # judged by a model, not by answer matching
    assert len({p.category for p in prompts}) == 8


def test_speed_bench_messages_are_the_turns_and_a_missing_id_is_the_line(
    tmp_path: Path,
) -> None:
    prompts, problems = read_prompt_file(SPEED_BENCH, "speed-bench")
    assert problems == [] and len(prompts) == 8
    two_turns = next(p for p in prompts if p.turns)
    assert two_turns.category == "math" and two_turns.turns[0].prompt == "And 500 + 500?"
    path = _lines(
        tmp_path / "q.jsonl",
        {
            "category": "qa",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "Why?"},
            ],
        },
    )
    [prompt], problems = read_prompt_file(path, "speed-bench")
    assert problems == [] and prompt.id == "speed-bench-1" and prompt.prompt == "Why?"


def test_bad_records_of_each_format_are_named_by_file_and_line(tmp_path: Path) -> None:
    path = _lines(
        tmp_path / "q.jsonl",
        {"question_id": 1, "category": "math", "turns": ["What is 1 + 1?"]},
        {"question_id": 2, "turns": ["no category"]},
        {"question_id": 3, "category": "math", "turns": []},
        ["not", "an", "object"],
    )
    _, problems = read_prompt_file(path, "mt-bench")
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:{n}" for n in (2, 3, 4)]
    assert "category" in problems[0] and "turns" in problems[1]
    assert "question_id, category and turns" in problems[2]
    speed = _lines(
        tmp_path / "s.jsonl",
        {"category": "qa", "messages": [{"role": "assistant", "content": "hi"}]},
    )
    _, problems = read_prompt_file(speed, "speed-bench")
    assert problems == [f"{speed}:1: not a speed-bench record: messages: no message of role user"]
    with pytest.raises(SpecError, match="malformed prompt file"):
        load_prompts(path, 1, "mt-bench")


def test_a_farm_file_read_as_mt_bench_says_which_keys_it_lacks() -> None:
    _, problems = read_prompt_file(REPO / "workloads" / "arith-mix.jsonl", "mt-bench")
    assert problems and "question_id" in problems[0] and "category" in problems[0]


def test_prompts_are_taken_round_robin_across_categories() -> None:
    def p(i: int, category: str | None) -> Prompt:
        return Prompt(id=str(i), prompt="x", category=category)

    prompts = [p(0, "a"), p(1, "a"), p(2, "a"), p(3, "b"), p(4, "c"), p(5, "c")]
    assert [x.id for x in select_prompts(prompts, 4)] == ["0", "3", "4", "1"]
    assert [x.id for x in select_prompts(prompts, 6)] == ["0", "3", "4", "1", "5", "2"]
    plain = [p(i, None) for i in range(5)]
    assert [x.id for x in select_prompts(plain, 3)] == ["0", "1", "2"]
    assert len(load_prompts(MT_BENCH, 3, "mt-bench")) == 3


def test_format_goes_with_prompts_not_with_a_harness() -> None:
    with pytest.raises(ValueError, match="format goes with prompts"):
        WorkloadSpec.model_validate(
            {"name": "w", "format": "mt-bench", "harness": {"task": "gsm8k"}}
        )
    with pytest.raises(ValueError, match="format"):
        WorkloadSpec.model_validate({"name": "w", "prompts": "p.jsonl", "format": "sharegpt"})


def _request(i: int, category: str | None, drafts: int, per_pos: tuple[int, ...]) -> RequestRecord:
    return RequestRecord(
        prompt_id=f"p{i}",
        output_text="x",
        completion_tokens=10,
        finish_reason="stop",
        latency_s=0.1,
        category=category,
        counters=SpecCounters(
            drafts=drafts,
            draft_tokens=drafts * len(per_pos),
            accepted=sum(per_pos),
            accepted_per_pos=per_pos,
        ),
    )


def test_acceptance_by_category_sums_the_requests_of_each_category() -> None:
    requests = [
        _request(0, "math", 10, (9, 8)),
        _request(1, "writing", 10, (5, 2)),
        _request(2, "math", 10, (7, 6)),
        _request(3, None, 10, (0, 0)),  # no category: left out
        _request(4, "writing", 10, (3,)),  # a shorter per-position list
        _request(5, "writing", 10, (9, 9)).model_copy(update={"error": "timeout"}),
    ]
    math, writing = acceptance_by_category(requests)
    assert (math.category, math.requests, math.drafts) == ("math", 2, 20)
    assert math.mean_acceptance_length == pytest.approx(1 + 30 / 20)
    assert math.per_position == pytest.approx((16 / 20, 14 / 20))
    assert (writing.requests, writing.drafts) == (2, 20)
    assert writing.per_position == pytest.approx((8 / 20, 2 / 20))
    assert acceptance_by_category([_request(0, None, 10, (1,))]) == ()


def test_the_category_table_shows_labels_and_categories_as_text() -> None:
    from rich.console import Console

    from farm.analysis.summary import CategoryAcceptance, VariantSummary
    from farm.report.categories import render_category_table

    axes = {"engine": "e", "model": "m", "mtp_depth": 3, "thinking": "on", "workload": "mt"}
    row = VariantSummary(
        cell_id="e.m.eager.mtp3.swa-on",
        axes=axes,
        effective_graph_mode="eager",
        status="ok",
        categories=(
            CategoryAcceptance(
                category="[bold]x\x1b[2J",
                requests=2,
                drafts=4,
                mean_acceptance_length=2.5,
                per_position=(0.5, 0.5, 0.5),
            ),
            CategoryAcceptance(
                category="math",
                requests=1,
                drafts=0,
                mean_acceptance_length=None,
                per_position=(),
            ),
        ),
    )
    table = render_category_table([row])
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "e.m.eager.mtp3.swa-on[think-on.mt]" in text
    assert "[bold]x" in text and "\x1b" not in text
    assert text.count("e.m.eager") == 1  # the variant once, its categories below it
    assert render_category_table([row.model_copy(update={"categories": ()})]) is None

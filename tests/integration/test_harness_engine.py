"""The eval-harness path for real: lm-eval, AISBench and evalscope against the CPU vLLM
server through the farm.

One server cell (eager, MTP depth 2) serves a GSM8K-format task of the tiny model's
arithmetic (workloads/gsm8k-arith) to each harness, thinking on and off. Each reads the
local file, sends chat requests through the farm's recording proxy and scores them;
the farm keeps the per-request speculative counters of every one of their requests.
AISBench and evalscope run from environments of their own, built on first use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from farm.engines import job_capabilities
from farm.plan import expand_matrix
from farm.records import BuildInfo, CellResult, VariantResult
from farm.runner import CellTask, run_cell
from farm.spec import HarnessSpec, JobSpec, WorkloadSpec
from farm.workload.prompts import load_workload

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
DATASET = REPO / "workloads" / "gsm8k-arith"
LIMIT = 6


# The users' own tools on the same task file, in their own environments.
AISBENCH = WorkloadSpec(
    name="aisbench-gsm8k",
    harness=HarnessSpec(
        tool="aisbench",
        task="gsm8k_gen_0_shot_cot_chat_prompt",
        dataset_path=str(DATASET / "test.jsonl"),
        limit=LIMIT,
    ),
    max_tokens=320,
    concurrency=3,
)
# AISBench's GSM8K configs and evalscope's default template wrap the question in
# instructions the tiny model never saw (it then answers nothing useful: accuracy 0);
# evalscope takes a template of the task's own, here the bare question.
EVALSCOPE = WorkloadSpec(
    name="evalscope-gsm8k",
    harness=HarnessSpec(
        tool="evalscope",
        task="gsm8k",
        dataset_path=str(DATASET / "test.jsonl"),
        limit=LIMIT,
        dataset_args={"prompt_template": "{question}"},
    ),
    max_tokens=320,
    concurrency=3,
)


@dataclass(frozen=True)
class _Run:
    result: CellResult
    logs: Path
    cell_id: str

    def variants(self, workload: str) -> dict[str, VariantResult]:
        return {v.thinking: v for v in self.result.variants if v.workload == workload}

    def harness_dir(self, thinking: str, workload: str) -> Path:
        return self.logs / f"{self.cell_id}.think-{thinking}.{workload}.harness"


@pytest.fixture(scope="module")
def harness_run(
    local_job: JobSpec, engine_build: BuildInfo, tmp_path_factory: pytest.TempPathFactory
) -> _Run:
    """One server cell (eager, MTP depth 2) whose variants are the three harnesses on
    the same GSM8K-format file, thinking on and off."""
    lm_eval = WorkloadSpec(
        name="gsm8k-arith",
        harness=HarnessSpec(
            task="gsm8k-arith",
            include_path=str(DATASET),
            dataset_path=str(DATASET / "test.jsonl"),
            limit=LIMIT,
        ),
        max_tokens=320,
        concurrency=3,
    )
    workloads = (lm_eval, AISBENCH, EVALSCOPE)
    job = local_job.model_copy(
        update={
            "axes": local_job.axes.model_copy(
                update={
                    "graph_mode": ("eager",),
                    "mtp_depth": (2,),
                    "sliding_window": ("on",),
                    "thinking": ("on", "off"),
                }
            ),
            "workloads": workloads,
        }
    )
    (cell,) = expand_matrix(job, job_capabilities(job)).cells
    logs = tmp_path_factory.mktemp("harness") / "logs"
    task = CellTask(
        cell=cell,
        engine=job.engines[0],
        model=job.models[0],
        model_path=str(job.resolve(job.models[0].path)),
        workloads=tuple(load_workload(w, job.resolve) for w in workloads),
        build=engine_build,
        timeouts=job.timeouts,
        log_dir=str(logs),
    )
    result = run_cell(task)
    assert result.status == "ok", (result.error, result.log_tail)
    return _Run(result, logs, cell.cell_id)


def _counters_add_up(variant: VariantResult) -> None:
    """Per-request counters (response bodies seen by the proxy) add up to the
    server-wide Prometheus deltas around the harness run."""
    counters = [r.counters for r in variant.requests]
    assert all(c is not None and c.drafts > 0 for c in counters), counters
    assert sum(c.drafts for c in counters if c) == variant.counters.drafts
    assert sum(c.draft_tokens for c in counters if c) == variant.counters.draft_tokens
    assert sum(c.accepted for c in counters if c) == variant.counters.accepted
    for pos in range(2):
        assert (
            sum(c.accepted_per_pos[pos] for c in counters if c)
            == variant.counters.accepted_per_pos[pos]
        )
    assert variant.counters.mean_acceptance_length is not None
    assert variant.counters.mean_acceptance_length > 1.5


def test_lm_eval_gsm8k_format_through_the_proxy_keeps_per_request_acceptance(
    harness_run: _Run,
) -> None:
    by_thinking = harness_run.variants("gsm8k-arith")
    assert set(by_thinking) == {"on", "off"}

    for thinking, variant in by_thinking.items():
        out = harness_run.harness_dir(thinking, "gsm8k-arith")
        (results_file,) = out.glob("results/*/results_*.json")
        harness_accuracy = json.loads(results_file.read_text())["results"]["farm-gsm8k-arith"][
            "exact_match,answer-line"
        ]
        requests = variant.requests
        # Every document the harness asked about is one recorded request, scored by it.
        assert len(requests) == LIMIT
        assert {r.prompt_id for r in requests} == {f"arith-20260101-{i:04d}" for i in range(LIMIT)}
        assert all(r.error is None and r.correct is not None for r in requests)
        assert sum(bool(r.correct) for r in requests) / LIMIT == pytest.approx(harness_accuracy)
        _counters_add_up(variant)

    # The thinking axis reached the engine through the proxy: the tiny model adds
    # these 3..5-digit sums reliably only when it thinks, and its thinking is long.
    on, off = by_thinking["on"].requests, by_thinking["off"].requests
    assert sum(bool(r.correct) for r in on) >= LIMIT - 1
    assert sum(bool(r.correct) for r in off) < sum(bool(r.correct) for r in on)
    assert min(r.completion_tokens for r in on) > 3 * max(r.completion_tokens for r in off)
    assert all("</think>" in r.output_text for r in on)


def _harness_accuracy(run: _Run, thinking: str, workload: str) -> float:
    """The accuracy in the harness's own result file (a fraction)."""
    out = run.harness_dir(thinking, workload) / "results"
    if workload == AISBENCH.name:
        (path,) = out.glob("*/results/farm-proxy/*.json")
        return float(json.loads(path.read_text())["accuracy"]) / 100  # AISBench: percent
    (path,) = out.glob("reports/*/gsm8k.json")
    return float(json.loads(path.read_text())["metrics"][0]["score"])


@pytest.mark.parametrize("workload", [AISBENCH.name, EVALSCOPE.name])
def test_the_users_own_harnesses_score_through_the_proxy_and_keep_acceptance(
    harness_run: _Run, workload: str
) -> None:
    """AISBench and evalscope, each from its own environment: every document they
    asked about is one recorded request, joined to the score in their own per-sample
    output; the farm's accuracy is theirs; the thinking axis reached the engine."""
    by_thinking = harness_run.variants(workload)
    assert set(by_thinking) == {"on", "off"}
    for thinking, variant in by_thinking.items():
        requests = variant.requests
        assert len(requests) == LIMIT, [r.prompt_id for r in requests]
        assert all(r.error is None and r.correct is not None for r in requests), requests
        assert not any(r.prompt_id.startswith("unscored-") for r in requests)
        accuracy = _harness_accuracy(harness_run, thinking, workload)
        assert sum(bool(r.correct) for r in requests) / LIMIT == pytest.approx(accuracy)
        _counters_add_up(variant)
        print(
            f"{workload} think-{thinking}: accuracy {accuracy:.3f}, "
            f"AL {variant.counters.mean_acceptance_length:.2f}"
        )
    if workload == EVALSCOPE.name:
        # With the bare question the tiny model adds these sums when it thinks.
        assert _harness_accuracy(harness_run, "on", workload) >= (LIMIT - 1) / LIMIT
    # The thinking axis reached the engine through the proxy whatever the harness sent:
    # the same prompt, greedy, answers differently with the template's thinking on.
    on = {r.prompt_id: r.output_text for r in by_thinking["on"].requests}
    off = {r.prompt_id: r.output_text for r in by_thinking["off"].requests}
    assert on.keys() == off.keys()
    assert all(on[p] != off[p] for p in on), [(on[p][:40], off[p][:40]) for p in on]
    assert not any("</think>" in text for text in off.values())

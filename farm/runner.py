"""Run one server-level cell: start the engine, run each variant, stop the engine.

This is the I/O edge around an engine server: a subprocess in its own process
group on a free loopback port, HTTP to its OpenAI API and metrics, a log per cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from farm.engines import EngineAdapter, ServerLaunch, adapter_for
from farm.errors import CellError, EngineError
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, CellResult, RequestRecord, SpecCounters, VariantResult
from farm.spec import EngineSpec, ModelSpec, TimeoutSpec
from farm.workload.prompts import LoadedWorkload, scorer_for

__all__ = ["CellTask", "run_cell"]

_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class CellTask(BaseModel):
    """Everything a worker needs to run one cell, with no access to the job file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: ServerCell
    engine: EngineSpec
    model: ModelSpec
    model_path: str
    workloads: tuple[LoadedWorkload, ...]
    build: BuildInfo
    timeouts: TimeoutSpec
    log_dir: str


def run_cell(task: CellTask, npu_ids: tuple[int, ...] = (), node: str | None = None) -> CellResult:
    """Run ``task`` and return its result; never raises for an engine failure.

    A failure (engine exits, start-up timeout, server dies mid-variant) yields a
    result with status ``failed``, the error, the log tail, and every variant that
    was measured before it.
    """
    adapter = adapter_for(task.cell.family)
    started = datetime.now(UTC)
    log_path = Path(task.log_dir) / f"{task.cell.cell_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    launch = adapter.launch(
        task.cell, task.engine, task.model, task.model_path, task.build.python, port, npu_ids
    )
    variants: list[VariantResult] = []
    startup_s = generation_s = None
    effective = None
    error: str | None = None
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            launch.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.env},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        _wait_ready(proc, base + launch.health_path, task.timeouts.startup_s)
        startup_s = time.monotonic() - t0
        with httpx.Client(base_url=base, timeout=30) as client:
            models = client.get("/v1/models").json()
        effective = adapter.effective_config(
            task.cell, log_path.read_text(errors="replace"), models, _hf_config(task.model_path)
        )
        t1 = time.monotonic()
        for variant in task.cell.variants:
            workload = next(w for w in task.workloads if w.spec.name == variant.workload)
            variants.append(
                asyncio.run(_run_variant(proc, adapter, launch, base, task, variant, workload))
            )
        generation_s = time.monotonic() - t1
    except (CellError, EngineError, httpx.HTTPError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, EngineError) and _exited(proc, within_s=3.0):
            error = f"EngineError: engine exited with code {proc.returncode} ({error})"
    finally:
        _stop(proc, task.timeouts.stop_s)
    return CellResult(
        cell_id=task.cell.cell_id,
        status="failed" if error else "ok",
        started_at=started,
        finished_at=datetime.now(UTC),
        node=node,
        argv=launch.argv,
        effective=effective,
        variants=tuple(variants),
        startup_s=startup_s,
        generation_s=generation_s,
        error=error,
        log_tail=_tail(log_path) if error else None,
        log_path=str(log_path),
    )


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the worker that started it dies (Linux).

    A Ray worker killed with its node (or a driver interrupted) must not leave an
    engine server holding the machine's cores and accelerators.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _hf_config(model_path: str) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"engine exited with code {proc.returncode} during start-up")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise EngineError(f"engine not ready after {timeout_s:.0f} s ({url})")


async def _run_variant(
    proc: subprocess.Popen[bytes],
    adapter: EngineAdapter,
    launch: ServerLaunch,
    base: str,
    task: CellTask,
    variant: Variant,
    workload: LoadedWorkload,
) -> VariantResult:
    spec = workload.spec
    served = task.model.served_name or task.model.name
    score = scorer_for(spec.scorer)
    limits = httpx.Limits(max_connections=spec.concurrency)
    gate = asyncio.Semaphore(spec.concurrency)
    async with httpx.AsyncClient(
        base_url=base, timeout=task.timeouts.request_s, limits=limits
    ) as client:

        async def scrape() -> SpecCounters:
            response = await client.get(launch.metrics_path)
            response.raise_for_status()
            return adapter.read_counters(response.text)

        async def one(prompt_id: str, prompt: str, answer: str | None) -> RequestRecord:
            body = adapter.chat_request(served, prompt, variant, spec)
            async with gate:
                t0 = time.monotonic()
                try:
                    response = await client.post(launch.chat_path, json=body)
                    response.raise_for_status()
                except httpx.HTTPStatusError as exc:
                    return _failed_request(
                        prompt_id, t0, f"HTTP {exc.response.status_code}: {exc.response.text[:300]}"
                    )
                except httpx.TransportError as exc:
                    if _exited(proc, within_s=3.0):
                        raise EngineError(
                            f"engine exited with code {proc.returncode} "
                            f"during variant {variant.key}"
                        ) from exc
                    return _failed_request(prompt_id, t0, f"{type(exc).__name__}: {exc}")
                latency = time.monotonic() - t0
            done = adapter.parse_completion(response.json())
            return RequestRecord(
                prompt_id=prompt_id,
                output_text=done.text,
                completion_tokens=done.completion_tokens,
                finish_reason=done.finish_reason,
                latency_s=latency,
                correct=score(done.text, answer) if score and answer is not None else None,
                counters=done.counters,
            )

        before = await scrape()
        t0 = time.monotonic()
        records = await asyncio.gather(*(one(p.id, p.prompt, p.answer) for p in workload.prompts))
        elapsed = time.monotonic() - t0
        after = await scrape()
    print(
        f"[{task.cell.cell_id}] {variant.key}: {len(records)} requests in {elapsed:.1f} s",
        flush=True,
    )
    return VariantResult(
        thinking=variant.thinking,
        workload=variant.workload,
        counters=_delta(after, before),
        requests=tuple(records),
        elapsed_s=elapsed,
        concurrency=spec.concurrency,
    )


def _exited(proc: subprocess.Popen[bytes], within_s: float) -> bool:
    """Whether the server has exited, waiting briefly: a killed server refuses
    connections a moment before its exit status can be collected."""
    try:
        proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def _failed_request(prompt_id: str, t0: float, error: str) -> RequestRecord:
    return RequestRecord(
        prompt_id=prompt_id,
        output_text="",
        completion_tokens=0,
        finish_reason=None,
        latency_s=time.monotonic() - t0,
        error=error,
    )


def _delta(after: SpecCounters, before: SpecCounters) -> SpecCounters:
    width = max(len(after.accepted_per_pos), len(before.accepted_per_pos))

    def at(c: SpecCounters, i: int) -> int:
        return c.accepted_per_pos[i] if i < len(c.accepted_per_pos) else 0

    return SpecCounters(
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted=after.accepted - before.accepted,
        accepted_per_pos=tuple(at(after, i) - at(before, i) for i in range(width)),
    )


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after ``grace_s``."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # Engine workers live in the same group and may outlive the API process.
    _signal_group(proc, signal.SIGKILL)
    proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])

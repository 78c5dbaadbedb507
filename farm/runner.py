"""Run one server-level cell: start the engine, run each variant, stop the engine.

This is the I/O edge around an engine server: a subprocess in its own process
group on a free loopback port, HTTP to its OpenAI API and metrics, a log per cell.
A start-up that prints a known fatal error fails fast with the engine's own line
(``farm.lifecycle``); a stop waits until the devices are released, so the next
cell on the node finds them free. Harness workloads run an eval harness through a
recording proxy (``farm.workload.harness``) so that per-request acceptance is
kept as for the farm's own prompts.
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
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from farm.engines import EngineAdapter, ServerLaunch, adapter_for
from farm.errors import CellError, EngineError
from farm.lifecycle import (
    DeviceReleaseCheck,
    find_fatal_line,
    last_exception_line,
    release_checks,
    wait_released,
)
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, CellResult, RequestRecord, SpecCounters, VariantResult
from farm.spec import EngineSpec, ModelSpec, TimeoutSpec
from farm.workload.harness import (
    HarnessError,
    harness_command,
    join_requests,
    parse_outcome,
    run_harness,
)
from farm.workload.prompts import LoadedWorkload, scorer_for
from farm.workload.proxy import RecordingProxy

__all__ = ["CellTask", "run_cell"]

_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1
# After a fatal line the engine usually exits within seconds; one that is neither
# gone nor healthy by then hangs on a dead worker.
_FATAL_GRACE_S = 15.0
# How long a stopped engine's devices may take to be released (driver teardown).
_RELEASE_TIMEOUT_S = 60.0
_START_ATTEMPTS = 2  # a port taken between choosing and binding it gets one retry


class CellTask(BaseModel):
    """Everything a worker needs to run one cell, with no access to the job file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: ServerCell
    engine: EngineSpec
    model: ModelSpec
    model_path: str
    workloads: tuple[LoadedWorkload, ...]
    # The engine build on the node the cell runs on: the pool sets it at dispatch.
    build: BuildInfo | None = None
    timeouts: TimeoutSpec
    log_dir: str


def run_cell(task: CellTask, npu_ids: tuple[int, ...] = (), node: str | None = None) -> CellResult:
    """Run ``task`` and return its result; never raises for an engine failure.

    A failure (engine exits, start-up timeout, server dies mid-variant) yields a
    result with status ``failed``, the error, the log tail, and every variant that
    was measured before it.
    """
    if task.build is None:
        raise CellError(f"cell {task.cell.cell_id} was sent to run without an engine build")
    adapter = adapter_for(task.cell.family)
    started = datetime.now(UTC)
    log_path = Path(task.log_dir) / f"{task.cell.cell_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    variants: list[VariantResult] = []
    startup_s = generation_s = None
    effective = None
    error: str | None = None
    t0 = time.monotonic()
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = _free_port()
        launch = adapter.launch(
            task.cell, task.engine, task.model, task.model_path, task.build.python, port, npu_ids
        )
        proc = _start(launch, log_path)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(proc, base + launch.health_path, task.timeouts.startup_s, log_path)
            break
        except EngineError as exc:
            if attempt == _START_ATTEMPTS or "address already in use" not in str(exc).lower():
                error = f"EngineError: {exc}"
                break
            _stop(proc, task.timeouts.stop_s, ())
    try:
        if error is not None:
            raise _StartFailed
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
    except _StartFailed:
        pass
    except (CellError, EngineError, httpx.HTTPError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, EngineError) and _exited(proc, within_s=3.0):
            error = f"EngineError: engine exited with code {proc.returncode} ({error})"
    finally:
        held = _stop(proc, task.timeouts.stop_s, release_checks(proc.pid, npu_ids))
    if held:
        # The next cell would meet busy devices (and fail with out of memory).
        error = (f"{error}; " if error else "") + (
            f"devices not released {_RELEASE_TIMEOUT_S:.0f} s after stop: {'; '.join(held)}"
        )
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


class _StartFailed(Exception):
    """The engine did not start; ``error`` already says why."""


def _start(launch: ServerLaunch, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server in its own session (process group), its output appended to
    the cell's log."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            launch.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.env},
            start_new_session=True,
            preexec_fn=_die_with_parent,
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


def _wait_ready(
    proc: subprocess.Popen[bytes],
    url: str,
    timeout_s: float,
    log_path: Path,
    fatal_grace_s: float = _FATAL_GRACE_S,
) -> None:
    """Return when ``url`` answers 200; raise EngineError naming the engine's own
    error line when it exits, or prints a fatal line and neither exits nor becomes
    healthy within ``fatal_grace_s``, or is not ready after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    scan = _LogScan(log_path)
    fatal: str | None = None
    fatal_at = 0.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fatal = scan.poll()
            raise EngineError(
                f"engine exited with code {proc.returncode} during start-up"
                + _because(fatal or last_exception_line(scan.text()))
            )
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if fatal is None:
            fatal = scan.poll()
            fatal_at = time.monotonic()
        elif time.monotonic() - fatal_at > fatal_grace_s:
            raise EngineError(
                f"engine reported a fatal error at start and did not exit within "
                f"{fatal_grace_s:.0f} s: {fatal}"
            )
        time.sleep(0.5)
    raise EngineError(
        f"engine not ready after {timeout_s:.0f} s ({url})"
        + _because(last_exception_line(scan.text()))
    )


def _because(line: str | None) -> str:
    return f": {line}" if line else ""


class _LogScan:
    """Reads a growing log incrementally and remembers its first fatal line."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = ""
        self.fatal: str | None = None

    def poll(self) -> str | None:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return self.fatal
        self._offset += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        complete, _, self._partial = text.rpartition("\n")
        if self.fatal is None and complete:
            self.fatal = find_fatal_line(complete)
        return self.fatal

    def text(self) -> str:
        self.poll()
        try:
            return self._path.read_text(errors="replace")
        except OSError:
            return ""


async def _run_variant(
    proc: subprocess.Popen[bytes],
    adapter: EngineAdapter,
    launch: ServerLaunch,
    base: str,
    task: CellTask,
    variant: Variant,
    workload: LoadedWorkload,
) -> VariantResult:
    if workload.spec.harness is not None:
        return await _run_harness_variant(proc, adapter, launch, base, task, variant, workload)
    spec = workload.spec
    served = task.model.served_name or task.model.name
    score = scorer_for(spec.scorer)
    limits = httpx.Limits(max_connections=spec.concurrency)
    gate = asyncio.Semaphore(spec.concurrency)
    async with httpx.AsyncClient(
        base_url=base, timeout=task.timeouts.request_s, limits=limits
    ) as client:

        async def one(prompt_id: str, prompt: str, answer: str | None) -> RequestRecord:
            body = adapter.chat_request(served, prompt, variant, spec)
            async with gate:
                t0 = time.monotonic()
                try:
                    try:
                        response = await client.post(launch.chat_path, json=body)
                    except (httpx.ReadError, httpx.RemoteProtocolError):
                        # A pooled keep-alive connection the server closed just as it
                        # was reused (seen once in 1600 requests); greedy requests are
                        # safe to send again, and a dead engine fails the retry too.
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
            if done.counters is None and done.request_id:
                logged_ids[prompt_id] = done.request_id
            return RequestRecord(
                prompt_id=prompt_id,
                output_text=done.text,
                completion_tokens=done.completion_tokens,
                finish_reason=done.finish_reason,
                latency_s=latency,
                correct=score(done.text, answer) if score and answer is not None else None,
                counters=done.counters,
            )

        logged_ids: dict[str, str] = {}
        before = await _scrape(client, adapter, launch)
        t0 = time.monotonic()
        records = await asyncio.gather(*(one(p.id, p.prompt, p.answer) for p in workload.prompts))
        elapsed = time.monotonic() - t0
        after = await _scrape(client, adapter, launch)
    if logged_ids:
        log_path = Path(task.log_dir) / f"{task.cell.cell_id}.log"
        records = _counters_from_log(adapter, log_path, records, logged_ids)
    print(
        f"[{task.cell.cell_id}] {variant.key}: {len(records)} requests in {elapsed:.1f} s",
        flush=True,
    )
    return VariantResult(
        thinking=variant.thinking,
        workload=variant.workload,
        counters=_variant_counters(_delta(after, before), records),
        requests=tuple(records),
        elapsed_s=elapsed,
        concurrency=spec.concurrency,
    )


async def _scrape(
    client: httpx.AsyncClient, adapter: EngineAdapter, launch: ServerLaunch
) -> SpecCounters:
    """The engine's cumulative speculative counters, read from its metrics endpoint."""
    response = await client.get(launch.metrics_path)
    response.raise_for_status()
    return adapter.read_counters(response.text)


def _counters_from_log(
    adapter: EngineAdapter,
    log_path: Path,
    records: list[RequestRecord],
    logged_ids: dict[str, str],
) -> list[RequestRecord]:
    """Per-request counters that the engine wrote to its log instead of the response
    (sglang before 0.5.13), matched by response id (``logged_ids``: prompt -> id)."""
    by_id = adapter.request_counters_from_log(log_path.read_text(errors="replace"))
    return [
        r.model_copy(update={"counters": by_id[logged_ids[r.prompt_id]]})
        if r.counters is None and logged_ids.get(r.prompt_id) in by_id
        else r
        for r in records
    ]


def _variant_counters(metrics: SpecCounters, records: Sequence[RequestRecord]) -> SpecCounters:
    """The metrics delta; the sum of per-request counters when the engine exports no
    differencable counters (sglang before 0.5.14 has only gauges)."""
    if metrics.drafts or not any(r.counters for r in records):
        return metrics
    counted = [r.counters for r in records if r.counters is not None]
    width = max(len(c.accepted_per_pos) for c in counted)
    return SpecCounters(
        drafts=sum(c.drafts for c in counted),
        draft_tokens=sum(c.draft_tokens for c in counted),
        accepted=sum(c.accepted for c in counted),
        accepted_per_pos=tuple(
            sum(c.accepted_per_pos[i] for c in counted if i < len(c.accepted_per_pos))
            for i in range(width)
        ),
    )


async def _run_harness_variant(
    proc: subprocess.Popen[bytes],
    adapter: EngineAdapter,
    launch: ServerLaunch,
    base: str,
    task: CellTask,
    variant: Variant,
    workload: LoadedWorkload,
) -> VariantResult:
    """Run the workload's eval harness against the engine through a recording proxy.

    Prometheus deltas around the run are the server-wide reading; the proxy's
    per-request counters, scored by the harness's samples, are the per-request one.
    """
    spec = workload.spec
    harness = spec.harness
    assert harness is not None
    served = task.model.served_name or task.model.name
    # The variant's request fields (thinking, per-request counters) fill what the
    # harness leaves unset; the prompt is the harness's.
    fields = adapter.chat_request(served, "", variant, spec)
    out_dir = Path(task.log_dir) / f"{task.cell.cell_id}.{variant.key}.harness"
    out_dir.mkdir(parents=True, exist_ok=True)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        before = await _scrape(client, adapter, launch)
        t0 = time.monotonic()
        async with RecordingProxy(
            base, fields, adapter.parse_completion, task.timeouts.request_s
        ) as proxy:
            command = harness_command(spec, served, proxy.url, out_dir)
            try:
                await run_harness(command, harness.timeout_s, out_dir / "harness.log")
            except HarnessError:
                if _exited(proc, within_s=3.0):
                    raise EngineError(
                        f"engine exited with code {proc.returncode} during variant {variant.key}"
                    ) from None
                raise
        elapsed = time.monotonic() - t0
        after = await _scrape(client, adapter, launch)
    outcome = parse_outcome(command, harness)
    records = join_requests(proxy.exchanges, outcome.samples)
    accuracy = "n/a" if outcome.accuracy is None else f"{outcome.accuracy:.3f}"
    print(
        f"[{task.cell.cell_id}] {variant.key}: lm-eval {outcome.task} {len(records)} requests "
        f"in {elapsed:.1f} s, {outcome.metric} {accuracy}",
        flush=True,
    )
    return VariantResult(
        thinking=variant.thinking,
        workload=variant.workload,
        counters=_delta(after, before),
        requests=records,
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


def _stop(
    proc: subprocess.Popen[bytes],
    grace_s: float,
    checks: Sequence[DeviceReleaseCheck],
    release_timeout_s: float = _RELEASE_TIMEOUT_S,
) -> tuple[str, ...]:
    """SIGTERM the server's process group, SIGKILL what is left after ``grace_s``,
    then wait until ``checks`` see the devices released.

    Returns what still holds them after ``release_timeout_s`` (empty when free).
    """
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # Engine workers live in the same group and may outlive the API process.
    _signal_group(proc, signal.SIGKILL)
    proc.wait()
    return wait_released(checks, release_timeout_s)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])

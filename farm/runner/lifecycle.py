"""A cell's engine server from start to release: what the runner decides around it.

The engine process itself (start, wait ready, stop, fatal lines, device release) is
the adapter's ``EngineProcess`` (a disaggregated cell's two, ``farm.runner.pd``);
here are the runner's rules: a free loopback port
with one retry when it was taken between choosing and binding it, and a stop that
waits until the devices are released, so the next cell on the node finds them free.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from farm.engines import EngineAdapter, EngineProcess, ServerLaunch
from farm.engines.base import pd_device_groups
from farm.errors import EngineError
from farm.runner.pd import PdPair, prefill_log_path
from farm.runner.task import CellTask

__all__ = ["RELEASE_TIMEOUT_S", "StartedEngine", "start_engine", "stop_engine"]

# How long a stopped engine's devices may take to be released (driver teardown).
RELEASE_TIMEOUT_S = 60.0
_START_ATTEMPTS = 2  # a port taken between choosing and binding it gets one retry


@dataclass(frozen=True)
class StartedEngine:
    """The engine process of a cell's last start attempt, the launch it ran, and
    why it is not serving (None when it is)."""

    process: EngineProcess
    launch: ServerLaunch
    error: str | None


def start_engine(
    adapter: EngineAdapter,
    task: CellTask,
    python: str,
    npu_ids: tuple[int, ...],
    log_path: Path,
) -> StartedEngine:
    """Start the cell's engine (interpreter ``python``) on a free port and wait until
    it serves.

    A start that fails because the port was taken meanwhile is stopped and tried
    once more on a new port; any other failure is returned, not raised, with the
    process still to be stopped (``stop_engine``).
    """
    for _ in range(_START_ATTEMPTS - 1):
        started = _start_once(adapter, task, python, npu_ids, log_path)
        if started.error is None or not started.process.port_taken(started.error):
            return started
        started.process.stop(task.timeouts.stop_s)
    return _start_once(adapter, task, python, npu_ids, log_path)


def _start_once(
    adapter: EngineAdapter,
    task: CellTask,
    python: str,
    npu_ids: tuple[int, ...],
    log_path: Path,
) -> StartedEngine:
    port = _free_port()
    if task.cell.disaggregated:
        return _start_pair(adapter, task, python, npu_ids, log_path, port)
    launch = adapter.launch(
        task.cell, task.engine, task.model, task.model_path, python, port, npu_ids
    )
    process = adapter.process(launch, port, log_path, npu_ids)
    process.start()
    try:
        process.wait_ready(task.timeouts.startup_s)
    except EngineError as exc:
        return StartedEngine(process, launch, f"EngineError: {exc}")
    return StartedEngine(process, launch, None)


def _start_pair(
    adapter: EngineAdapter,
    task: CellTask,
    python: str,
    npu_ids: tuple[int, ...],
    log_path: Path,
    port: int,
) -> StartedEngine:
    """A disaggregated cell's prefill and decode servers (``farm.runner.pd``), each on
    its free port with a free KV side-channel port, the decode server's log the cell's.
    """
    ports = (port, _free_port(avoid={port}))
    kv_prefill = _free_port(avoid=set(ports))
    kv_ports = (kv_prefill, _free_port(avoid={*ports, kv_prefill}))
    prefill_launch, decode_launch = adapter.pd_launches(
        task.cell,
        task.engine,
        task.model,
        task.model_path,
        python,
        ports,
        kv_ports,
        npu_ids,
        _cell_threads(),
    )
    groups = pd_device_groups(task.model, npu_ids)
    prefill_log = prefill_log_path(log_path)
    prefill_log.write_bytes(b"")
    pair = PdPair(
        adapter,
        adapter.process(prefill_launch, ports[0], prefill_log, groups[0]),
        adapter.process(decode_launch, ports[1], log_path, groups[1]),
        task.timeouts.request_s,
    )
    pair.start()
    try:
        pair.wait_ready(task.timeouts.startup_s)
    except EngineError as exc:
        return StartedEngine(pair, decode_launch, f"EngineError: {exc}")
    return StartedEngine(pair, decode_launch, None)


def _cell_threads() -> int:
    """The CPU threads the cell's task may use: Ray sets OMP_NUM_THREADS to a task's
    CPUs; without it, the host's."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    except ValueError:
        return os.cpu_count() or 1


def stop_engine(
    process: EngineProcess, grace_s: float, release_timeout_s: float = RELEASE_TIMEOUT_S
) -> str | None:
    """Stop ``process`` and wait for its devices; what still holds them after
    ``release_timeout_s``, as the cell's error, or None when they are free."""
    process.stop(grace_s)
    held = process.wait_released(release_timeout_s)
    if not held:
        return None
    # The next cell would meet busy devices (and fail with out of memory).
    return f"devices not released {release_timeout_s:.0f} s after stop: {'; '.join(held)}"


def _free_port(avoid: set[int] | None = None) -> int:
    """A free loopback port, none of ``avoid`` (ports chosen but not bound yet)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in (avoid or set()):
            return port

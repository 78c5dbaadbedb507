"""The parts of an engine server's life the runner must get right on shared nodes.

- **Start-up failures**: engines print a fatal error (out of memory, unsupported
  configuration) and then either exit or hang waiting for a dead worker. The log is
  scanned for known fatal lines so a cell fails with the engine's own words instead
  of a start-up timeout.
- **Device release**: the next cell on a node may take the NPUs only once the last
  engine process has let go of them. A release check is a small strategy: the
  process group being gone everywhere, and where ``npu-smi`` exists, no process
  listed on the assigned NPUs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "FATAL_PATTERNS",
    "DeviceReleaseCheck",
    "NpuSmiIdle",
    "ProcessGroupGone",
    "find_fatal_line",
    "last_exception_line",
    "npu_holders",
    "release_checks",
    "wait_released",
]

# Lines that mean the engine cannot serve, as printed by each family at start-up.
# Root causes come first; the wrappers engines print around them (a worker "hit an
# exception", the engine core "failed") count only when no root cause is in the log.
# A traceback's final ``XError: ...`` line is kept apart (``last_exception_line``)
# because engines also log exceptions they catch.
FATAL_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        # torch (CUDA) and torch_npu allocator messages; vLLM and sglang both raise them.
        r"(?:CUDA|NPU) out of memory",
        r"OutOfMemoryError",
        # vLLM v1 KV cache sizing (vllm/v1/core/kv_cache_utils.py).
        r"No available memory for the cache blocks",
        r"larger than the available KV cache memory",
        # vLLM config validation (pydantic) and its unsupported-feature errors.
        r"ValidationError: \d+ validation errors? for",
        r"(?:ValueError|NotImplementedError|TypeError): .*(?:not supported|unsupported|"
        r"is not implemented|not yet supported)",
        r"Value error, .+",
        # sglang (python/sglang/srt/model_executor/model_runner.py, cuda/npu graph runner).
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        r"Capture (?:cuda|npu) graph failed",
        # Port taken between choosing it and binding it.
        r"[Aa]ddress already in use",
    )
)
_WRAPPER_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        # vLLM v1 (vllm/v1/engine/core.py, core_client.py, gpu_model_runner.py).
        r"Error in model execution",
        r"EngineCore failed to start",
        r"Engine core initialization failed",
        # sglang (managers/scheduler.py, entrypoints/http_server.py).
        r"Scheduler hit an exception",
        r"Initialization failed\. warmup error",
    )
)
# A worker's prefix, e.g. "(EngineCore_DP0 pid=123) " (vLLM) or "[2025-01-01 ...] " (sglang).
_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:\[[^\]]*\]\s*)?")
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(?:[A-Z]\w*(?:Error|Exception|Exit)): \S.*")


def _clean(line: str) -> str:
    return _PREFIX.sub("", line.rstrip(), count=1).strip()


_MAX_LINE = 500
# pydantic prints the reason on the line after "N validation error(s) for X".
_DETAIL_FOLLOWS = re.compile(r"validation errors? for \w+\s*$")


def find_fatal_line(log_text: str) -> str | None:
    """The first line of ``log_text`` that matches a known fatal pattern, cleaned of
    its worker prefix (with the reason appended when it is on the next line); None
    when there is none."""
    lines = log_text.splitlines()
    for patterns in (FATAL_PATTERNS, _WRAPPER_PATTERNS):
        for i, line in enumerate(lines):
            if any(p.search(line) for p in patterns):
                found = _clean(line)
                if _DETAIL_FOLLOWS.search(found) and i + 1 < len(lines):
                    found = f"{found}: {_clean(lines[i + 1])}"
                return found[:_MAX_LINE]
    return None


def last_exception_line(log_text: str) -> str | None:
    """The last ``SomeError: message`` line (a traceback's conclusion), or None."""
    found = None
    for line in log_text.splitlines():
        cleaned = _clean(line)
        if _EXCEPTION.match(cleaned):
            found = cleaned
    return found


class DeviceReleaseCheck(Protocol):
    """Whether what a stopped engine held is free again."""

    def holders(self) -> tuple[str, ...]:
        """What still holds the devices, one description each; empty when released."""


@dataclass(frozen=True)
class ProcessGroupGone:
    """Released when no live process is left in the engine's process group.

    The engine and its workers share one group (the runner starts it as a session
    leader); a zombie holds no device, so only live members count.
    """

    pgid: int
    proc_root: Path = Path("/proc")

    def holders(self) -> tuple[str, ...]:
        if not self.proc_root.is_dir():
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return ()
            return (f"process group {self.pgid}",)
        held = []
        for entry in self.proc_root.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            name = stat[stat.find("(") + 1 : stat.rfind(")")]
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 2 and int(fields[2]) == self.pgid and fields[0] not in ("Z", "X"):
                held.append(f"pid {entry.name} ({name}) in process group {self.pgid}")
        return tuple(sorted(held))


Runner = Callable[[Sequence[str]], str]


def _run_npu_smi(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


@dataclass(frozen=True)
class NpuSmiIdle:
    """Released when ``npu-smi info`` lists no process on any of ``npu_ids``.

    ``npu_ids`` are the logical ids the engine saw in ASCEND_RT_VISIBLE_DEVICES.
    """

    npu_ids: tuple[int, ...]
    run: Runner = _run_npu_smi

    def holders(self) -> tuple[str, ...]:
        try:
            text = self.run(["npu-smi", "info"])
        except (OSError, subprocess.SubprocessError) as exc:
            return (f"npu-smi info failed: {exc}",)
        return tuple(
            f"NPU {device} held by pid {pid} ({name or 'unnamed'})"
            for device, pid, name in npu_holders(text)
            if device in self.npu_ids
        )


_PROC_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|\s*([^|]*?)\s*\|\s*\d+\s*\|", re.M)
_CHIP_ROW = re.compile(r"^\|\s*(\d+)(?:\s+\d+)?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:", re.M)
_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+\S+\s*\|\s*\w+\s*\|", re.M)
_PROCESS_HEADER = "Process id"


def npu_holders(npu_smi_info: str) -> list[tuple[int, int, str]]:
    """``(logical device id, pid, process name)`` for each process ``npu-smi info`` lists.

    Rows of the process table read ``| NPU Chip | pid | name | memory |``. Logical
    device ids (what ASCEND_RT_VISIBLE_DEVICES counts) enumerate every chip in
    order of (NPU, chip): the NPU id on one-chip cards (910B), two per card on 910C.
    """
    head, _, table = npu_smi_info.partition(_PROCESS_HEADER)
    chips: list[tuple[int, int]] = []
    npu = None
    for line in head.splitlines():
        chip_row = _CHIP_ROW.match(line)
        if chip_row and npu is not None:
            chips.append((npu, int(chip_row[1])))
            continue
        npu_row = _NPU_ROW.match(line)
        if npu_row:
            npu = int(npu_row[1])
    order = {pair: i for i, pair in enumerate(sorted(set(chips)))}
    found = []
    for row in _PROC_ROW.finditer(table):
        pair = (int(row[1]), int(row[2]))
        device = order.get(pair, pair[0] if pair[1] == 0 else -1)
        found.append((device, int(row[3]), row[4]))
    return found


def release_checks(pgid: int, npu_ids: tuple[int, ...]) -> tuple[DeviceReleaseCheck, ...]:
    """The checks for an engine in process group ``pgid`` holding ``npu_ids``."""
    checks: list[DeviceReleaseCheck] = [ProcessGroupGone(pgid)]
    if npu_ids and shutil.which("npu-smi"):
        checks.append(NpuSmiIdle(npu_ids))
    return tuple(checks)


def wait_released(
    checks: Sequence[DeviceReleaseCheck], timeout_s: float, poll_s: float = 0.5
) -> tuple[str, ...]:
    """Poll ``checks`` until all report nothing held or ``timeout_s`` passes.

    Returns what still holds the devices at the end (empty when released).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        held = tuple(h for check in checks for h in check.holders())
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(poll_s)

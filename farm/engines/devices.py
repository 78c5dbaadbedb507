"""Device release: when a stopped engine's devices are free for the next cell.

The next cell on a node may take the NPUs only once the last engine process has let
go of them. A release check is a small strategy: the process group being gone
everywhere, and where ``npu-smi`` exists, no process listed on the assigned NPUs.
Every engine family on Ascend (vllm-ascend, sglang) is seen through the same
``npu-smi``, so the checks are shared; an engine process picks its own with
``EngineProcess.release_checks``.
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
    "DeviceReleaseCheck",
    "NpuSmiIdle",
    "ProcessGroupGone",
    "npu_holders",
    "release_checks",
    "wait_released",
]


class DeviceReleaseCheck(Protocol):
    """Whether what a stopped engine held is free again."""

    def holders(self) -> tuple[str, ...]:
        """What still holds the devices, one description each; empty when released."""


@dataclass(frozen=True)
class ProcessGroupGone:
    """Released when no live process is left in the engine's process group.

    The engine and its workers share one group (the engine process is started as a
    session leader); a zombie holds no device, so only live members count.
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

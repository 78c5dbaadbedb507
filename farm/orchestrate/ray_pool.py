"""Run cells as Ray tasks, each holding the resources it asked for.

The engine server runs inside the task with its own multiprocessing executor:
vLLM's Ray executor would drop vllm-ascend's graph mode (DESIGN.md section 4), so
Ray only places the server.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from farm.records import CellResult
from farm.runner import CellTask, run_cell
from farm.spec import ResourceSpec

__all__ = ["RayPool"]


def _run_remote(task: CellTask) -> CellResult:
    ctx = ray.get_runtime_context()
    npu_ids = tuple(int(i) for i in ctx.get_accelerator_ids().get("NPU", []))
    return run_cell(task, npu_ids=npu_ids, node=socket.gethostname() + ":" + ctx.get_node_id()[:8])


class RayPool:
    """A connection to a Ray cluster: a local one started for the farm, or ``address``."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self._address = address
        self._num_cpus = num_cpus
        self._started = False

    def __enter__(self) -> RayPool:
        if ray.is_initialized():
            return self
        if self._address:
            ray.init(address=self._address, log_to_driver=True)
        else:
            # Own temp dir: leftover state of a killed cluster in Ray's default
            # temp dir makes the next ray.init think a cluster exists (DESIGN.md 7).
            temp = Path(tempfile.gettempdir()) / f"mtpfarm-ray-{os.getuid()}"
            ray.init(
                num_cpus=self._num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                _temp_dir=str(temp),
                log_to_driver=True,
            )
        self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            ray.shutdown()

    def unplaceable(self, resources: ResourceSpec) -> str | None:
        """Why no node of the cluster can ever hold ``resources``, or None if one can."""
        need = _ray_resources(resources)
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if node.get("Alive") and all(node["Resources"].get(k, 0) >= v for k, v in need.items()):
                return None
        return f"no node of the Ray cluster has {need}"

    def run(self, tasks: list[tuple[CellTask, ResourceSpec]]) -> Iterator[CellResult]:
        """Submit every task and yield each result as soon as its cell finishes."""
        remote = ray.remote(_run_remote)
        pending: dict[Any, CellTask] = {}
        for task, resources in tasks:
            need = _ray_resources(resources)
            options: dict[str, Any] = {
                "num_cpus": need.pop("CPU"),
                "resources": need,
                "max_retries": 0,
                "name": task.cell.cell_id,
            }
            if resources.memory_gb:
                options["memory"] = int(resources.memory_gb * 2**30)
                options["resources"].pop("memory", None)
            pending[remote.options(**options).remote(task)] = task
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            task = pending.pop(done[0])
            try:
                yield ray.get(done[0])
            except RayError as exc:
                now = datetime.now(UTC)
                yield CellResult(
                    cell_id=task.cell.cell_id,
                    status="failed",
                    started_at=now,
                    finished_at=now,
                    error=f"Ray task failed: {type(exc).__name__}: {str(exc)[:2000]}",
                )


def _ray_resources(resources: ResourceSpec) -> dict[str, float]:
    need: dict[str, float] = {"CPU": resources.cpus}
    if resources.npus:
        need["NPU"] = resources.npus
    if resources.memory_gb:
        need["memory"] = resources.memory_gb * 2**30
    return need

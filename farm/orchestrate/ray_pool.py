"""Run cells as Ray tasks, each holding the resources it asked for, on the nodes it may use.

The engine server runs inside the task with its own multiprocessing executor:
vLLM's Ray executor would drop vllm-ascend's graph mode (DESIGN.md section 4), so
Ray only places the server. NPUs are logical Ray resources (``"NPU"``); Ray sets
``ASCEND_RT_VISIBLE_DEVICES`` for the ids it assigns, and the runner passes the same
ids to the engine explicitly.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from farm.records import CellResult
from farm.runner import CellTask, run_cell
from farm.spec import ResourceSpec

__all__ = ["CellRunner", "Placement", "RayPool"]

CellRunner = Callable[[CellTask, tuple[int, ...], str], CellResult]


def _run_remote(task: CellTask, runner: CellRunner) -> CellResult:
    ctx = ray.get_runtime_context()
    npu_ids = tuple(int(i) for i in ctx.get_accelerator_ids().get("NPU", []))
    node = f"{socket.gethostname()}:{ctx.get_node_id()[:8]}"
    return runner(task, npu_ids, node)


def _default_runner(task: CellTask, npu_ids: tuple[int, ...], node: str) -> CellResult:
    return run_cell(task, npu_ids=npu_ids, node=node)


class Placement:
    """Ray scheduling options of one cell: resources, node labels, retries on node loss."""

    def __init__(self, resources: ResourceSpec, pools: tuple[str, ...] = ()) -> None:
        self.need: dict[str, float] = {"CPU": resources.cpus}
        if resources.npus:
            self.need["NPU"] = resources.npus
        self.memory = int(resources.memory_gb * 2**30) if resources.memory_gb else None
        self.labels = dict(resources.label_selector)
        if pools:
            self.labels["pool"] = pools[0] if len(pools) == 1 else f"in({','.join(pools)})"
        self.retries = resources.node_retries

    def options(self, name: str) -> dict[str, Any]:
        custom = {k: v for k, v in self.need.items() if k != "CPU"}
        options: dict[str, Any] = {
            "num_cpus": self.need["CPU"],
            "resources": custom,
            # System failures only (a node or worker lost): an engine that fails
            # returns a failed result and is not retried.
            "max_retries": self.retries,
            "retry_exceptions": False,
            "name": name,
        }
        if self.memory:
            options["memory"] = self.memory
        if self.labels:
            options["label_selector"] = self.labels
        return options

    def fits(self, node: dict[str, Any]) -> bool:
        """Whether a node of ``ray.nodes()`` could ever hold this cell."""
        have = node.get("Resources", {})
        if not all(have.get(k, 0) >= v for k, v in self.need.items()):
            return False
        if self.memory and have.get("memory", 0) < self.memory:
            return False
        labels = node.get("Labels", {}) or {}
        return all(_label_matches(labels.get(k), v) for k, v in self.labels.items())


def _label_matches(value: str | None, selector: str) -> bool:
    negate = selector.startswith("!")
    body = selector[1:] if negate else selector
    if body.startswith("in(") and body.endswith(")"):
        hit = value in {v.strip() for v in body[3:-1].split(",")}
    else:
        hit = value == body
    return hit != negate


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

    def unplaceable(self, placement: Placement) -> str | None:
        """Why no live node of the cluster can ever hold ``placement``, or None."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        if any(placement.fits(n) for n in nodes):
            return None
        return f"no node of the Ray cluster ({len(nodes)} alive) has {placement.need}" + (
            f" with labels {placement.labels}" if placement.labels else ""
        )

    def run(
        self, tasks: list[tuple[CellTask, Placement]], runner: CellRunner = _default_runner
    ) -> Iterator[CellResult]:
        """Submit every task and yield each result as soon as its cell finishes.

        ``runner`` runs one cell on the worker; tests and benchmarks pass a fake one.
        """
        remote = ray.remote(_run_remote)
        pending: dict[Any, CellTask] = {}
        for task, placement in tasks:
            ref = remote.options(**placement.options(task.cell.cell_id)).remote(task, runner)
            pending[ref] = task
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

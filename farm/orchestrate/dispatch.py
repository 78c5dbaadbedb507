"""Cells handed to Ray in the driver's order, each on the node the dispatcher chose."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
import ray.util.client
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm.builds import ensure_build
from farm.builds.cache import use_build
from farm.errors import FarmError
from farm.orchestrate.node_builds import BuildOutcome, NodeBuilds
from farm.orchestrate.placement import Placement, _alive_nodes, _capacity, node_label
from farm.orchestrate.schedule import Dispatcher, Job, Order
from farm.paths import farm_home
from farm.records import BuildInfo, CellResult, CellStatus
from farm.runner import CellTask, run_cell

CellRunner = Callable[[CellTask, tuple[int, ...], str], CellResult]


# How often the driver looks for dead nodes while it waits for cells.
_NODE_CHECK_S = 5.0


# How often it looks at a build running in the driver itself.
_LOCAL_BUILD_POLL_S = 0.5


def _run_remote(task: CellTask, runner: CellRunner) -> CellResult:
    ctx = ray.get_runtime_context()
    npu_ids = tuple(int(i) for i in ctx.get_accelerator_ids().get("NPU", []))
    node = f"{socket.gethostname()}:{ctx.get_node_id()[:8]}"
    with _in_use(task.build):
        return runner(task, npu_ids, node)


def _in_use(build: BuildInfo | None) -> contextlib.AbstractContextManager[None]:
    """Hold ``build`` in use for a cell when it exists on this node (gc spares it)."""
    if build is None or not Path(build.env_dir).is_dir():
        return contextlib.nullcontext()
    return use_build(Path(build.env_dir))


def _default_runner(task: CellTask, npu_ids: tuple[int, ...], node: str) -> CellResult:
    if task.build is None or not Path(task.build.python).exists():
        # Re-run here after its node died: build on this node first (the file lock
        # makes concurrent cells of one node build it once).
        cache = Path(task.build.env_dir).parents[1] if task.build else farm_home() / "cache"
        try:
            build = ensure_build(task.engine, cache)
        except FarmError as exc:
            now = datetime.now(UTC)
            return CellResult(
                cell_id=task.cell.cell_id,
                status="build_failed",
                started_at=now,
                finished_at=now,
                node=node,
                error=f"build on {node} failed: {exc}",
            )
        task = task.model_copy(update={"build": build})
        with _in_use(build):
            return run_cell(task, npu_ids=npu_ids, node=node)
    return run_cell(task, npu_ids=npu_ids, node=node)


class _Dispatch:
    """The state of one ``RayPool.run``: which cell runs where, what is in flight."""

    def __init__(
        self,
        nodes: dict[str, dict[str, Any]],
        tasks: list[tuple[CellTask, Placement]],
        estimates: Mapping[str, float],
        order: Order,
        builds: NodeBuilds | None,
        runner: CellRunner,
        on_start: Callable[[str, str], None] | None,
    ) -> None:
        self.nodes = nodes
        self.by_id = {t.cell.cell_id: (t, p) for t, p in tasks}
        self.fits = {
            t.cell.cell_id: frozenset(i for i, n in nodes.items() if p.fits(n)) for t, p in tasks
        }
        jobs = [
            Job(
                key=task.cell.cell_id,
                need=placement.holds,
                estimate_s=estimates.get(task.cell.cell_id, 0.0),
                nodes=frozenset() if builds is not None else self.fits[task.cell.cell_id],
            )
            for task, placement in tasks
        ]
        self.dispatcher = Dispatcher({i: _capacity(n) for i, n in nodes.items()}, jobs, order)
        self.builds = builds
        self.runner = runner
        self.on_start = on_start
        self.remote = ray.remote(_run_remote)
        self.pending: dict[Any, CellTask] = {}

    def allow(self, outcome: BuildOutcome) -> None:
        """Let the cells of a build that landed run on its node."""
        engine, node, build = outcome
        if isinstance(build, str):
            return
        self.dispatcher.allow(
            (
                j.key
                for j in self.dispatcher.pending
                if self.by_id[j.key][0].engine.name == engine and node in self.fits[j.key]
            ),
            node,
        )

    def drop_unplaceable(self) -> Iterator[CellResult]:
        """A failed result for each cell that no node can hold any more."""
        builds = self.builds
        for job in self.dispatcher.never_fits():
            engine = self.by_id[job.key][0].engine.name
            if builds is not None and builds.waiting(engine):
                continue
            self.dispatcher.drop(job.key)
            if builds is not None and not builds.ready.get(engine):
                error = builds.failures(engine) or f"no node of the cluster may run {engine}"
                yield _failed(job.key, error, "build_failed")
            else:
                yield _failed(job.key, "no live node that holds its build can hold it any more")

    def drop_waiting(self) -> None:
        """Start no more cells: forget every cell not yet started."""
        for job in self.dispatcher.pending:
            self.dispatcher.drop(job.key)

    def submit_starts(self) -> None:
        """Submit each cell the dispatcher starts now, pinned to its node."""
        builds = self.builds
        for start in self.dispatcher.starts():
            task, placement = self.by_id[start.key]
            there = builds.ready.get(task.engine.name, {}).get(start.node) if builds else None
            if there is not None:
                task = task.model_copy(update={"build": there})
            options = placement.options(start.key)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(start.node, soft=True)
            self.pending[self.remote.options(**options).remote(task, self.runner)] = task
            if self.on_start:
                self.on_start(start.key, node_label(self.nodes[start.node]))

    @property
    def finished(self) -> bool:
        """Nothing runs, and nothing waits for a build that may still land."""
        builds = self.builds
        return not self.pending and not (
            self.dispatcher.pending and builds is not None and builds.busy
        )

    def wait(self) -> list[Any]:
        """Wait a little for a cell (or a build) to finish; the references done."""
        builds = self.builds
        # Cells not yet placed wait on builds: look at them as they land.
        watch = list(self.pending) + (builds.refs if builds else [])
        local = builds is not None and builds.local_busy
        timeout = _LOCAL_BUILD_POLL_S if local else _NODE_CHECK_S
        if watch:
            done, _ = ray.wait(watch, num_returns=1, timeout=timeout)
            return list(done)
        time.sleep(timeout)
        return []

    def drop_dead_nodes(self) -> bool:
        """Forget the nodes that died; whether any did."""
        alive = {n["NodeID"] for n in _alive_nodes()}
        lost = set(self.nodes) - alive
        for node in lost:
            # Cells that were there are re-run by Ray (max_retries) elsewhere.
            self.dispatcher.lose_node(node)
            self.nodes.pop(node)
        return bool(lost)

    def collect(self, done: list[Any]) -> Iterator[CellResult]:
        """The results of the cells in ``done`` and of every other cell finished by now."""
        done = [r for r in done if r in self.pending]
        if not done:
            return
        # Take every cell that has finished by now, so one dispatch pass serves them.
        rest = [r for r in self.pending if r != done[0]]
        if rest:
            done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in done:
            task = self.pending.pop(ref)
            self.dispatcher.finish(task.cell.cell_id)
            try:
                yield ray.get(ref)
            except RayError as exc:
                error = f"Ray task failed: {type(exc).__name__}: {str(exc)[:2000]}"
                yield _failed(task.cell.cell_id, error)


def _failed(cell_id: str, error: str, status: CellStatus = "failed") -> CellResult:
    now = datetime.now(UTC)
    return CellResult(cell_id=cell_id, status=status, started_at=now, finished_at=now, error=error)

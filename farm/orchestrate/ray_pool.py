"""Run cells as Ray tasks, each holding the resources it asked for, on the nodes it may use.

The engine server runs inside the task with its own multiprocessing executor:
vLLM's Ray executor would drop vllm-ascend's graph mode (DESIGN.md section 4), so
Ray only places the server. NPUs are logical Ray resources (``"NPU"``); Ray sets
``ASCEND_RT_VISIBLE_DEVICES`` for the ids it assigns, and the runner passes the same
ids to the engine explicitly.

The driver, not Ray, decides the order and the node of each cell
(``farm.schedule.Dispatcher``: longest first, best fit): it submits a cell only when
its node has room, pinned there with a soft node affinity, so Ray re-places it
elsewhere only when that node dies.
"""

from __future__ import annotations

import os
import socket
import tempfile
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
from farm.errors import BuildError, FarmError
from farm.paths import farm_home
from farm.records import BuildInfo, CellResult
from farm.runner import CellTask, run_cell
from farm.schedule import Dispatcher, Job, Order
from farm.spec import EngineSpec, ResourceSpec

__all__ = [
    "BuildRunner",
    "CellRunner",
    "Placement",
    "RayPool",
    "default_build",
    "node_label",
]

CellRunner = Callable[[CellTask, tuple[int, ...], str], CellResult]
LineSink = Callable[[str], None]
# Builds ``engine`` into the cache folder given (on the node it runs on).
BuildRunner = Callable[[EngineSpec, Path, LineSink], BuildInfo]

# How often the driver looks for dead nodes while it waits for cells.
_NODE_CHECK_S = 5.0


def node_label(node: Mapping[str, Any]) -> str:
    """``host:node-id-prefix`` of a ``ray.nodes()`` entry, as cells record it."""
    return f"{node.get('NodeManagerHostname', '?')}:{str(node['NodeID'])[:8]}"


def _run_remote(task: CellTask, runner: CellRunner) -> CellResult:
    ctx = ray.get_runtime_context()
    npu_ids = tuple(int(i) for i in ctx.get_accelerator_ids().get("NPU", []))
    node = f"{socket.gethostname()}:{ctx.get_node_id()[:8]}"
    return runner(task, npu_ids, node)


def _default_runner(task: CellTask, npu_ids: tuple[int, ...], node: str) -> CellResult:
    if not Path(task.build.python).exists():
        # Re-run here after its node died: build on this node first (the file lock
        # makes concurrent cells of one node build it once).
        cache = Path(task.build.env_dir).parents[1]
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
    return run_cell(task, npu_ids=npu_ids, node=node)


def default_build(engine: EngineSpec, cache_dir: Path, say: LineSink) -> BuildInfo:
    """The real build (``farm.builds.ensure_build``); the builder every sweep uses."""
    return ensure_build(engine, cache_dir, say)


def _build_remote(engine: EngineSpec, cache_dir: str | None, builder: BuildRunner) -> BuildInfo:
    cache = Path(cache_dir) if cache_dir else farm_home() / "cache"
    return builder(engine, cache, lambda line: None)


class Placement:
    """Ray scheduling options of one cell: resources, node labels, retries on node loss."""

    def __init__(
        self, resources: ResourceSpec, pools: tuple[str, ...] = (), npus: int | None = None
    ) -> None:
        """``npus`` (a model's own count) overrides ``resources.npus``."""
        self.need: dict[str, float] = {"CPU": resources.cpus}
        npus = npus if npus is not None else resources.npus
        if npus:
            self.need["NPU"] = npus
        self.memory = int(resources.memory_gb * 2**30) if resources.memory_gb else None
        self.labels = dict(resources.label_selector)
        if pools:
            self.labels["pool"] = pools[0] if len(pools) == 1 else f"in({','.join(pools)})"
        self.retries = resources.node_retries

    @property
    def holds(self) -> dict[str, float]:
        """Every resource the cell holds, memory (bytes) included."""
        return {**self.need, **({"memory": float(self.memory)} if self.memory else {})}

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

    def fits(self, node: Mapping[str, Any]) -> bool:
        """Whether a node of ``ray.nodes()`` could ever hold this cell."""
        have = node.get("Resources", {})
        if not all(have.get(k, 0) >= v for k, v in self.holds.items()):
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


def _driver_node() -> str | None:
    """The node the driver runs on; None through Ray Client, where the driver is elsewhere
    (Ray then reports the head's id)."""
    if ray.util.client.ray.is_connected():  # type: ignore[no-untyped-call]
        return None
    return str(ray.get_runtime_context().get_node_id())


def _alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]


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

    def nodes(self) -> list[dict[str, Any]]:
        """The live nodes of the cluster, as ``ray.nodes()`` describes them."""
        return _alive_nodes()

    def unplaceable(self, placement: Placement) -> str | None:
        """Why no live node of the cluster can ever hold ``placement``, or None."""
        nodes = _alive_nodes()
        if any(placement.fits(n) for n in nodes):
            return None
        return f"no node of the Ray cluster ({len(nodes)} alive) has {placement.need}" + (
            f" with labels {placement.labels}" if placement.labels else ""
        )

    def build_on_nodes(
        self,
        engine: EngineSpec,
        node_ids: list[str],
        shared_dir: str | None,
        local_cache: Path,
        builder: BuildRunner = default_build,
        say: LineSink | None = None,
    ) -> Iterator[tuple[str, BuildInfo | str]]:
        """Build ``engine`` on each node and yield ``(node id, build or error)``.

        With ``shared_dir`` (a path every node mounts) it is built once, on the
        first node, and that build serves them all. Otherwise each node builds into
        its own ``FARM_HOME/cache`` in a Ray task pinned to it (the file lock in
        ``ensure_build`` keeps two builds of one node apart), and the driver's own
        node builds in the driver with ``local_cache`` and its lines go to ``say``.
        """
        if not node_ids:
            return
        here = _driver_node()
        targets = node_ids[:1] if shared_dir else node_ids
        remote = ray.remote(_build_remote)
        refs: dict[Any, str] = {}
        for node in targets:
            if node == here and not shared_dir:
                continue
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            ref = remote.options(
                num_cpus=1, scheduling_strategy=strategy, name=f"build {engine.name}"
            ).remote(engine, shared_dir, builder)
            refs[ref] = node
        if here in targets and not shared_dir:
            try:
                yield here, builder(engine, local_cache, say or (lambda line: None))
            except (BuildError, FarmError) as exc:
                yield here, str(exc)
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            node = refs.pop(done[0])
            try:
                build: BuildInfo | str = ray.get(done[0])
            except RayError as exc:
                cause = getattr(exc, "cause", None)
                build = (
                    str(cause) if isinstance(cause, FarmError) else f"{type(exc).__name__}: {exc}"
                )
            if shared_dir and not isinstance(build, str):
                for other in node_ids:
                    yield other, build
            else:
                yield node, build

    def run(
        self,
        tasks: list[tuple[CellTask, Placement]],
        runner: CellRunner | None = None,
        estimates: Mapping[str, float] | None = None,
        order: Order = "lpt",
        builds: Mapping[str, Mapping[str, BuildInfo]] | None = None,
        on_start: Callable[[str, str], None] | None = None,
    ) -> Iterator[CellResult]:
        """Dispatch every task and yield each result as soon as its cell finishes.

        ``estimates`` (seconds by cell id) order the cells longest first; with
        ``order="given"`` they start in list order. ``builds`` maps engine name to
        the nodes that hold its build (and the build there): a cell runs only on
        those. ``on_start(cell_id, node label)`` is called as each cell is sent to
        its node. ``runner`` runs one cell on the worker (default: the real engine
        runner); tests pass a fake one.
        """
        nodes = {n["NodeID"]: n for n in _alive_nodes()}
        by_id = {t.cell.cell_id: (t, p) for t, p in tasks}
        jobs = []
        for task, placement in tasks:
            eligible = {i for i, n in nodes.items() if placement.fits(n)}
            if builds is not None:
                eligible &= set(builds.get(task.engine.name, {}))
            jobs.append(
                Job(
                    key=task.cell.cell_id,
                    need=placement.holds,
                    estimate_s=(estimates or {}).get(task.cell.cell_id, 0.0),
                    nodes=frozenset(eligible),
                )
            )
        dispatcher = Dispatcher({i: _capacity(n) for i, n in nodes.items()}, jobs, order)
        remote = ray.remote(_run_remote)
        pending: dict[Any, CellTask] = {}
        checked = time.monotonic()
        lost = True  # check once at the start: a cell may fit no node at all
        while True:
            for job in dispatcher.never_fits() if lost else ():
                dispatcher.drop(job.key)
                yield _failed(job.key, "no live node that holds its build can hold it any more")
            lost = False
            for start in dispatcher.starts():
                task, placement = by_id[start.key]
                build = (builds or {}).get(task.engine.name, {}).get(start.node)
                if build is not None:
                    task = task.model_copy(update={"build": build})
                options = placement.options(start.key)
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    start.node, soft=True
                )
                pending[remote.options(**options).remote(task, runner or _default_runner)] = task
                if on_start:
                    on_start(start.key, node_label(nodes[start.node]))
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1, timeout=_NODE_CHECK_S)
            if time.monotonic() - checked >= _NODE_CHECK_S:
                checked = time.monotonic()
                alive = {n["NodeID"] for n in _alive_nodes()}
                for node in set(nodes) - alive:
                    # Cells that were there are re-run by Ray (max_retries) elsewhere.
                    dispatcher.lose_node(node)
                    nodes.pop(node)
                    lost = True
            if not done:
                continue
            # Take every cell that has finished by now, so one dispatch pass serves them.
            rest = [r for r in pending if r != done[0]]
            if rest:
                done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in done:
                task = pending.pop(ref)
                dispatcher.finish(task.cell.cell_id)
                try:
                    yield ray.get(ref)
                except RayError as exc:
                    error = f"Ray task failed: {type(exc).__name__}: {str(exc)[:2000]}"
                    yield _failed(task.cell.cell_id, error)


def _capacity(node: Mapping[str, Any]) -> dict[str, float]:
    have = node.get("Resources", {})
    return {k: float(have[k]) for k in ("CPU", "NPU", "memory") if k in have}


def _failed(cell_id: str, error: str) -> CellResult:
    now = datetime.now(UTC)
    return CellResult(
        cell_id=cell_id, status="failed", started_at=now, finished_at=now, error=error
    )

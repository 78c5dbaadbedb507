"""Run cells as Ray tasks, each holding the resources it asked for, on the nodes it may use.

The engine server runs inside the task with its own multiprocessing executor:
vLLM's Ray executor inside vllm-ascend silently drops graph mode to NO_COMPILATION,
so Ray only places the server. NPUs are logical Ray resources (``"NPU"``); Ray sets
``ASCEND_RT_VISIBLE_DEVICES`` for the ids it assigns, and the runner passes the same
ids to the engine explicitly.

The driver, not Ray, decides the order and the node of each cell
(``farm.orchestrate.schedule.Dispatcher``: longest first, best fit): it submits a cell only when
its node has room, pinned there with a soft node affinity, so Ray re-places it
elsewhere only when that node dies.

Without a cluster address, the farm runs on this host's own cluster, one per
FARM_HOME: the first run starts it (its own temp dir, every CPU), later runs join
it and say so, and the run that started it stops it once the runs that joined have
left (files under ``FARM_HOME/ray``; :class:`_HostCluster`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import ray.util.client

from farm.orchestrate.dispatch import _NODE_CHECK_S, CellRunner, _default_runner, _Dispatch
from farm.orchestrate.host_cluster import _HostCluster, _sigterm_kept
from farm.orchestrate.node_builds import (
    BuildOutcome,
    BuildRunner,
    NodeBuilds,
    _ignore,
    default_build,
)
from farm.orchestrate.placement import Placement, _alive_nodes
from farm.orchestrate.schedule import Order
from farm.orchestrate.worker_lines import settle_worker_lines
from farm.paths import farm_home
from farm.records import CellResult
from farm.runner import CellTask
from farm.spec import EngineSpec


class RayPool:
    """A connection to a Ray cluster: ``address``, or this host's cluster for the farm
    (started, or joined when another run on this host started it; see the module)."""

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        home: Path | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """``home`` (default FARM_HOME) keeps the host's cluster files; ``say`` hears
        when this run joins or waits for another run's cluster."""
        self._address = address
        self._num_cpus = num_cpus
        self._home = home
        self._say = say or _ignore
        self._started = False
        self._host: _HostCluster | None = None

    def __enter__(self) -> RayPool:
        global _in_process
        with _IN_PROCESS_LOCK:
            if ray.is_initialized():
                # Ray of this process: another pool's host cluster (share it), or one
                # the caller set up (a test's cluster; left to the caller).
                if _in_process is not None:
                    _in_process.users += 1
                    self._host = _in_process
                return self
            # Worker lines plain text where the output is no terminal (a cron log).
            settle_worker_lines()
            if self._address:
                with _sigterm_kept():
                    ray.init(address=self._address, log_to_driver=True)
                self._started = True
                return self
            host = _HostCluster(self._home or farm_home(), self._say)
            host.enter(self._num_cpus or os.cpu_count() or 1)
            _in_process = self._host = host
        return self

    def __exit__(self, *exc: object) -> None:
        global _in_process
        host = self._host
        if host is None:
            if self._started:
                ray.shutdown()
            return
        with _IN_PROCESS_LOCK:
            host.users -= 1
            if host.users:
                return
            _in_process = None
            host.leave()

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

    def start_builds(
        self,
        targets: Mapping[str, tuple[EngineSpec, Sequence[str]]],
        shared_dir: str | None,
        local_cache: Path,
        builder: BuildRunner = default_build,
        say: Callable[[str, str], None] | None = None,
    ) -> NodeBuilds:
        """Start building each engine on the nodes ``targets`` names for it; see NodeBuilds."""
        return NodeBuilds(targets, shared_dir, local_cache, builder, say).start()

    def run(
        self,
        tasks: list[tuple[CellTask, Placement]],
        runner: CellRunner | None = None,
        estimates: Mapping[str, float] | None = None,
        order: Order = "lpt",
        builds: NodeBuilds | None = None,
        on_start: Callable[[str, str], None] | None = None,
        on_build: Callable[[BuildOutcome], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[CellResult]:
        """Dispatch every task and yield each result as soon as its cell finishes.

        ``estimates`` (seconds by cell id) order the cells longest first; with
        ``order="given"`` they start in list order. With ``builds``, a cell runs
        only on a node where its engine's build has landed, with that node's build,
        and starts as soon as one has: each outcome is passed to ``on_build`` first.
        A cell whose engine failed to build on every node it may use comes back
        ``build_failed``. ``on_start(cell_id, node label)`` is called as each cell
        is sent to its node. ``runner`` runs one cell on the worker (default: the
        real engine runner); tests pass a fake one. Once ``stop()`` is true no further
        cell starts: the cells running finish and are yielded, the others are not.
        """
        nodes = {n["NodeID"]: n for n in _alive_nodes()}
        dispatch = _Dispatch(
            nodes, tasks, estimates or {}, order, builds, runner or _default_runner, on_start
        )
        checked = time.monotonic()
        recheck = True  # once at the start: a cell may fit no node at all
        while True:
            for outcome in builds.take() if builds else ():
                recheck = True
                if on_build:
                    on_build(outcome)
                dispatch.allow(outcome)
            if recheck:
                yield from dispatch.drop_unplaceable()
            recheck = False
            if stop is not None and stop():
                dispatch.drop_waiting()
            dispatch.submit_starts()
            if dispatch.finished:
                # Builds that landed while the last cells ran are recorded too; the
                # ones still running are not waited for.
                for outcome in builds.take() if builds else ():
                    if on_build:
                        on_build(outcome)
                return
            done = dispatch.wait()
            if time.monotonic() - checked >= _NODE_CHECK_S:
                checked = time.monotonic()
                recheck = dispatch.drop_dead_nodes()
            yield from dispatch.collect(done)


__all__ = ["RayPool"]

_IN_PROCESS_LOCK = threading.RLock()


_in_process: _HostCluster | None = None

"""Engine builds made on the nodes that will run their cells, before the cells start."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import ray.util.client
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm.builds import ensure_build
from farm.errors import BuildError, FarmError
from farm.orchestrate.placement import _alive_nodes, _driver_node, node_label
from farm.paths import farm_home
from farm.records import BuildInfo
from farm.spec import EngineSpec

LineSink = Callable[[str], None]


# Builds ``engine`` into the cache folder given (on the node it runs on).
BuildRunner = Callable[[EngineSpec, Path, LineSink], BuildInfo]


# (engine name, node id, the build there or why it failed)
BuildOutcome = tuple[str, str, BuildInfo | str]


def default_build(engine: EngineSpec, cache_dir: Path, say: LineSink) -> BuildInfo:
    """The real build (``farm.builds.ensure_build``); the builder every sweep uses."""
    return ensure_build(engine, cache_dir, say)


def _build_remote(engine: EngineSpec, cache_dir: str | None, builder: BuildRunner) -> BuildInfo:
    cache = Path(cache_dir) if cache_dir else farm_home() / "cache"
    return builder(engine, cache, lambda line: None)


class NodeBuilds:
    """The sweep's engine builds, in flight on the nodes that need them.

    Every (engine, node) pair of ``targets`` gives exactly one outcome, taken with
    ``take`` as it lands, so cells can start on a node as soon as their build is
    ready there. With ``shared_dir`` (a path every node mounts) an engine is built
    once, on its first node, and that outcome stands for all its nodes. Otherwise
    each node builds into its own ``FARM_HOME/cache`` in a Ray task pinned to it
    (the file lock in ``ensure_build`` keeps two builds of one node apart); the
    driver's own node builds in a driver thread into ``local_cache``, its output
    lines going to ``say(engine, line)``.
    """

    def __init__(
        self,
        targets: Mapping[str, tuple[EngineSpec, Sequence[str]]],
        shared_dir: str | None,
        local_cache: Path,
        builder: BuildRunner,
        say: Callable[[str, str], None] | None = None,
    ) -> None:
        """Record what to build where; ``start`` starts the builds."""
        self._targets = dict(targets)
        self._shared_dir = shared_dir
        self._local_cache = local_cache
        self._builder = builder
        self._say = say
        self.nodes: dict[str, dict[str, Any]] = {}
        # Outcomes taken so far: engine -> node id -> the build there / why it failed.
        self.ready: dict[str, dict[str, BuildInfo]] = {}
        self.failed: dict[str, dict[str, str]] = {}
        self._refs: dict[Any, tuple[str, tuple[str, ...]]] = {}
        self._landed: queue.SimpleQueue[BuildOutcome] = queue.SimpleQueue()
        self._waiting = {name: len(nodes) for name, (_, nodes) in targets.items()}
        self._local: threading.Thread | None = None

    def start(self) -> NodeBuilds:
        """Submit the builds on other nodes as Ray tasks and start the driver node's
        own in a thread; returns ``self``."""
        here = _driver_node()
        self.nodes = {n["NodeID"]: n for n in _alive_nodes()}
        shared = self._shared_dir
        remote = ray.remote(_build_remote)
        local: list[EngineSpec] = []
        for name, (engine, nodes) in self._targets.items():
            if not nodes:
                continue
            groups = [(nodes[0], tuple(nodes))] if shared else [(n, (n,)) for n in nodes]
            for node, stands_for in groups:
                if node == here and not shared:
                    local.append(engine)
                    continue
                strategy = NodeAffinitySchedulingStrategy(node, soft=False)
                ref = remote.options(
                    num_cpus=1, scheduling_strategy=strategy, name=f"build {name}"
                ).remote(engine, shared, self._builder)
                self._refs[ref] = (name, stands_for)
        if local and here is not None:
            self._local = threading.Thread(
                target=self._build_here,
                args=(local, here, self._local_cache, self._builder, self._say),
                name="farm-driver-build",
                daemon=True,
            )
            self._local.start()
        return self

    def _build_here(
        self,
        engines: list[EngineSpec],
        node: str,
        cache: Path,
        builder: BuildRunner,
        say: Callable[[str, str], None] | None,
    ) -> None:
        for engine in engines:
            lines = functools.partial(say, engine.name) if say else _ignore
            try:
                build: BuildInfo | str = builder(engine, cache, lines)
            except (BuildError, FarmError) as exc:
                build = str(exc)
            except Exception as exc:  # an outcome must land whatever happens
                build = f"{type(exc).__name__}: {exc}"
            self._landed.put((engine.name, node, build))

    @property
    def refs(self) -> list[Any]:
        """Ray references of the builds still running on other nodes."""
        return list(self._refs)

    @property
    def local_busy(self) -> bool:
        return self._local is not None and self._local.is_alive()

    def waiting(self, engine: str) -> bool:
        """Whether some node's build of ``engine`` has not landed yet."""
        return self._waiting.get(engine, 0) > 0

    @property
    def busy(self) -> bool:
        return any(n > 0 for n in self._waiting.values())

    def take(self) -> list[BuildOutcome]:
        """The outcomes that have landed since the last call (without waiting)."""
        out: list[BuildOutcome] = []
        if self._refs:
            ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
            for ref in ready:
                name, nodes = self._refs.pop(ref)
                try:
                    build: BuildInfo | str = ray.get(ref)
                except RayError as exc:
                    cause = getattr(exc, "cause", None)
                    build = (
                        str(cause)
                        if isinstance(cause, FarmError)
                        else f"{type(exc).__name__}: {exc}"
                    )
                out.extend((name, node, build) for node in nodes)
        while True:
            try:
                out.append(self._landed.get_nowait())
            except queue.Empty:
                break
        for name, node, build in out:
            self._waiting[name] -= 1
            if isinstance(build, str):
                self.failed.setdefault(name, {})[node] = build
            else:
                self.ready.setdefault(name, {})[node] = build
        return out

    def label(self, node: str) -> str:
        """``host:node-id-prefix`` of a node, as cells record it."""
        return node_label(self.nodes.get(node, {"NodeID": node}))

    def failures(self, engine: str) -> str:
        """Each node's reason ``engine`` failed to build there, one line per node."""
        failed = self.failed.get(engine, {})
        return "\n".join(f"on {self.label(node)}: {error}" for node, error in failed.items())


def _ignore(line: str) -> None:
    pass

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

Without a cluster address, the farm runs on this host's own cluster, one per
FARM_HOME: the first run starts it (its own temp dir, every CPU), later runs join
it and say so, and the run that started it stops it once the runs that joined have
left (files under ``FARM_HOME/ray``; :class:`_HostCluster`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
import ray.util.client
from filelock import FileLock, Timeout
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm.builds import ensure_build
from farm.builds.cache import use_build
from farm.errors import BuildError, FarmError
from farm.paths import farm_home, ray_temp_dir
from farm.records import BuildInfo, CellResult, CellStatus
from farm.runner import CellTask, run_cell
from farm.schedule import Dispatcher, Job, Order
from farm.spec import EngineSpec, ResourceSpec

__all__ = [
    "BuildOutcome",
    "BuildRunner",
    "CellRunner",
    "NodeBuilds",
    "Placement",
    "RayPool",
    "default_build",
    "node_label",
]

CellRunner = Callable[[CellTask, tuple[int, ...], str], CellResult]
LineSink = Callable[[str], None]
# Builds ``engine`` into the cache folder given (on the node it runs on).
BuildRunner = Callable[[EngineSpec, Path, LineSink], BuildInfo]

# (engine name, node id, the build there or why it failed)
BuildOutcome = tuple[str, str, BuildInfo | str]

# How often the driver looks for dead nodes while it waits for cells.
_NODE_CHECK_S = 5.0
# How often it looks at a build running in the driver itself.
_LOCAL_BUILD_POLL_S = 0.5
# How often the run that started the host's cluster looks whether the runs that
# joined it have left.
_JOINED_POLL_S = 1.0


def node_label(node: Mapping[str, Any]) -> str:
    """``host:node-id-prefix`` of a ``ray.nodes()`` entry, as cells record it."""
    return f"{node.get('NodeManagerHostname', '?')}:{str(node['NodeID'])[:8]}"


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
    ) -> Iterator[CellResult]:
        """Dispatch every task and yield each result as soon as its cell finishes.

        ``estimates`` (seconds by cell id) order the cells longest first; with
        ``order="given"`` they start in list order. With ``builds``, a cell runs
        only on a node where its engine's build has landed, with that node's build,
        and starts as soon as one has: each outcome is passed to ``on_build`` first.
        A cell whose engine failed to build on every node it may use comes back
        ``build_failed``. ``on_start(cell_id, node label)`` is called as each cell
        is sent to its node. ``runner`` runs one cell on the worker (default: the
        real engine runner); tests pass a fake one.
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
            dispatch.submit_starts()
            if dispatch.finished:
                return
            done = dispatch.wait()
            if time.monotonic() - checked >= _NODE_CHECK_S:
                checked = time.monotonic()
                recheck = dispatch.drop_dead_nodes()
            yield from dispatch.collect(done)


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


_IN_PROCESS_LOCK = threading.RLock()
_in_process: _HostCluster | None = None


class _HostCluster:
    """This host's Ray cluster for one FARM_HOME, shared by the farm runs on the host.

    Two `farm run` on one host must not each start a cluster claiming every CPU and
    NPU (issue 14, finding 8). Files in ``FARM_HOME/ray``: ``host.lock`` (held while a
    run starts, joins or stops the cluster), ``cluster.json`` (its address), and
    ``owner.lock`` / ``users/*.lock``, each held for as long as the run that started
    it / joined it uses it, so a killed run holds nothing. The run that started the
    cluster (it dies with that process: Ray shares the driver's fate) waits at its
    end until the runs that joined have left, then stops it.
    """

    def __init__(self, home: Path, say: Callable[[str], None]) -> None:
        self._home = home
        self._dir = home / "ray"
        self._say = say
        self.users = 1  # pools of this process using it
        self._owner = False
        self._fds: list[int] = []  # locks held while this process uses the cluster

    def enter(self, num_cpus: int) -> None:
        """Join the cluster another run started, or start it; say which."""
        (self._dir / "users").mkdir(parents=True, exist_ok=True)
        with self._host_lock("start or join"):
            record = self._record()
            if record is not None:
                self._join(record)
            else:
                self._start(num_cpus)

    def _start(self, num_cpus: int) -> None:
        self._hold(self._dir / "owner.lock")
        # Own temp dir (per FARM_HOME, short for Ray's socket paths), cleared of a
        # killed cluster's address file: that makes ray.init join it (DESIGN.md 7).
        temp = ray_temp_dir(self._home)
        (temp / "ray_current_cluster").unlink(missing_ok=True)
        try:
            with _sigterm_kept():
                context = ray.init(
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    _temp_dir=str(temp),
                    log_to_driver=True,
                )
        except BaseException:
            self._release()
            raise
        self._owner = True
        record = {
            "address": context.address_info["gcs_address"],  # type: ignore[attr-defined]
            "pid": os.getpid(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": num_cpus,
            # ray.init turns token authentication on for a cluster it starts, unless
            # RAY_AUTH_MODE says otherwise; a run that joins must then use the token.
            "token_auth": os.environ.get("RAY_AUTH_MODE", "").lower() == "token",
        }
        cluster = self._dir / "cluster.json"
        partial = cluster.with_name(cluster.name + ".partial")
        partial.write_text(json.dumps(record) + "\n")
        partial.replace(cluster)

    def _join(self, record: dict[str, Any]) -> None:
        self._hold(self._dir / "users" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.lock")
        address = str(record.get("address"))
        started = f"pid {record.get('pid')} at {record.get('started_at')}"
        if record.get("token_auth"):
            _use_local_token()
        try:
            with _sigterm_kept():
                ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, RayError) as exc:
            self._release()
            raise FarmError(
                f"cannot join this host's Ray cluster at {address} (started by {started}, "
                f"{self._dir / 'cluster.json'}): {exc}; wait for that run to end, or stop it"
            ) from None
        self._say(
            f"joined this host's Ray cluster at {address}, started by another farm run "
            f"({started}): the two runs share its {record.get('cpus')} CPUs and its NPUs"
        )

    def leave(self) -> None:
        """Disconnect; the run that started the cluster stops it once nobody else uses it."""
        if not self._owner:
            ray.shutdown()
            self._release()
            return
        said = False
        try:
            while True:
                with self._host_lock("stop"):
                    joined = self._joined()
                    if not joined:
                        self._stop()
                        return
                if not said:
                    self._say(
                        f"waiting for {len(joined)} farm run(s) that joined this host's Ray "
                        f"cluster (pid {', '.join(joined)}) to finish before stopping it; "
                        "Ctrl-C or SIGTERM stops it now (their running cells are lost)"
                    )
                    said = True
                time.sleep(_JOINED_POLL_S)
        except KeyboardInterrupt:
            with self._host_lock("stop"):
                self._stop()
            raise

    def _stop(self) -> None:
        ray.shutdown()
        (self._dir / "cluster.json").unlink(missing_ok=True)
        self._release()

    def _record(self) -> dict[str, Any] | None:
        """The cluster another run started and still holds, or None."""
        try:
            record = json.loads((self._dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or _lock_is_free(self._dir / "owner.lock"):
            return None  # its run is gone, and the cluster with it
        return record

    def _joined(self) -> list[str]:
        """Pids of the runs that use the cluster now; removes the files of runs gone."""
        live = []
        for path in sorted((self._dir / "users").glob("*.lock")):
            if _lock_is_free(path):
                path.unlink(missing_ok=True)
            else:
                live.append(path.stem.split("-")[0])
        return live

    @contextlib.contextmanager
    def _host_lock(self, what: str) -> Iterator[None]:
        lock = FileLock(str(self._dir / "host.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            self._say(
                f"waiting for another farm run on this host to {what} its Ray cluster "
                f"({self._dir / 'host.lock'})"
            )
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def _hold(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fds.append(fd)

    def _release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _lock_is_free(path: Path) -> bool:
    """Whether nobody holds the lock file at ``path`` (a process holds it while alive)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Keep the process's SIGTERM handler across ``ray.init``, which installs its own
    (``sys.exit``): a sweep stopped by SIGTERM must stop as on Ctrl-C (farm.sweep), so
    its commands can tell an interruption from a failure."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _use_local_token() -> None:
    """Use this host's Ray token (``~/.ray/auth_token``), as the run that started the
    cluster did: Ray turns token authentication on by itself only for a cluster it
    starts, and a joining driver without it is refused (InvalidAuthToken)."""
    # Ray's own switch (private; Ray is pinned): it respects an explicit RAY_AUTH_MODE.
    from ray._private.authentication import authentication_token_setup

    authentication_token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _capacity(node: Mapping[str, Any]) -> dict[str, float]:
    have = node.get("Resources", {})
    return {k: float(have[k]) for k in ("CPU", "NPU", "memory") if k in have}


def _failed(cell_id: str, error: str, status: CellStatus = "failed") -> CellResult:
    now = datetime.now(UTC)
    return CellResult(cell_id=cell_id, status=status, started_at=now, finished_at=now, error=error)

"""Drive one sweep: plan -> builds -> cells on Ray -> store, result by result.

Each result is written the moment its cell finishes, so a sweep stopped at any
point keeps everything it measured. A result the store refuses (or does not answer
for within the store timeouts) is spooled to a JSON file instead of being lost; one
that cannot be spooled either (a full disk) is kept in memory, tried again at the
end and, if still homeless, reported with what to do.

The driver holds a lease on its sweep: a heartbeat in the store every
``FARM_SWEEP_HEARTBEAT_S``. ``--resume`` of a sweep whose heartbeat is fresh is
refused (another driver runs it); one whose heartbeat is stale is taken over.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pydantic import Field
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from farm import store
from farm.builds.cache import use_build
from farm.comparable import ComparableKey
from farm.engines import job_capabilities
from farm.errors import FarmError, StoreError
from farm.frozen import Frozen
from farm.masking import mask_url
from farm.orchestrate.dispatch import CellRunner
from farm.orchestrate.lease import Lease
from farm.orchestrate.node_builds import BuildOutcome, BuildRunner, NodeBuilds, default_build
from farm.orchestrate.placement import Placement
from farm.orchestrate.ray_pool import RayPool
from farm.orchestrate.schedule import estimate_cells
from farm.paths import farm_home
from farm.plan import Plan, ServerCell, cell_model, expand_matrix, parse_only, select
from farm.records import BuildInfo, CellResult, CellStatus, SweepRecord, SweepStatus
from farm.runner import CellTask, ReferenceRun, sequential_looks
from farm.settings import get_settings
from farm.spec import EngineSpec, JobSpec
from farm.store.spool import flush_spool, spool_dir, spool_result, spooled
from farm.workload.prompts import LoadedWorkload, load_workload

__all__ = [
    "SweepEvents",
    "SweepOptions",
    "SweepOutcome",
    "cell_task",
    "farm_home",
    "plan_job",
    "run_sweep",
]

_log = logging.getLogger(__name__)
# A lease is stale (its driver gone) after this many missed heartbeats.
_STALE_BEATS = 3
# Sweeps (store, id) that a driver of this process runs now: a lease of this process
# on any other sweep belongs to a driver that ended (it may have failed to say so).
_RUNNING_HERE: set[tuple[str, int]] = set()


class SweepOptions(Frozen):
    db_url: str
    ray_address: str | None = None
    only: dict[str, str] = Field(default_factory=dict)
    home: Path
    resume: int | None = None
    runner: CellRunner | None = None  # None: the real engine runner
    builder: BuildRunner | None = None  # None: the real build (farm.builds.ensure_build)
    # The stored runs a sweep's variants are paired with in sequential looks, by
    # comparable key, given the sweep's id (a nightly's last good night); None: none.
    references: Callable[[int], Mapping[ComparableKey, ReferenceRun]] | None = None
    # Start the cells in this order (cell ids; the others after them, longest first)
    # instead of longest first: a fail-fast PR's likeliest regressions first.
    first: tuple[str, ...] = ()
    # Told of each result landed; a reason it returns stops the sweep from starting
    # more cells (those running finish): a fail-fast PR's first confirmed regression.
    stop_after: Callable[[ServerCell, CellResult], str | None] | None = None


class SweepOutcome(Frozen):
    sweep_id: int
    ok: tuple[str, ...]
    failed: tuple[str, ...]
    spooled: tuple[str, ...] = ()  # files still on disk: the store refused them to the end
    flushed: tuple[str, ...] = ()  # spooled earlier, stored now
    unsaved: tuple[str, ...] = ()  # cell ids neither stored nor spooled: --resume reruns them
    stopped: str | None = None  # why ``stop_after`` stopped it; its other cells never ran


class SweepEvents:
    """Callbacks through which a front end (the CLI) shows progress. No-ops here."""

    def planned(self, plan: Plan, sweep_id: int) -> None: ...
    def build_line(self, engine: str, line: str) -> None: ...
    def build_done(self, engine: str, build: BuildInfo | None, error: str | None) -> None: ...
    def build_placed(self, engine: str, node: str, error: str | None) -> None: ...
    def cells_started(self, count: int) -> None: ...
    def cell_started(self, cell: ServerCell, node: str) -> None: ...
    def spooled(self, cell_id: str, where: str) -> None: ...
    def cell_done(self, cell: ServerCell, result: CellResult) -> None: ...

    def notice(self, text: str) -> None:
        """Something the user must hear that is not a cell or a build: a lease taken
        over, the host's Ray cluster joined or waited for, results kept only in memory.
        Logged as a warning unless a front end shows it."""
        _log.warning("%s", text)


def plan_job(job: JobSpec, only: Mapping[str, str] | None = None) -> Plan:
    """The job's plan, restricted to the ``only`` slice."""
    plan = expand_matrix(job, job_capabilities(job))
    return select(plan, parse_only(job, only)) if only else plan


def run_sweep(
    job: JobSpec, job_text: str, options: SweepOptions, events: SweepEvents | None = None
) -> SweepOutcome:
    """Run every cell of ``job`` and store the results; see the module docstring.

    The sweep ends ``ok`` or ``failed`` (some cell failed) when every cell ran, and
    ``interrupted`` when anything stopped it first (Ctrl-C, SIGTERM, an error), so
    ``--resume`` finishes it.
    """
    events = events or SweepEvents()
    plan = plan_job(job, options.only)
    # Read every input before anything is written: a bad prompt file writes nothing.
    workloads = tuple(load_workload(w, job.resolve) for w in job.workloads)
    sweep = _Sweep(store.open_store(options.db_url), options, events)
    plan = sweep.open(plan, job_text)
    stopped_by: list[str] = []
    try:
        with _sigterm_as_interrupt(stopped_by):
            sweep.start_heartbeat()
            if plan.cells:
                sweep.run_cells(job, plan, workloads)
    except KeyboardInterrupt:
        sweep.finish("interrupted")
        # Ray may re-raise the interrupt bare: say which signal it was.
        raise KeyboardInterrupt(f"signal {(stopped_by or ['SIGINT'])[0]}") from None
    except BaseException:
        sweep.finish("interrupted")
        raise
    # Stopped on purpose with cells never run: `farm run --resume` can run them.
    sweep.finish("interrupted" if sweep.stopped else "failed" if sweep.failed else "ok")
    return sweep.outcome()


@contextmanager
def _sigterm_as_interrupt(stopped_by: list[str]) -> Iterator[None]:
    """SIGTERM (what schedulers and Kubernetes send) stops the sweep as Ctrl-C does,
    so it is stored as interrupted and its engines are stopped, not orphaned; the
    signal's name is appended to ``stopped_by``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        stopped_by.append(signal.Signals(signum).name)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Sweep:
    """One sweep's store side: its row and lease, the results it lands, its end."""

    def __init__(self, db: Engine, options: SweepOptions, events: SweepEvents) -> None:
        self.db = db
        self.options = options
        self.events = events
        self.sweep_id = 0
        self.driver = f"{platform.node()}:{os.getpid()}"
        self.ok: list[str] = []
        self.failed: list[str] = []
        self.stopped: str | None = None
        self.spooled: list[str] = []
        self.flushed: list[str] = []
        # Results neither stored nor spooled, with why: tried again at the end.
        self.unsaved: dict[str, tuple[CellResult, str]] = {}
        self.heartbeat_s = get_settings().store.heartbeat_s
        self.lease: Lease | None = None
        self._lease_fd: int | None = None
        # Shared locks on the builds this sweep uses here, so `farm builds gc` spares them.
        self.builds_in_use = ExitStack()

    def open(self, plan: Plan, job_text: str) -> Plan:
        """Create the sweep leased to this driver (or take over ``options.resume``);
        return the cells left to run. Raises SweepInUseError when the sweep to resume
        runs under another driver's fresh heartbeat."""
        options = self.options
        # Results spooled while the store was down go in first: on resume they count as done.
        self.flushed = list(flush_spool(self.db, options.home, options.db_url).stored)
        stale_after = _STALE_BEATS * self.heartbeat_s
        with store.Session(self.db) as session:
            if options.resume is None:
                self.sweep_id = store.create_sweep(
                    session, plan, job_text, platform.node(), driver=self.driver
                )
            else:
                self.sweep_id = options.resume
                plan = _remaining(
                    plan,
                    store.load_sweep(session, self.sweep_id),
                    store.completed_cell_ids(session, self.sweep_id),
                )
                gone = store.claim_sweep(
                    session, self.sweep_id, self.driver, stale_after, gone=self._ended
                )
                if gone is not None:
                    self.events.notice(
                        f"sweep {self.sweep_id} was still marked running by "
                        f"{gone.describe(datetime.now(UTC))}: that driver is gone (no heartbeat "
                        f"for {stale_after:.0f} s, or its process on this host has ended); "
                        f"this driver ({self.driver}) takes it over"
                    )
            self.history = store.median_cell_durations(session, plan.cells)
        _RUNNING_HERE.add(self._key)
        self._hold_lease_file()
        self.events.planned(plan, self.sweep_id)
        return plan

    @property
    def _key(self) -> tuple[str, int]:
        return mask_url(store.normalize_url(self.options.db_url)), self.sweep_id

    def _lease_file(self, driver: str) -> Path:
        """``FARM_HOME/leases/<store>-<sweep>-<host>-<pid>.lock``: locked by that driver
        for as long as its process runs the sweep."""
        digest = hashlib.sha256(self._key[0].encode()).hexdigest()[:10]
        name = f"{digest}-{self.sweep_id}-{driver}".replace(":", "-").replace("/", "-")
        return self.options.home / "leases" / f"{name}.lock"

    def _hold_lease_file(self) -> None:
        path = self._lease_file(self.driver)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lease_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lease_fd, fcntl.LOCK_EX)

    def _release_lease_file(self) -> None:
        if self._lease_fd is not None:
            self._lease_file(self.driver).unlink(missing_ok=True)  # unlinked while held
            os.close(self._lease_fd)
            self._lease_fd = None

    def _ended(self, driver: str) -> bool:
        """Whether the lease's ``driver`` is known to have ended without waiting for its
        heartbeat to go stale: this process, not running the sweep any more (it ended
        while the store was down), or a process of this host whose lease file in this
        FARM_HOME nobody holds (killed). Anything else (another host, another FARM_HOME)
        is left to the heartbeat."""
        if driver == self.driver:
            return self._key not in _RUNNING_HERE
        if driver.rpartition(":")[0] != platform.node():
            return False
        path = self._lease_file(driver)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        else:
            path.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)

    def start_heartbeat(self) -> None:
        """Start refreshing this driver's lease on the sweep (a thread; ``finish`` stops it)."""
        self.lease = Lease(self.options.db_url, self.sweep_id, self.driver, self.heartbeat_s)
        self.lease.start()

    def land(self, cell: ServerCell, result: CellResult) -> None:
        """Store one result (spool it when the store refuses, keep it in memory when the
        spool cannot take it either) and tell the front end.

        Raises FarmError when another driver took the sweep over: this one must stop.
        """
        lease = self.lease
        if lease is not None and lease.lost is not None:
            raise FarmError(
                f"sweep {self.sweep_id} was taken over by "
                f"{lease.lost.describe(datetime.now(UTC))} while this driver ran it (its "
                "heartbeats did not reach the store in time); this driver stops, the results "
                "it stored stay"
            )
        refused: str | None = None
        if lease is not None and lease.store_down:
            # The heartbeat just failed: do not make every result wait out the timeout.
            refused = "the store did not take the last heartbeat"
        else:
            refused = self._store(result)
        if refused is not None:
            self._spool(result, refused)
        (self.ok if result.status == "ok" else self.failed).append(result.cell_id)
        self.events.cell_done(cell, result)

    def _store(self, result: CellResult) -> str | None:
        """Store ``result``; None when stored, else why not."""
        try:
            with store.answer_within(self.db), store.Session(self.db) as session:
                store.save_cell_result(session, self.sweep_id, result)
        except (StoreError, SQLAlchemyError) as exc:
            return type(exc).__name__
        return None

    def _spool(self, result: CellResult, refused: str) -> None:
        """Spool ``result``; keep it in memory (and say so) when the spool cannot take it."""
        options = self.options
        try:
            spool = spool_result(options.home, options.db_url, self.sweep_id, result)
        except OSError as exc:
            why = f"the store refused it ({refused}) and the spool too ({exc})"
            self.unsaved[result.cell_id] = (result, why)
            self.events.notice(
                f"result of {result.cell_id} neither stored nor spooled: {why}; kept in "
                "memory, tried again at the end of the sweep"
            )
            return
        self.unsaved.pop(result.cell_id, None)
        self.events.spooled(result.cell_id, f"{spool} ({refused})")
        self.spooled.append(result.cell_id)

    def hold_build(self, build: BuildInfo) -> None:
        """Hold a shared lock on ``build`` until the sweep ends, if it lives on this host."""
        env_dir = Path(build.env_dir)
        if env_dir.is_dir():
            self.builds_in_use.enter_context(use_build(env_dir))

    def run_cells(self, job: JobSpec, plan: Plan, workloads: tuple[LoadedWorkload, ...]) -> None:
        """Build the engines and run the cells on Ray, landing each result as it comes."""
        options = self.options
        estimates = estimate_cells(plan.cells, job.workloads, self.history)
        # Several stores may share one FARM_HOME: the time keeps their sweep ids apart.
        stamp = f"{datetime.now(UTC):%Y%m%d-%H%M%S}"
        log_dir = options.home / "logs" / f"sweep-{self.sweep_id}-{stamp}"
        with RayPool(options.ray_address, home=options.home, say=self.events.notice) as pool:
            placements = {
                (e.name, m.name): Placement(job.resources, e.pools, m.npus)
                for e in job.engines
                for m in job.models
            }
            placeable = []
            for cell in plan.cells:
                reason = pool.unplaceable(placements[cell.engine, cell.model])
                if reason:
                    self.land(cell, _unrun(cell, "failed", reason))
                else:
                    placeable.append(cell)
            builds = pool.start_builds(
                _build_targets(job, placeable, pool, placements),
                job.resources.build_dir,
                options.home / "cache",
                options.builder or default_build,
                self.events.build_line,
            )
            references = options.references(self.sweep_id) if options.references else {}
            tasks = [
                (
                    cell_task(job, cell, workloads, log_dir, references),
                    placements[cell.engine, cell.model],
                )
                for cell in placeable
            ]
            self.events.cells_started(len(tasks))
            by_id = {t.cell.cell_id: t.cell for t, _ in tasks}
            if options.first:
                rank = {cell_id: i for i, cell_id in enumerate(options.first)}
                tasks.sort(key=lambda t: rank.get(t[0].cell.cell_id, len(rank)))
            results = pool.run(
                tasks,
                runner=options.runner,
                estimates=estimates,
                order="given" if options.first else "lpt",
                builds=builds,
                on_start=lambda cell_id, node: self.events.cell_started(by_id[cell_id], node),
                on_build=_BuildRecorder(
                    builds, self.db, self.sweep_id, self.events, self.hold_build
                ),
                stop=lambda: self.stopped is not None,
            )
            for result in results:
                cell = by_id[result.cell_id]
                self.land(cell, result)
                if options.stop_after is not None and self.stopped is None:
                    self.stopped = options.stop_after(cell, result)
                    if self.stopped is not None:
                        self.events.notice(
                            f"stopping: {self.stopped}; the cells running finish, "
                            "no other cell starts"
                        )

    def finish(self, status: SweepStatus) -> None:
        """Stop the heartbeat, stamp the sweep's end (unless another driver took it over)
        and hand the store what it refused during the sweep; say what is still homeless."""
        options = self.options
        if self.lease is not None:
            self.lease.stop()
        self.builds_in_use.close()
        _RUNNING_HERE.discard(self._key)
        self._release_lease_file()
        for result, _why in list(self.unsaved.values()):
            refused = self._store(result)  # the store or the disk may be back by now
            if refused is None:
                del self.unsaved[result.cell_id]
            else:
                self._spool(result, refused)
        if self.unsaved and status != "interrupted":
            status = "interrupted"  # not every result is stored: --resume runs the rest
        try:
            with store.answer_within(self.db), store.Session(self.db) as session:
                mine = store.finish_sweep(session, self.sweep_id, status, driver=self.driver)
            if not mine:
                self.events.notice(
                    f"sweep {self.sweep_id} is another driver's now; its status is left to it"
                )
        except (StoreError, SQLAlchemyError):
            pass
        if self.spooled:
            flush = flush_spool(self.db, options.home, options.db_url, self.sweep_id)
            self.flushed.extend(flush.stored)
            self.spooled = [str(p) for p in spooled(options.home, options.db_url, self.sweep_id)]
        if self.unsaved:
            self.events.notice(self._unsaved_notice())

    def _unsaved_notice(self) -> str:
        lines = [f"  {cell_id}: {why}" for cell_id, (_, why) in self.unsaved.items()]
        return (
            f"{len(self.unsaved)} result(s) of sweep {self.sweep_id} could be neither stored "
            f"nor spooled to {spool_dir(self.options.home)}, and are lost when this process "
            "ends:\n" + "\n".join(lines) + "\nFree or fix the spool folder (or FARM_HOME) "
            "and the store, then `farm run JOB --resume "
            f"{self.sweep_id}` runs those cells again (the sweep is not marked finished)."
        )

    def outcome(self) -> SweepOutcome:
        return SweepOutcome(
            sweep_id=self.sweep_id,
            ok=tuple(self.ok),
            failed=tuple(self.failed),
            spooled=tuple(self.spooled),
            flushed=tuple(self.flushed),
            unsaved=tuple(self.unsaved),
            stopped=self.stopped,
        )


def cell_task(
    job: JobSpec,
    cell: ServerCell,
    workloads: tuple[LoadedWorkload, ...],
    log_dir: Path,
    references: Mapping[ComparableKey, ReferenceRun] | None = None,
) -> CellTask:
    """What a worker needs to run ``cell`` of ``job`` (its sequential looks against
    ``references``, when its workload asks for them)."""
    model = next(m for m in job.models if m.name == cell.model)
    return CellTask(
        cell=cell,
        engine=next(e for e in job.engines if e.name == cell.engine),
        model=cell_model(model, cell),
        model_path=str(job.resolve(model.path)),
        workloads=workloads,
        timeouts=job.timeouts,
        log_dir=str(log_dir),
        sequential=sequential_looks(cell, workloads, references or {}),
    )


def _build_targets(
    job: JobSpec,
    cells: list[ServerCell],
    pool: RayPool,
    placements: Mapping[tuple[str, str], Placement],
) -> dict[str, tuple[EngineSpec, list[str]]]:
    """Each engine the cells use, with every node that may run one of its cells."""
    nodes = pool.nodes()
    targets = {}
    for name in dict.fromkeys(c.engine for c in cells):
        # Each model of the engine its own NPUs: a node that fits any of them.
        needs = {placements[c.engine, c.model] for c in cells if c.engine == name}
        spec = next(e for e in job.engines if e.name == name)
        targets[name] = (spec, [n["NodeID"] for n in nodes if any(p.fits(n) for p in needs)])
    return targets


class _BuildRecorder:
    """Stores each build where it landed and tells the front end, per node and per engine;
    ``hold`` keeps each build that landed in use for the rest of the sweep."""

    def __init__(
        self,
        builds: NodeBuilds,
        db: Engine,
        sweep_id: int,
        events: SweepEvents,
        hold: Callable[[BuildInfo], None],
    ) -> None:
        self._builds = builds
        self._db = db
        self._sweep_id = sweep_id
        self._events = events
        self._hold = hold

    def __call__(self, outcome: BuildOutcome) -> None:
        engine, node_id, build = outcome
        label = self._builds.label(node_id)
        if isinstance(build, str):
            self._events.build_placed(engine, label, build)
        else:
            self._hold(build)
            try:
                with store.answer_within(self._db), store.Session(self._db) as session:
                    store.record_build(session, self._sweep_id, build)
                    store.record_build_location(
                        session,
                        store.BuildLocation(
                            build_id=build.build_id,
                            node_id=node_id,
                            host=str(
                                self._builds.nodes.get(node_id, {}).get("NodeManagerHostname", "")
                            ),
                            env_dir=build.env_dir,
                        ),
                    )
            except (StoreError, SQLAlchemyError) as exc:
                # Builds land while cells run: a store that is down now must not stop
                # the sweep; only where the build lives goes unrecorded.
                label += f" (not recorded, the store refused it: {type(exc).__name__})"
            self._events.build_placed(engine, label, None)
        if not self._builds.waiting(engine):
            ready = self._builds.ready.get(engine)
            first = next(iter(ready.values())) if ready else None
            self._events.build_done(engine, first, None if first else self._builds.failures(engine))


def _remaining(plan: Plan, stored: SweepRecord, done: set[str]) -> Plan:
    """The cells of ``plan`` that sweep ``stored`` has not finished; the job must match."""
    planned = {c.cell.cell_id for c in stored.cells}
    unknown = sorted({c.cell_id for c in plan.cells} - planned)
    if unknown:
        raise FarmError(
            f"cannot resume sweep {stored.sweep_id}: the job now has cells it did not plan "
            f"({', '.join(unknown[:3])}...); run it as a new sweep"
        )
    return plan.model_copy(update={"cells": tuple(c for c in plan.cells if c.cell_id not in done)})


def _unrun(cell: ServerCell, status: CellStatus, error: str) -> CellResult:
    return CellResult.never_ran(cell.cell_id, error, status)

"""Drive one sweep: plan -> builds -> cells on Ray -> store, result by result.

Each result is written the moment its cell finishes, so a sweep stopped at any
point keeps everything it measured. A result the store refuses is spooled to a
JSON file instead of being lost.
"""

from __future__ import annotations

import platform
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from farm import store
from farm.engines import job_capabilities
from farm.errors import FarmError, StoreError
from farm.orchestrate import (
    BuildOutcome,
    BuildRunner,
    CellRunner,
    NodeBuilds,
    Placement,
    RayPool,
    default_build,
)
from farm.paths import farm_home
from farm.plan import Plan, ServerCell, expand_matrix, parse_only, select
from farm.records import BuildInfo, CellResult, CellStatus, SweepRecord, SweepStatus
from farm.runner import CellTask
from farm.schedule import estimate_cells
from farm.spec import EngineSpec, JobSpec
from farm.store.spool import flush_spool, spool_result, spooled
from farm.workload.prompts import LoadedWorkload, load_workload

__all__ = ["SweepEvents", "SweepOptions", "SweepOutcome", "farm_home", "plan_job", "run_sweep"]


class SweepOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    db_url: str
    ray_address: str | None = None
    only: dict[str, str] = {}
    home: Path
    resume: int | None = None
    runner: CellRunner | None = None  # None: the real engine runner
    builder: BuildRunner | None = None  # None: the real build (farm.builds.ensure_build)


class SweepOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep_id: int
    ok: tuple[str, ...]
    failed: tuple[str, ...]
    spooled: tuple[str, ...] = ()  # files still on disk: the store refused them to the end
    flushed: tuple[str, ...] = ()  # spooled earlier, stored now


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
    try:
        with _sigterm_as_interrupt():
            if plan.cells:
                sweep.run_cells(job, plan, workloads)
    except BaseException:
        sweep.finish("interrupted")
        raise
    sweep.finish("failed" if sweep.failed else "ok")
    return sweep.outcome()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (what schedulers and Kubernetes send) stops the sweep as Ctrl-C does,
    so it is stored as interrupted and its engines are stopped, not orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Sweep:
    """One sweep's store side: its row, the results it lands, its end."""

    def __init__(self, db: Engine, options: SweepOptions, events: SweepEvents) -> None:
        self.db = db
        self.options = options
        self.events = events
        self.sweep_id = 0
        self.ok: list[str] = []
        self.failed: list[str] = []
        self.spooled: list[str] = []
        self.flushed: list[str] = []

    def open(self, plan: Plan, job_text: str) -> Plan:
        """Create the sweep (or reopen ``options.resume``); return the cells left to run."""
        options = self.options
        # Results spooled while the store was down go in first: on resume they count as done.
        self.flushed = list(flush_spool(self.db, options.home, options.db_url).stored)
        with store.Session(self.db) as session:
            if options.resume is None:
                self.sweep_id = store.create_sweep(session, plan, job_text, platform.node())
            else:
                self.sweep_id = options.resume
                plan = _remaining(
                    plan,
                    store.load_sweep(session, self.sweep_id),
                    store.completed_cell_ids(session, self.sweep_id),
                )
                store.reopen_sweep(session, self.sweep_id)
            self.history = store.median_cell_durations(session, plan.cells)
        self.events.planned(plan, self.sweep_id)
        return plan

    def land(self, cell: ServerCell, result: CellResult) -> None:
        """Store one result (spool it when the store refuses) and tell the front end."""
        try:
            with store.Session(self.db) as session:
                store.save_cell_result(session, self.sweep_id, result)
        except (StoreError, SQLAlchemyError) as exc:
            spool = spool_result(self.options.home, self.options.db_url, self.sweep_id, result)
            self.events.spooled(result.cell_id, f"{spool} ({type(exc).__name__})")
            self.spooled.append(result.cell_id)
        (self.ok if result.status == "ok" else self.failed).append(result.cell_id)
        self.events.cell_done(cell, result)

    def run_cells(self, job: JobSpec, plan: Plan, workloads: tuple[LoadedWorkload, ...]) -> None:
        """Build the engines and run the cells on Ray, landing each result as it comes."""
        options = self.options
        estimates = estimate_cells(plan.cells, job.workloads, self.history)
        # Several stores may share one FARM_HOME: the time keeps their sweep ids apart.
        stamp = f"{datetime.now(UTC):%Y%m%d-%H%M%S}"
        log_dir = options.home / "logs" / f"sweep-{self.sweep_id}-{stamp}"
        with RayPool(options.ray_address) as pool:
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
            tasks = [
                (_task(job, cell, workloads, log_dir), placements[cell.engine, cell.model])
                for cell in placeable
            ]
            self.events.cells_started(len(tasks))
            by_id = {t.cell.cell_id: t.cell for t, _ in tasks}
            results = pool.run(
                tasks,
                runner=options.runner,
                estimates=estimates,
                builds=builds,
                on_start=lambda cell_id, node: self.events.cell_started(by_id[cell_id], node),
                on_build=_BuildRecorder(builds, self.db, self.sweep_id, self.events),
            )
            for result in results:
                self.land(by_id[result.cell_id], result)

    def finish(self, status: SweepStatus) -> None:
        """Stamp the sweep's end; hand the store what it refused during the sweep."""
        options = self.options
        try:
            with store.Session(self.db) as session:
                store.finish_sweep(session, self.sweep_id, status)
        except (StoreError, SQLAlchemyError):
            pass
        # The store may be back by now.
        if self.spooled:
            flush = flush_spool(self.db, options.home, options.db_url, self.sweep_id)
            self.flushed.extend(flush.stored)
            self.spooled = [str(p) for p in spooled(options.home, options.db_url, self.sweep_id)]

    def outcome(self) -> SweepOutcome:
        return SweepOutcome(
            sweep_id=self.sweep_id,
            ok=tuple(self.ok),
            failed=tuple(self.failed),
            spooled=tuple(self.spooled),
            flushed=tuple(self.flushed),
        )


def _task(
    job: JobSpec, cell: ServerCell, workloads: tuple[LoadedWorkload, ...], log_dir: Path
) -> CellTask:
    model = next(m for m in job.models if m.name == cell.model)
    return CellTask(
        cell=cell,
        engine=next(e for e in job.engines if e.name == cell.engine),
        model=model,
        model_path=str(job.resolve(model.path)),
        workloads=workloads,
        timeouts=job.timeouts,
        log_dir=str(log_dir),
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
    """Stores each build where it landed and tells the front end, per node and per engine."""

    def __init__(self, builds: NodeBuilds, db: Engine, sweep_id: int, events: SweepEvents) -> None:
        self._builds = builds
        self._db = db
        self._sweep_id = sweep_id
        self._events = events

    def __call__(self, outcome: BuildOutcome) -> None:
        engine, node_id, build = outcome
        label = self._builds.label(node_id)
        if isinstance(build, str):
            self._events.build_placed(engine, label, build)
        else:
            try:
                with store.Session(self._db) as session:
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

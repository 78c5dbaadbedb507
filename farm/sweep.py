"""Drive one sweep: plan -> builds -> cells on Ray -> store, result by result.

Each result is written the moment its cell finishes, so a sweep stopped at any
point keeps everything it measured. A result the store refuses is spooled to a
JSON file instead of being lost.
"""

from __future__ import annotations

import functools
import platform
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from farm import store
from farm.builds import ensure_build
from farm.engines import job_capabilities
from farm.errors import BuildError, FarmError, StoreError
from farm.orchestrate import CellRunner, Placement, RayPool
from farm.paths import farm_home
from farm.plan import Plan, ServerCell, expand_matrix, select
from farm.records import BuildInfo, CellResult, CellStatus, SweepRecord
from farm.runner import CellTask
from farm.spec import JobSpec
from farm.workload.prompts import LoadedWorkload, load_prompts

__all__ = ["SweepEvents", "SweepOptions", "SweepOutcome", "farm_home", "plan_job", "run_sweep"]


class SweepOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    db_url: str
    ray_address: str | None = None
    only: dict[str, str] = {}
    home: Path
    resume: int | None = None
    runner: CellRunner | None = None  # None: the real engine runner


class SweepOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep_id: int
    ok: tuple[str, ...]
    failed: tuple[str, ...]
    spooled: tuple[str, ...] = ()


class SweepEvents:
    """Callbacks through which a front end (the CLI) shows progress. No-ops here."""

    def planned(self, plan: Plan, sweep_id: int) -> None: ...
    def build_line(self, engine: str, line: str) -> None: ...
    def build_done(self, engine: str, build: BuildInfo | None, error: str | None) -> None: ...
    def cells_started(self, count: int) -> None: ...
    def cell_done(self, cell: ServerCell, result: CellResult) -> None: ...


def plan_job(job: JobSpec, only: dict[str, str] | None = None) -> Plan:
    """The job's plan, restricted to the ``only`` slice."""
    plan = expand_matrix(job, job_capabilities(job))
    return select(plan, only) if only else plan


def run_sweep(
    job: JobSpec, job_text: str, options: SweepOptions, events: SweepEvents | None = None
) -> SweepOutcome:
    """Run every cell of ``job`` and store the results; see the module docstring."""
    events = events or SweepEvents()
    plan = plan_job(job, options.only)
    # Read every input before anything is written: a bad prompt file writes nothing.
    workloads = tuple(
        LoadedWorkload(spec=w, prompts=load_prompts(job.resolve(w.prompts), w.count))
        for w in job.workloads
    )
    engine = store.open_store(options.db_url)
    with store.Session(engine) as session:
        if options.resume is None:
            sweep_id = store.create_sweep(session, plan, job_text, platform.node())
        else:
            sweep_id = options.resume
            plan = _remaining(
                plan,
                store.load_sweep(session, sweep_id),
                store.completed_cell_ids(session, sweep_id),
            )
            store.reopen_sweep(session, sweep_id)
    events.planned(plan, sweep_id)
    # Several stores may share one FARM_HOME: the time keeps their sweep ids apart.
    log_dir = options.home / "logs" / f"sweep-{sweep_id}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    outcome: dict[str, list[str]] = {"ok": [], "failed": [], "spooled": []}

    def land(cell: ServerCell, result: CellResult) -> None:
        try:
            with store.Session(engine) as session:
                store.save_cell_result(session, sweep_id, result)
        except (StoreError, SQLAlchemyError) as exc:
            spool = options.home / "spool" / f"sweep-{sweep_id}" / f"{result.cell_id}.json"
            spool.parent.mkdir(parents=True, exist_ok=True)
            spool.write_text(result.model_dump_json())
            outcome["spooled"].append(f"{result.cell_id} -> {spool} ({type(exc).__name__})")
        outcome["ok" if result.status == "ok" else "failed"].append(result.cell_id)
        events.cell_done(cell, result)

    builds = _build_engines(job, plan, options.home, engine, sweep_id, events)
    tasks: list[CellTask] = []
    for cell in plan.cells:
        build = builds[cell.engine]
        if isinstance(build, str):
            land(cell, _unrun(cell, "build_failed", build))
            continue
        model = next(m for m in job.models if m.name == cell.model)
        tasks.append(
            CellTask(
                cell=cell,
                engine=next(e for e in job.engines if e.name == cell.engine),
                model=model,
                model_path=str(job.resolve(model.path)),
                workloads=workloads,
                build=build,
                timeouts=job.timeouts,
                log_dir=str(log_dir),
            )
        )
    status = "ok"
    try:
        if tasks:
            with RayPool(options.ray_address) as pool:
                placed = [(t, Placement(job.resources, t.engine.pools)) for t in tasks]
                runnable = []
                for task, placement in placed:
                    reason = pool.unplaceable(placement)
                    if reason:
                        land(task.cell, _unrun(task.cell, "failed", reason))
                    else:
                        runnable.append((task, placement))
                events.cells_started(len(runnable))
                by_id = {t.cell.cell_id: t.cell for t, _ in runnable}
                for result in pool.run(runnable, *([options.runner] if options.runner else [])):
                    land(by_id[result.cell_id], result)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if status != "interrupted":
            status = "failed" if outcome["failed"] else "ok"
        try:
            with store.Session(engine) as session:
                store.finish_sweep(session, sweep_id, status)  # type: ignore[arg-type]
        except (StoreError, SQLAlchemyError):
            pass
    return SweepOutcome(
        sweep_id=sweep_id,
        ok=tuple(outcome["ok"]),
        failed=tuple(outcome["failed"]),
        spooled=tuple(outcome["spooled"]),
    )


def _build_engines(
    job: JobSpec, plan: Plan, home: Path, db: Engine, sweep_id: int, events: SweepEvents
) -> dict[str, BuildInfo | str]:
    """Each engine the plan uses, built or reused; a failed build maps to its error."""
    builds: dict[str, BuildInfo | str] = {}
    for name in dict.fromkeys(c.engine for c in plan.cells):
        spec = next(e for e in job.engines if e.name == name)
        try:
            build = ensure_build(spec, home / "cache", functools.partial(events.build_line, name))
        except (BuildError, FarmError) as exc:
            builds[name] = str(exc)
            events.build_done(name, None, str(exc))
            continue
        with store.Session(db) as session:
            store.record_build(session, sweep_id, build)
        builds[name] = build
        events.build_done(name, build, None)
    return builds


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
    now = datetime.now(UTC)
    return CellResult(
        cell_id=cell.cell_id,
        status=status,
        started_at=now,
        finished_at=now,
        error=error,
    )

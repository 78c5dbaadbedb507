"""A night's confirmation reruns on Ray: each suspicious cell rerun with the night's
build and the last good night's, interleaved (A B A B ...), on the node it ran on.

One rerun at a time per cell, each a Ray task pinned to that node with the cell's
resources; each rerun is handed to ``landed`` (which stores it) the moment it ends, and
``landed`` says when the cell's runs settle it early. A rerun whose build is not on the
node, or whose engine fails, comes back failed and is stored as such; the decision
leaves failed runs out. Cells on different nodes do not wait for each other's reruns
in this first cut: they run one after another (the reruns of a night are few).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm.analysis.confirm_plan import ConfirmPlan
from farm.orchestrate.dispatch import CellRunner, _run_remote
from farm.orchestrate.driver import cell_task
from farm.orchestrate.placement import Placement, _alive_nodes, node_label
from farm.orchestrate.ray_pool import RayPool
from farm.records import BuildInfo, CellResult, ConfirmationRun, ConfirmSide
from farm.runner import CellTask, run_cell
from farm.spec import JobSpec
from farm.workload.prompts import load_workload

__all__ = ["Landed", "run_confirmations"]

# Told each rerun as it lands; True: the cell's runs settle it, run no more pairs.
Landed = Callable[[ConfirmationRun], bool]


def run_confirmations(
    job: JobSpec,
    plans: Sequence[ConfirmPlan],
    *,
    home: Path,
    log_dir: Path,
    landed: Landed,
    ray_address: str | None = None,
    runner: CellRunner | None = None,
    say: Callable[[str], None] | None = None,
) -> None:
    """Run the reruns of ``plans`` (:func:`farm.analysis.confirm_plan.plan_confirmations`)
    for ``job``'s cells; ``runner`` runs one cell on the worker (default: the real
    engine runner, refusing a build that is not on the node)."""
    if not plans:
        return
    workloads = tuple(load_workload(w, job.resolve) for w in job.workloads)
    remote = ray.remote(_run_remote)
    with RayPool(ray_address, home=home, say=say):
        for plan in plans:
            # Only the variants being confirmed: the rest of the cell has its verdict.
            confirmed = [t.axes for t in plan.targets]
            cell = plan.cell.model_copy(
                update={"variants": tuple(v for v in plan.cell.variants if v.axes in confirmed)}
                if confirmed
                else {}
            )
            task = cell_task(job, cell, workloads, log_dir)
            placement = Placement(
                job.resources,
                next(e for e in job.engines if e.name == cell.engine).pools,
                next(m for m in job.models if m.name == cell.model).npus,
            )
            node = _node_id(plan.node)
            for run in range(plan.first_run, plan.runs + 1):
                settled = False
                sides: tuple[tuple[ConfirmSide, BuildInfo], ...] = (
                    ("candidate", plan.candidate),
                    ("reference", plan.reference),
                )
                for side, build in sides:
                    side_task = task.model_copy(
                        update={
                            "build": build,
                            "log_dir": str(log_dir / f"confirm-{side}-{run}"),
                        }
                    )
                    options = placement.options(f"{plan.cell_id}.confirm.{side}.{run}")
                    if node is not None:
                        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                            node, soft=False
                        )
                    ref = remote.options(**options).remote(side_task, runner or _present_build)
                    result = _result(ref, plan.cell_id)
                    settled = landed(_rerun(plan.cell_id, side, run, build, result))
                if settled:
                    break


def _present_build(task: CellTask, npu_ids: tuple[int, ...], node: str) -> CellResult:
    """The engine runner, on the build the rerun names only: a rerun labelled with the
    last good night's build must never be served by another (the cell runner would
    build the job's engine, tonight's, where it is missing)."""
    build = task.build
    if build is None or not Path(build.python).exists():
        missing = build.build_id if build is not None else "no build"
        return CellResult.never_ran(
            task.cell.cell_id, f"build {missing} is not on node {node}: rerun not made", node=node
        )
    return run_cell(task, npu_ids=npu_ids, node=node)


def _result(ref: Any, cell_id: str) -> CellResult:
    try:
        result: CellResult = ray.get(ref)
    except ray.exceptions.RayError as exc:
        return CellResult.never_ran(cell_id, f"Ray task failed: {type(exc).__name__}: {exc}")
    return result


def _rerun(
    cell_id: str, side: ConfirmSide, run: int, build: BuildInfo, result: CellResult
) -> ConfirmationRun:
    return ConfirmationRun(
        cell_id=cell_id, side=side, run=run, build_id=build.build_id, result=result
    )


def _node_id(label: str | None) -> str | None:
    """The Ray node id of a node label (``host:id-prefix``) that is alive, else None
    (the rerun goes where Ray places it, and its result names that node)."""
    if label is None:
        return None
    for node in _alive_nodes():
        if node_label(node) == label:
            return str(node["NodeID"])
    return None

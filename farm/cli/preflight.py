"""What `farm plan`, `farm run` (and `--dry-run`) check before an engine starts.

Each check lives with its stage (job paths in :mod:`farm.spec`, prompt files in
:mod:`farm.workload.prompts`, patch names in :mod:`farm.builds.series`, golden case
files in :mod:`farm.goldens`); this module
only runs them all and says every problem at once, with file, line and key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from farm.cli.common import open_session, say
from farm.errors import FarmError, SpecError

if TYPE_CHECKING:
    from farm.plan import Plan, ServerCell
    from farm.records import SweepRecord
    from farm.spec import JobFile

__all__ = ["check_job", "check_resume", "resume_problems"]

# Cell ids a message lists before it says "and N more".
_SHOWN = 5


def check_job(
    job_file: Path, only: Mapping[str, str], on_this_machine: bool
) -> tuple[JobFile, Plan]:
    """Read ``job_file`` and plan it (the ``only`` slice); check every input a run reads.

    ``on_this_machine``: the cells run here (a local Ray cluster), so node-side paths
    must exist here too. Notes (paths expected on the nodes) go to standard error.
    Raises SpecError listing every problem, PlanError for a bad ``--only``.
    """
    # Imported here: planning asks the engines for their capabilities.
    from farm.builds.series import check_patch_names
    from farm.goldens import golden_problems
    from farm.job_text import process_text_problems
    from farm.orchestrate.driver import plan_job
    from farm.spec import check_job_paths, read_job
    from farm.workload.prompts import check_prompts

    job = read_job(job_file)
    plan = plan_job(job.spec, only)
    problems, notes = check_job_paths(job, on_this_machine)
    problems += check_prompts(job)
    problems += check_patch_names(job)
    problems += golden_problems(job)
    problems += process_text_problems(job.spec.model_dump(mode="json", exclude={"base_dir"}))
    if not plan.cells:
        problems.append(_empty_plan(job, plan, only))
    for note in notes:
        say(("note:", "yellow"), f" {note}", err=True)
    if problems:
        raise SpecError(f"{job.source}: the job cannot run\n  " + "\n  ".join(problems))
    return job, plan


def _empty_plan(job: JobFile, plan: Plan, only: Mapping[str, str]) -> str:
    """Why ``plan`` has no cell: the ``--only`` slice, or what excluded every cell."""
    if only:
        from farm.orchestrate.driver import plan_job

        full = plan_job(job.spec)
        if full.cells:
            given = " ".join(f"--only {k}={v}" for k, v in only.items())
            return f"{given} selects none of the job's {len(full.cells)} cells"
    reasons = Counter(e.reason for e in plan.excluded)
    shown = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(3))
    more = f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
    return (
        f"{job.where('name')}: the job plans no cell to run (every combination is "
        f"excluded: {shown or 'no combination'}{more}); nothing would be measured"
    )


def _identity(cell: ServerCell) -> tuple[str, frozenset[str]]:
    """A planned cell's comparable fingerprint and its variants' (what it measures)."""
    return cell.key.fingerprint, frozenset(
        cell.variant_key(v.axes).fingerprint for v in cell.variants
    )


def _ids(ids: list[str]) -> str:
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return ", ".join(ids[:_SHOWN]) + more


def resume_problems(
    stored: SweepRecord, job: JobFile, plan: Plan, only: Mapping[str, str]
) -> list[str]:
    """How this job's ``plan`` differs from the plan sweep ``stored`` was started with:
    another job name, cells it lacks or adds, cells that measure something else."""
    problems = []
    if stored.job != job.spec.name:
        problems.append(
            f"sweep {stored.sweep_id} is of job {stored.job!r}; {job.where('name')} is "
            f"{job.spec.name!r} (another job file?)"
        )
    before = {c.cell.cell_id: c.cell for c in stored.cells}
    now = {c.cell_id: c for c in plan.cells}
    slice_ = " with " + " ".join(f"--only {k}={v}" for k, v in only.items()) if only else ""
    missing = [cid for cid in before if cid not in now]
    if missing:
        problems.append(
            f"this job{slice_} plans {len(now)} of the {len(before)} cells sweep "
            f"{stored.sweep_id} planned; the others ({_ids(missing)}) would never run"
        )
    added = [cid for cid in now if cid not in before]
    if added:
        problems.append(
            f"this job{slice_} plans cells sweep {stored.sweep_id} did not ({_ids(added)})"
        )
    changed = [
        cid for cid in now if cid in before and _identity(now[cid]) != _identity(before[cid])
    ]
    if changed:
        problems.append(
            f"cells measure something else now (workloads, variants or graph mode changed): "
            f"{_ids(changed)}"
        )
    return problems


def check_resume(job: JobFile, plan: Plan, only: Mapping[str, str], db: str, sweep_id: int) -> None:
    """FarmError unless ``plan`` is the plan sweep ``sweep_id`` was started with (same
    job, same cells, same slice); the store must exist. Reads only."""
    from farm.store.repository import load_sweep

    with open_session(db) as session:
        stored = load_sweep(session, sweep_id)
    problems = resume_problems(stored, job, plan, only)
    if problems:
        raise FarmError(
            f"cannot resume sweep {sweep_id}: "
            + "; ".join(problems)
            + "; resume with the job file and --only it was started with, or start a new sweep"
        )

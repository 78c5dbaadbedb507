"""What `farm plan`, `farm run` (and `--dry-run`) check before an engine starts.

Each check lives with its stage (job paths in :mod:`farm.spec`, prompt files in
:mod:`farm.workload.prompts`, patch names in :mod:`farm.builds.series`, golden case
files in :mod:`farm.spec.goldens`); this module
only runs them all and says every problem at once, with file, line and key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from farm.cli.common import say
from farm.errors import SpecError

if TYPE_CHECKING:
    from farm.plan import Plan
    from farm.spec import JobFile

__all__ = ["check_job"]


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
    from farm.job_text import process_text_problems
    from farm.orchestrate.driver import plan_job
    from farm.spec import check_job_paths, read_job
    from farm.spec.goldens import golden_problems
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

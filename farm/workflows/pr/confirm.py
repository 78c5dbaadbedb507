"""A PR's confirmations: after its sweep ran and before its verdict, each suspicious
candidate cell is rerun with the head's build and the base's, interleaved on the node
it ran on (:mod:`farm.analysis.confirm`), so a run that drew low fails no PR.

The PR sweep is judged once by its own rules without writing anything; a comparison
whose key is calibrated on the job's noisy nights and whose first run is suspicious
asks for its cell to be rerun (:func:`farm.analysis.confirm_plan.plan_confirmations`,
within ``nightly.confirm_budget_s`` for the PR run). The reruns are stored as
confirmation runs of the PR sweep as they land, and the PR's verdict reads them with
the sweep. A deterministic engine (no spread in its nights) is never confirmed: its
rules have no noise rule.

The base build a rerun uses is the one the base cells ran with: in the PR sweep, or
in the earlier sweeps its cells were reused from (the same build id).
"""

from __future__ import annotations

from sqlmodel import Session

from farm.analysis.confirm_plan import plan_confirmations
from farm.analysis.judgement import JudgeRules
from farm.records import BuildInfo, SweepRecord
from farm.store.builds import sweep_build_infos
from farm.store.cells import load_sweep
from farm.workflows.nightly.confirm import ConfirmNight, rerun_planned
from farm.workflows.pr.decide import judge_pr
from farm.workflows.pr.steps import PrBaseline, PrSetup

__all__ = ["confirm_pr"]


def confirm_pr(
    url: str,
    sweep_id: int,
    setup: PrSetup,
    baseline: PrBaseline,
    deps: ConfirmNight,
    *,
    rules: JudgeRules,
) -> bool:
    """Plan and run the confirmations of PR sweep ``sweep_id`` under ``rules`` (the
    PR's: :func:`farm.workflows.pr.steps.pr_judge_rules`; nothing without a noise
    rule or when no cell is suspicious). A rerun the store refuses is said and left
    out. True when reruns were asked for."""
    rule = rules.noise.confirm if rules.noise is not None else None
    if rule is None or rule.runs < 1:
        return False
    with deps.open_session(url) as session:
        record = load_sweep(session, sweep_id)
        judged = judge_pr(
            record,
            base=setup.base.name,
            candidate=setup.candidate.name,
            reused=baseline.reused,
            job=setup.job,
            number=setup.number,
            rules=rules,
        )
        builds = _base_builds(session, record, setup, baseline)
    plans, notes = plan_confirmations(
        record,
        record.model_copy(update={"builds": builds}),
        judged.comparison,
        rule,
        engine_map={setup.candidate.name: setup.base.name},
        reference="the PR's base",
    )
    return rerun_planned(url, record, plans, notes, deps, rule)


def _base_builds(
    session: Session, record: SweepRecord, setup: PrSetup, baseline: PrBaseline
) -> tuple[BuildInfo, ...]:
    """The base engine's builds its cells ran with: in the PR sweep and in the sweeps
    its reused cells came from, each build once."""
    reused = sorted({c.sweep_id for c in baseline.reused})
    found = [*record.builds, *(b for s in reused for b in sweep_build_infos(session, s))]
    mine = [
        b
        for b in found
        if b.engine == setup.base.name
        and (setup.base_build_id is None or b.build_id == setup.base_build_id)
    ]
    return tuple({b.build_id: b for b in reversed(mine)}.values())

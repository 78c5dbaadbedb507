"""The night's confirmations: after its sweep ran and before its one judgement, rerun
each suspicious cell beside the last good night's build (:mod:`farm.analysis.confirm`).

The night is judged once without writing anything, its suspicious cells are planned
within the night's budget (:func:`farm.analysis.confirm_plan.plan_confirmations`), and
the reruns the orchestrator makes are stored as they land; the night's judgement then
reads them with the sweep. A resumed night plans again from what is stored, so it
finishes the confirmations a stopped night left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlmodel import Session

from farm.analysis.confirm import ConfirmRule
from farm.analysis.confirm_plan import ConfirmPlan, confirmation_settled, plan_confirmations
from farm.analysis.noise import NoiseRule
from farm.errors import FarmError
from farm.masking import mask_secrets
from farm.records import ConfirmationRun, SweepRecord
from farm.spec.goldens import GoldenCheck
from farm.store.cells import load_sweep
from farm.store.confirmations import record_confirmation_run
from farm.workflows.nightly.steps import Baseline, judge_stored, last_good_id

__all__ = ["ConfirmNight", "Reruns", "confirm_night", "rerun_planned"]

# Runs the reruns of ``plans`` for sweep N, telling each as it lands; the callback
# returns True when the cell's runs settle it early (no further pair).
Reruns = Callable[[int, Sequence[ConfirmPlan], Callable[[ConfirmationRun], bool]], None]


@dataclass(frozen=True)
class ConfirmNight:
    """What a night's (or a PR's) confirmations need: the store, the runner of reruns,
    the lines they print (a plan, a cell not confirmed and why, each rerun as it
    lands)."""

    open_session: Callable[[str], AbstractContextManager[Session]]
    reruns: Reruns
    said: Callable[[str], None]


def confirm_night(
    url: str,
    sweep_id: int,
    deps: ConfirmNight,
    *,
    history: int,
    goldens: Sequence[GoldenCheck] = (),
    baseline: Baseline = "last-good",
    rule: ConfirmRule | None = None,
) -> SweepRecord | None:
    """Plan and run the confirmations of night ``sweep_id`` under ``rule`` (the job's
    ``nightly.confirm_runs`` and ``confirm_budget_s``; nothing when no cell is
    suspicious). A rerun the store refuses is said and left out; the night goes on.
    Returns the night as read when nothing was rerun (its judgement reads it again
    only when reruns were stored), else None."""
    confirm = rule or NoiseRule().confirm
    with deps.open_session(url) as session:
        record = load_sweep(session, sweep_id)
        good = _baseline(session, record, baseline)
        night = judge_stored(
            session, sweep_id, baseline=good, history=history, goldens=goldens, record=record
        )
    plans, notes = plan_confirmations(record, good, night.judgement.comparison, confirm)
    return None if rerun_planned(url, record, plans, notes, deps, confirm) else record


def rerun_planned(
    url: str,
    record: SweepRecord,
    plans: Sequence[ConfirmPlan],
    notes: Sequence[str],
    deps: ConfirmNight,
    rule: ConfirmRule,
) -> bool:
    """Say ``notes`` and each plan, run the reruns of ``plans`` for sweep ``record``
    and store each as it lands (a night's, and a PR's: :mod:`farm.workflows.pr.confirm`);
    a rerun the store refuses is said and left out. True when reruns were asked for
    (the sweep must be read again for its judgement)."""
    sweep_id = record.sweep_id
    for note in notes:
        deps.said(note)
    if not plans:
        return False
    for plan in plans:
        labels = ", ".join(t.label for t in plan.targets)
        deps.said(
            f"confirming {labels}: reruns {plan.first_run}-{plan.runs} of {plan.candidate.build_id}"
            f" and {plan.reference.build_id}, interleaved"
        )
    runs = {p.cell_id: [r for r in record.confirmations if r.cell_id == p.cell_id] for p in plans}
    targets = {p.cell_id: p.targets for p in plans}

    def landed(run: ConfirmationRun) -> bool:
        try:
            with deps.open_session(url) as session:
                record_confirmation_run(session, sweep_id, run)
        except FarmError as exc:
            deps.said(
                mask_secrets(f"rerun {run.side} {run.run} of {run.cell_id} not stored: {exc}")
            )
            return False
        runs[run.cell_id].append(run)
        al = ", ".join(
            f"{v.counters.mean_acceptance_length:.3f}"
            for v in run.result.variants
            if v.counters.mean_acceptance_length is not None
        )
        deps.said(f"  {run.cell_id} {run.side} run {run.run}: {run.result.status}, AL {al or '-'}")
        return run.side == "reference" and confirmation_settled(
            targets[run.cell_id], runs[run.cell_id], rule
        )

    deps.reruns(sweep_id, plans, landed)
    return True


def _baseline(session: Session, record: SweepRecord, baseline: Baseline) -> SweepRecord | None:
    """The last good night as a record (``baseline`` as :func:`judge_stored` takes it)."""
    if baseline == "last-good":
        baseline = last_good_id(session, record.sweep_id)
    if isinstance(baseline, int):
        return load_sweep(session, baseline)
    return baseline

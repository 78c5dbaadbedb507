"""Which cells a night (or a PR) confirms, and when a confirmation may stop. Pure.

After the night's sweep ran, it is judged once without writing anything; each
comparison against the last good night that is *suspicious*
(:func:`farm.analysis.confirm.suspicious`) asks for its cell to be rerun beside the
last good night's build of the same engine, on the node the cell ran on (a PR's: the
head's build beside the base's, ``engine_map`` naming the candidate's base engine).
The reruns are planned here (:func:`plan_confirmations`), run by the orchestrator,
stored as they land, and the night's one judgement then decides those cells from the
runs (:func:`farm.analysis.compare.compare_sweeps`).

Budget: all confirmations of a night together may take ``budget_s`` device-seconds (a
rerun is taken to cost what the cell's first run did); the most suspicious cells (the
largest drop in units of the key's run-level spread) are confirmed first, a cell that
does not fit with all its reruns gets the pairs that fit (one at least), and the rest
are named in a note. A resumed
night finishes the confirmations it planned: the reruns stored count against the
budget, and a cell whose reruns are complete (or settled early) is not planned again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from farm.analysis.compare import ComparedVariant, SweepComparison
from farm.analysis.confirm import ConfirmRule, rerun_sides, settled
from farm.axes import AxisValue
from farm.frozen import Frozen
from farm.plan import ServerCell
from farm.records import BuildInfo, ConfirmationRun, StoredCell, SweepRecord

__all__ = ["ConfirmPlan", "ConfirmTarget", "confirmation_settled", "plan_confirmations"]


class ConfirmTarget(Frozen):
    """One suspicious variant of a cell: what its reruns are decided with."""

    label: str
    axes: dict[str, AxisValue]
    history_sd: float
    history_nights: int
    floor: float
    drop_sds: float  # its drop in units of the key's run-level spread (the priority)


class ConfirmPlan(Frozen):
    """Rerun ``cell`` (as the night stored it) on ``node`` (None: where Ray places it):
    pairs ``first_run`` to ``runs`` of the night's build (``candidate``) then the last
    good night's (``reference``; a PR's head and base), interleaved."""

    cell: ServerCell
    node: str | None
    candidate: BuildInfo
    reference: BuildInfo
    runs: int
    first_run: int = 1
    targets: tuple[ConfirmTarget, ...]
    cell_device_s: float

    @property
    def cell_id(self) -> str:
        return self.cell.cell_id


def plan_confirmations(
    night: SweepRecord,
    baseline: SweepRecord | None,
    comparison: SweepComparison | None,
    rule: ConfirmRule,
    *,
    engine_map: Mapping[str, str] | None = None,
    reference: str = "last good night",
) -> tuple[tuple[ConfirmPlan, ...], tuple[str, ...]]:
    """The night's confirmations still to run, most suspicious first, within the
    budget; and a note for each suspicious cell that is not confirmed, saying why.
    The reference build is ``baseline``'s build of the cell's engine, renamed by
    ``engine_map`` (candidate engine -> reference engine; a PR's head -> its base);
    ``reference`` names ``baseline`` in a note."""
    if baseline is None or comparison is None or rule.runs < 1:
        return (), ()
    cells = {c.cell.cell_id: c for c in night.cells}
    targets: dict[str, list[ConfirmTarget]] = {}
    for row in comparison.rows:
        stored = cells.get(row.cell_id or "")
        target = _target(row, stored) if stored is not None else None
        if target is not None and row.cell_id is not None:
            targets.setdefault(row.cell_id, []).append(target)
    spent = sum(r.result.device_s for r in night.confirmations)
    allowed = rule.budget_s
    plans: list[ConfirmPlan] = []
    notes: list[str] = []
    order = sorted(targets.items(), key=lambda kv: -max(t.drop_sds for t in kv[1]))
    for cell_id, found in order:
        stored = cells[cell_id]
        result = stored.result
        assert result is not None  # compared, so it ran
        runs = [r for r in night.confirmations if r.cell_id == cell_id]
        done = min(sum(r.side == side for r in runs) for side in ("candidate", "reference"))
        if done >= rule.runs or (done and confirmation_settled(found, runs, rule)):
            continue
        engine = stored.cell.engine
        theirs = (engine_map or {}).get(engine, engine)
        builds = _builds(night, baseline, (engine, theirs), result.node, reference)
        if isinstance(builds, str):
            notes.append(f"{cell_id}: not confirmed: {builds}")
            continue
        cost = 2 * result.device_s
        fit = min(rule.runs - done, int((allowed - spent) // cost) if cost > 0 else rule.runs)
        if fit < 1:
            notes.append(
                f"{cell_id}: not confirmed: the night's confirmation budget "
                f"({rule.budget_s:.0f} device-s) is spent"
            )
            continue
        spent += fit * cost
        plans.append(
            ConfirmPlan(
                cell=stored.cell,
                node=result.node,
                candidate=builds[0],
                reference=builds[1],
                runs=done + fit,
                first_run=done + 1,
                targets=tuple(found),
                cell_device_s=result.device_s,
            )
        )
    return tuple(plans), tuple(notes)


def confirmation_settled(
    targets: Sequence[ConfirmTarget], runs: Sequence[ConfirmationRun], rule: ConfirmRule
) -> bool:
    """Whether every suspicious variant of a cell is decided early by its reruns so
    far (:func:`farm.analysis.confirm.settled`): no further pair is run."""
    for t in targets:
        candidate, reference = rerun_sides(runs, t.axes)
        early = settled(
            candidate,
            reference,
            history_sd=t.history_sd,
            history_nights=t.history_nights,
            floor=t.floor,
            rule=rule,
        )
        if early is None:
            return False
    return True


def _target(row: ComparedVariant, stored: StoredCell) -> ConfirmTarget | None:
    """``row`` (a variant of cell ``stored``) as a variant to confirm, when its first
    run is suspicious."""
    threshold, diff = row.threshold, row.difference
    ran = stored.result.variants if stored.result is not None else ()
    variant = next((v for v in ran if stored.cell.variant_label(v.axes) == row.label), None)
    if not row.suspicious or threshold is None or diff is None or variant is None:
        return None
    return ConfirmTarget(
        label=row.label,
        axes=dict(variant.axes),
        history_sd=threshold.run_sd,
        history_nights=threshold.nights,
        floor=threshold.floor,
        drop_sds=-diff.estimate / threshold.run_sd,
    )


def _builds(
    night: SweepRecord,
    baseline: SweepRecord,
    engines: tuple[str, str],
    node: str | None,
    reference: str,
) -> tuple[BuildInfo, BuildInfo] | str:
    """The night's build of the candidate engine on ``node`` and the baseline's build
    of the reference engine (``engines``), or why a rerun cannot have both."""
    mine = _build_of(night, engines[0], node)
    theirs = _build_of(baseline, engines[1], node)
    if mine is None:
        return f"the night's build of {engines[0]} is not stored"
    if theirs is None:
        return f"sweep {baseline.sweep_id} ({reference}) has no build of {engines[1]}"
    return mine, theirs


def _build_of(sweep: SweepRecord, engine: str, node: str | None) -> BuildInfo | None:
    """``engine``'s build in ``sweep``, the one on ``node`` when there are several."""
    found = [b for b in sweep.builds if b.engine == engine]
    return next((b for b in found if b.node == node), found[0] if found else None)

"""The I/O around `farm bisect`: measure the ends (stored cells of the same build
reused), store the bisection, and run one step after another until the search of
:mod:`farm.workflows.bisect.decide` ends. What is searched, and every refusal that needs no
measurement, is :mod:`farm.workflows.bisect.setup`.

The ends are measured first; a bad end that does not reproduce the drop, or a good end
that shows it, is refused before the bisection is stored (the ends' cells stay in the
store, as measurements, and are reused by the next try).

Each step is stored the moment it finishes; a run of the same bisection (same job,
engine, ends and cells) or ``--resume`` continues from the stored steps and never
measures a finished step again. A step whose build or cell failed is a skip.

A step's workloads with ``sequential`` looks are paired with the good end's stored
requests (the ends themselves run whole): a step stops once it is confirmed below the
good end or bounded within the minimum effect of it, and is judged against both ends on
the prompts it ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from sqlmodel import Session

from farm import store
from farm.analysis.judgement import JudgeRules
from farm.analysis.rules import bisect_rules
from farm.axes import speculates
from farm.builds.cache import MARKER
from farm.builds.venv import plan_builds
from farm.comparable import ComparableKey
from farm.errors import FarmError
from farm.frozen import Frozen
from farm.plan import ServerCell
from farm.records import StoredCell, SweepRecord
from farm.runner import ReferenceRun, reference_runs
from farm.spec import EngineSpec, JobSpec
from farm.store.baselines import cells_of_build
from farm.store.bisections import (
    add_counts,
    create_bisection,
    find_bisection,
    finish_bisection,
    get_bisection,
    record_step,
)
from farm.store.summaries import SweepCost, sweep_cost
from farm.workflows.bisect.decide import (
    Bisection,
    BisectStep,
    Commit,
    Endpoint,
    SearchOutcome,
    check_endpoints,
    judge_step,
    max_steps,
)
from farm.workflows.bisect.setup import BisectSetup, bisect_job_name, one_engine_job
from farm.workflows.pr.decide import cell_rule, select_baseline

__all__ = ["BisectRun", "SweepRunner", "run_bisection"]

LineSink = Callable[[str], None]
# Runs one sweep of a derived job (the job, its YAML text, the stored runs its
# sequential looks pair with: none for the ends); returns its sweep id.
SweepRunner = Callable[[JobSpec, str, Mapping[ComparableKey, ReferenceRun]], int]
# Stored cells of a build are reused whatever their age: a commit's cells do not age.
_ANY_AGE = timedelta(days=36500)


class BisectRun(Frozen):
    """What one `farm bisect` run did: the bisection as stored after it, and what this
    run cost (builds made, cells run, wall time, the engine time of its cells) and what
    the steps' sequential looks saved: variants stopped early, and the generation time
    of its sweeps against what they would have taken at the fixed sample."""

    bisection: Bisection
    reused: bool
    builds: int
    cells: int
    wall_s: float
    engine_s: float
    stopped_early: int = 0
    generation_s: float = 0.0
    fixed_generation_s: float = 0.0

    def looks_saved(self) -> str:
        """``3 variant(s) stopped early by their looks: generation 41 s vs 86 s at the
        fixed sample (0.48x)``, or "" when none did."""
        if not self.stopped_early or not self.fixed_generation_s:
            return ""
        return (
            f"{self.stopped_early} variant(s) stopped early by their looks: generation "
            f"{_span(self.generation_s)} vs {_span(self.fixed_generation_s)} at the fixed "
            f"sample ({self.generation_s / self.fixed_generation_s:.2f}x)"
        )


def _span(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 600 else f"{seconds:.0f} s"


# --- measuring ----------------------------------------------------------------------


class _Measured(Frozen):
    record: SweepRecord | None
    build_id: str | None
    sweep_ids: tuple[int, ...] = ()
    # (sweep id, stored cell) of each cell measured: what a step's looks pair with
    cells: tuple[tuple[int, StoredCell], ...] = ()
    ran_sweep: int | None = None
    cells_run: int = 0
    built: bool = False
    engine_s: float = 0.0
    error: str = ""


def _engine_s(cells: Sequence[StoredCell]) -> float:
    return sum(
        (c.result.startup_s or 0.0) + (c.result.generation_s or 0.0)
        for c in cells
        if c.result is not None
    )


class _Bisector:
    def __init__(
        self,
        setup: BisectSetup,
        db_url: str,
        runner: SweepRunner,
        cache_dir: Path,
        say: LineSink,
        rules: JudgeRules,
    ) -> None:
        self.setup = setup
        self.db = store.open_store(db_url)
        self.runner = runner
        self.cache_dir = cache_dir
        self.say = say
        self.rules = rules
        self.builds = 0
        self.cells = 0
        self.engine_s = 0.0
        self.cost = SweepCost()  # summed over this run's sweeps
        # The good end's variants, once it is measured: what the steps' looks pair with.
        self.references: dict[ComparableKey, ReferenceRun] = {}

    def session(self) -> Session:
        return Session(self.db)

    def step_job(self, engine: EngineSpec, run: Sequence[ServerCell]) -> JobSpec:
        job = one_engine_job(self.setup.job, engine, bisect_job_name(self.setup.job.name))
        wanted = {c.cell_id for c in run}
        cells = (*self.setup.cells, *self.setup.outside)
        skip = tuple(cell_rule(c) for c in cells if c.cell_id not in wanted)
        # The job's spec-off cells are not measured by a bisection: no acceptance.
        depths = getattr(job.axes, "mtp_depth")  # noqa: B009  # a field made from farm.axes
        spec_off = tuple({"mtp_depth": d} for d in depths if not speculates(d))
        return job.model_copy(update={"exclude": job.exclude + skip + spec_off})

    def measure(self, commit: str, cell_ids: Sequence[str]) -> _Measured:
        """The cells ``cell_ids`` at ``commit``: stored ones of the same build reused,
        the rest run in one sweep."""
        engine = self.setup.engine_at(commit)
        [plan] = plan_builds([engine])
        if plan.build_id is None:
            return _Measured(
                record=None, build_id=None, error=f"cannot plan the build: {plan.error}"
            )
        cells = [c for c in self.setup.cells if c.cell_id in set(cell_ids)]
        now = datetime.now(UTC)
        with self.session() as s:
            stored = cells_of_build(s, plan.build_id, engine.name, now - _ANY_AGE)
        selection = select_baseline(cells, stored, plan.build_id, now=now, max_age=_ANY_AGE)
        wanted = {(c.sweep_id, c.cell_id) for c in selection.reused}
        taken = [s for s in stored if (s.sweep_id, s.stored.cell.cell_id) in wanted]
        pairs = [(s.sweep_id, s.stored) for s in taken]
        sweeps = [s.sweep_id for s in taken]
        ran, built, engine_s = None, False, 0.0
        if selection.missing:
            marker = self.cache_dir / "builds" / plan.build_id / MARKER
            built = not marker.exists()
            run = [c for c in cells if c.cell_id in set(selection.missing)]
            job = self.step_job(engine, run)
            text = f"# farm bisect: {self.setup.job.name} at {commit}\n" + yaml.safe_dump(
                job.model_dump(mode="json", exclude={"base_dir"}), sort_keys=False
            )
            ran = self.runner(job, text, self.references)
            with self.session() as s:
                record = store.load_sweep(s, ran)
                self._add_cost(sweep_cost(s, ran))
            new = [c for c in record.cells if c.cell.cell_id in set(selection.missing)]
            pairs += [(ran, c) for c in new]
            sweeps.append(ran)
            engine_s = _engine_s(new)
            # A cell whose build failed never reached an engine: not a cell run.
            self.cells += sum(c.result is None or c.result.status != "build_failed" for c in new)
            self.builds += int(built)
            self.engine_s += engine_s
        base = (
            record
            if ran is not None
            else SweepRecord(
                sweep_id=sweeps[0],
                job=bisect_job_name(self.setup.job.name),
                started_at=now,
                status="ok",
            )
        )
        merged = base.model_copy(update={"cells": tuple(c for _, c in pairs)})
        return _Measured(
            record=merged,
            build_id=plan.build_id,
            sweep_ids=tuple(dict.fromkeys(sweeps)),
            cells=tuple(pairs),
            ran_sweep=ran,
            cells_run=len(selection.missing),
            built=built,
            engine_s=engine_s,
        )

    def _add_cost(self, cost: SweepCost) -> None:
        c = self.cost
        self.cost = c.model_copy(
            update={
                "stopped_early": c.stopped_early + cost.stopped_early,
                "generation_s": c.generation_s + cost.generation_s,
                "fixed_generation_s": (c.fixed_generation_s or 0.0)
                + (cost.fixed_generation_s or cost.generation_s),
            }
        )

    def end_record(self, end: Endpoint, name: str, cell_ids: Sequence[str]) -> _Measured:
        """An end's regressed cells: stored ones of its build (run again only when
        they were pruned)."""
        measured = self.measure(end.commit, cell_ids)
        if measured.record is None:
            raise FarmError(f"the {name} end {end.commit[:12]}: {measured.error}")
        return measured

    def pair_steps_with(self, good: _Measured, regressed: set[str]) -> None:
        self.references = reference_runs(p for p in good.cells if p[1].cell.cell_id in regressed)


def _say_step(
    say: LineSink, number: int, commits: Sequence[Commit], step: BisectStep, reused: bool
) -> None:
    commit = commits[step.position]
    where = f"[{step.position}/{len(commits) - 1}]"
    figures = "; ".join(
        f"{j.figures.label}: AL {j.figures.al:.3f}"
        + (
            f" per position {', '.join(f'{p:.2f}' for p in j.figures.per_position)}"
            if j.figures.per_position
            else ""
        )
        + f" ({j.note})"
        + (f" [{j.figures.looks}]" if j.figures.looks else "")
        for j in step.judgements
        if j.figures.al is not None
    )
    how = "stored" if reused else f"sweep {step.sweep_id}" if step.sweep_id else "not run"
    say(
        f"step {number} {where} {commit.describe()}: {step.verdict.upper()} ({how})"
        + (f" {figures}" if figures else "")
        + (f" - {step.reason}" if step.reason else "")
    )


def run_bisection(
    setup: BisectSetup,
    *,
    db_url: str,
    runner: SweepRunner,
    cache_dir: Path,
    say: LineSink,
    resume: int | None = None,
) -> BisectRun:
    """Measure the ends (unless stored), store the bisection, and run its steps until
    the search ends; each step is stored when it finishes.

    ``resume``: the id of a stored bisection to continue (it must be this one).
    Raises FarmError for ends that do not show the drop (nothing about the bisection
    is stored then) or a bisection that is not this one.
    """
    started = time.monotonic()
    work = _Bisector(setup, db_url, runner, cache_dir, say, bisect_rules())
    stored = _stored(work, resume)
    commits = setup.commits
    if stored is not None:
        bisection = stored
        say(
            f"bisection {bisection.id}: {len(bisection.steps)} stored step(s) reused, "
            f"{bisection.status}"
        )
        regressed_cells = sorted(set(bisection.regressed.values()))
        good_m = work.end_record(bisection.good, "good", regressed_cells)
        bad_m = work.end_record(bisection.bad, "bad", regressed_cells)
        assert good_m.record is not None and bad_m.record is not None
        good_rec, bad_rec = good_m.record, bad_m.record
    else:
        bisection, good_m, good_rec, bad_rec = _start(work)
    work.pair_steps_with(good_m, set(bisection.regressed.values()))
    assert bisection.id is not None
    noun = "release" if commits[0].release else "commit"
    say(
        f"bisection {bisection.id}: {len(commits) - 1} candidate {noun}(s), "
        f"{len(bisection.regressed)} regressed variant(s) in "
        f"{len(set(bisection.regressed.values()))} cell(s); "
        f"at most {max_steps(len(commits))} step(s) plus one per skip"
    )
    for number, step in enumerate(bisection.steps, 1):
        _say_step(say, number, commits, step, reused=True)
    while (outcome := bisection.outcome()).status == "running":
        assert outcome.next is not None
        step = _step(work, bisection, outcome.next, good_rec, bad_rec)
        with work.session() as s:
            step, _ = record_step(s, bisection.id, step)
        bisection = bisection.model_copy(update={"steps": (*bisection.steps, step)})
        _say_step(say, len(bisection.steps), commits, step, reused=False)
    return _finish(work, bisection, outcome, started, reused=stored is not None)


def _stored(work: _Bisector, resume: int | None) -> Bisection | None:
    """The stored bisection to continue: ``resume``'s, else the one of the same key."""
    key = work.setup.key
    with work.session() as s:
        stored = (
            get_bisection(s, resume, "--resume") if resume is not None else find_bisection(s, key)
        )
    if resume is not None and stored is not None and stored.key != key:
        raise FarmError(
            f"--resume {resume}: bisection {resume} searched {stored.engine} from "
            f"{stored.good.commit[:12]} to {stored.bad.commit[:12]} over other cells; "
            "give the same job, engine and ends (or none: they are taken from it)"
        )
    return stored


def _measure_ends(work: _Bisector) -> tuple[_Measured, _Measured]:
    """Every planned cell at both ends (stored cells of their builds reused)."""
    commits = work.setup.commits
    noun = "release" if commits[0].release else "commit"
    work.say(f"{len(commits) - 1} {noun}(s) after the good end; measuring the ends first")
    all_cells = [c.cell_id for c in work.setup.cells]
    ends = work.measure(commits[0].sha, all_cells), work.measure(commits[-1].sha, all_cells)
    for m, name, commit in zip(ends, ("good", "bad"), (commits[0], commits[-1]), strict=True):
        if m.record is None:
            raise FarmError(f"the {name} end: {m.error}")
        work.say(
            f"{name} end {commit.describe()}: "
            + (f"cells from sweep(s) {', '.join(map(str, m.sweep_ids))}" if m.sweep_ids else "")
            + (" (stored)" if m.ran_sweep is None else "")
        )
    return ends


def _only(record: SweepRecord, cells: set[str]) -> SweepRecord:
    return record.model_copy(
        update={"cells": tuple(c for c in record.cells if c.cell.cell_id in cells)}
    )


def _start(work: _Bisector) -> tuple[Bisection, _Measured, SweepRecord, SweepRecord]:
    """Measure the ends, find the regressed variants, store the new bisection; it, the
    good end as measured and the ends' records of the regressed cells (only they matter
    from here on)."""
    setup, commits = work.setup, work.setup.commits
    good_m, bad_m = _measure_ends(work)
    assert good_m.record is not None and bad_m.record is not None
    assert good_m.build_id is not None and bad_m.build_id is not None
    check = check_endpoints(
        good_m.record,
        bad_m.record,
        good_ref=commits[0].sha[:12],
        bad_ref=commits[-1].sha[:12],
        rules=work.rules,
    )
    good_rec, bad_rec = (
        _only(good_m.record, set(check.cells)),
        _only(bad_m.record, set(check.cells)),
    )
    draft = Bisection(
        key=setup.key,
        job=setup.job.name,
        engine=setup.engine.name,
        overlay=setup.overlay,
        repo=setup.repo,
        commits=commits,
        planned_cells=tuple(c.cell_id for c in setup.cells),
        regressed=check.regressed,
        good=Endpoint(
            commit=commits[0].sha,
            build_id=good_m.build_id,
            sweep_ids=good_m.sweep_ids,
            figures=check.good,
            engine_s=_engine_s(good_rec.cells),
        ),
        bad=Endpoint(
            commit=commits[-1].sha,
            build_id=bad_m.build_id,
            sweep_ids=bad_m.sweep_ids,
            figures=check.bad,
            engine_s=_engine_s(bad_rec.cells),
        ),
    )
    with work.session() as s:
        bisection, _ = create_bisection(s, draft)
    for row in check.rows:
        work.say(f"regressed: {row.label}: AL {row.baseline_al} -> {row.candidate_al}")
    return bisection, good_m, good_rec, bad_rec


def _step(
    work: _Bisector,
    bisection: Bisection,
    position: int,
    good_rec: SweepRecord,
    bad_rec: SweepRecord,
) -> BisectStep:
    """Measure the regressed cells at the commit at ``position`` and judge them against
    both ends (``skip`` when they could not be measured)."""
    commit = work.setup.commits[position]
    measured = work.measure(commit.sha, sorted(set(bisection.regressed.values())))
    if measured.record is None:
        return BisectStep(
            position=position, commit=commit.sha, verdict="skip", reason=measured.error
        )
    verdict, judged, reason = judge_step(
        measured.record, good_rec, bad_rec, bisection.regressed, work.rules
    )
    return BisectStep(
        position=position,
        commit=commit.sha,
        build_id=measured.build_id,
        sweep_id=measured.ran_sweep or (measured.sweep_ids[0] if measured.sweep_ids else None),
        verdict=verdict,
        judgements=judged,
        reason=reason,
        engine_s=_engine_s(measured.record.cells),
    )


def _finish(
    work: _Bisector, bisection: Bisection, outcome: SearchOutcome, started: float, *, reused: bool
) -> BisectRun:
    """Store the answer and this run's costs; the bisection as stored after them."""
    assert bisection.id is not None
    wall = time.monotonic() - started
    with work.session() as s:
        if bisection.status == "running":
            finish_bisection(s, bisection.id, outcome)
        add_counts(s, bisection.id, builds=work.builds, cells=work.cells, wall_s=wall)
        bisection = get_bisection(s, bisection.id)
    work.db.dispose()
    return BisectRun(
        bisection=bisection,
        reused=reused,
        builds=work.builds,
        cells=work.cells,
        wall_s=wall,
        engine_s=work.engine_s,
        stopped_early=work.cost.stopped_early,
        generation_s=work.cost.generation_s,
        fixed_generation_s=work.cost.fixed_generation_s or 0.0,
    )

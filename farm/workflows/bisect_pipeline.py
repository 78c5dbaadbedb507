"""The I/O around `farm bisect`: list the candidate commits with git (or the releases
of a PyPI source with pip), measure the ends (stored cells of the same build reused),
store the bisection, and run one step after another until the search of
:mod:`farm.workflows.bisect` ends.

What is searched is :func:`bisected_part` of the engine: a git overlay, else the
engine's own git source, else a PyPI overlay, else the engine's own PyPI release. A
step at a release builds that release: a cold build of the engine package, or a
layered build of the overlay on the cached base.

Everything that can refuse a bisection without measuring (an engine the job lacks, a
source that is neither git nor PyPI, refs or releases that do not exist, ends swapped
in the history or in version order, a range with nothing between the ends) is checked
by :func:`prepare_bisect` before anything is written. The
ends are measured next; a bad end that does not reproduce the drop, or a good end that
shows it, is refused before the bisection is stored (the ends' cells stay in the
store, as measurements, and are reused by the next try).

Each step is stored the moment it finishes; a run of the same bisection (same job,
engine, ends and cells) or ``--resume`` continues from the stored steps and never
measures a finished step again. A step whose build or cell failed is a skip.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict
from sqlmodel import Session

from farm import store
from farm.analysis.verdicts import CheckConfig
from farm.builds.cache import MARKER
from farm.builds.history import first_parent_commits, history_repository
from farm.builds.sources import list_releases
from farm.builds.venv import plan_builds
from farm.errors import FarmError
from farm.plan import ServerCell
from farm.records import BuildInfo, StoredCell, SweepRecord
from farm.spec import BuildSource, EngineSpec, GitSource, JobSpec, PullRequestSource
from farm.store.baselines import cells_of_build
from farm.store.bisections import (
    add_counts,
    create_bisection,
    find_bisection,
    finish_bisection,
    get_bisection,
    record_step,
)
from farm.sweep import plan_job
from farm.workflows.bisect import (
    Bisection,
    BisectStep,
    Commit,
    Endpoint,
    check_endpoints,
    check_release_ends,
    commit_of_source,
    judge_step,
    max_steps,
    release_of_source,
    releases_between,
)
from farm.workflows.pr import (
    cell_rule,
    replaced_overlay,
    replaced_source,
    select_baseline,
    with_replaced_source,
)

__all__ = [
    "BisectRun",
    "BisectSetup",
    "BisectedPart",
    "SweepRunner",
    "bisect_job_name",
    "bisected_part",
    "job_engine",
    "prepare_bisect",
    "run_bisection",
]

LineSink = Callable[[str], None]
# Runs one sweep of a derived job (the job, its YAML text); returns its sweep id.
SweepRunner = Callable[[JobSpec, str], int]
# Stored cells of a build are reused whatever their age: a commit's cells do not age.
_ANY_AGE = timedelta(days=36500)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BisectedPart(_Frozen):
    """The part of an engine a bisection searches: ``overlay`` (a package) or the
    engine itself (None), its ``package`` and whether its candidates are git commits
    or PyPI releases."""

    overlay: str | None
    package: str
    kind: Literal["git", "pypi"]
    source: BuildSource

    def ref_of(self, build: BuildInfo) -> str | None:
        """The commit or release of this part a build of the engine recorded, or None."""
        if self.kind == "git":
            return commit_of_source(build.source, self.overlay)
        if self.overlay is None:
            return build.version if build.package == self.package else None
        return release_of_source(build.source, self.package)


def bisected_part(engine: EngineSpec) -> BisectedPart:
    """What `farm bisect` searches in ``engine``: the first overlay with a git source,
    else the engine's own git source, else the first overlay from PyPI, else the
    engine's own PyPI release. Raises FarmError when it is none of these (a wheel or
    a tree has no history to search)."""
    overlay = replaced_overlay(engine)
    source = replaced_source(engine)
    if isinstance(source, GitSource | PullRequestSource):
        return BisectedPart(
            overlay=overlay, package=overlay or engine.package, kind="git", source=source
        )
    pypi = next((o for o in engine.overlays if o.source.kind == "pypi"), None)
    if pypi is not None:
        return BisectedPart(
            overlay=pypi.package, package=pypi.package, kind="pypi", source=pypi.source
        )
    if engine.source.kind == "pypi":
        return BisectedPart(overlay=None, package=engine.package, kind="pypi", source=engine.source)
    raise FarmError(
        f"engine {engine.name} comes from a {engine.source.kind} source and has no git or "
        "PyPI overlay: farm bisect searches the commits of a git source or the releases "
        "of a PyPI package"
    )


class BisectSetup(_Frozen):
    """What a bisection searches: the job's engine, the repository (or package index),
    the candidates (commits or releases, oldest first, good .. bad) and the planned
    spec-on cells."""

    job: JobSpec
    engine: EngineSpec
    overlay: str | None
    repo: str
    commits: tuple[Commit, ...]
    cells: tuple[ServerCell, ...]
    # The engine's other speculative cells (outside --only): no step may run them.
    outside: tuple[ServerCell, ...] = ()

    @property
    def key(self) -> str:
        """Same job, engine, ends and cells: the same bisection."""
        payload = {
            "job": self.job.name,
            "engine": self.engine.name,
            "overlay": self.overlay,
            "good": self.commits[0].sha,
            "bad": self.commits[-1].sha,
            "cells": sorted(c.cell_id for c in self.cells),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]

    def engine_at(self, commit: str) -> EngineSpec:
        """The engine with the bisected part at ``commit`` (a commit id, or a version
        when the candidates are releases); same name: the cells of every commit share
        their cell ids, builds tell them apart."""
        if self.commits[0].release:
            return _at_release(self.engine, self.overlay, commit)
        current = replaced_source(self.engine)
        assert isinstance(current, GitSource | PullRequestSource)
        source = GitSource(
            kind="git",
            repo=current.repo,
            mirror=current.mirror,
            subdirectory=current.subdirectory,
            ref=commit,
        )
        return with_replaced_source(self.engine, source)


class BisectRun(_Frozen):
    """What one `farm bisect` run did: the bisection as stored after it, and what this
    run cost (builds made, cells run, wall time, the engine time of its cells)."""

    bisection: Bisection
    reused: bool
    builds: int
    cells: int
    wall_s: float
    engine_s: float


def bisect_job_name(job: str) -> str:
    """The sweeps of a bisection: apart from the job's own, so nightly history and the
    last good night never see them."""
    return f"{job}-bisect"


def _at_release(engine: EngineSpec, overlay: str | None, version: str) -> EngineSpec:
    """``engine`` with ``overlay`` (or the engine package itself) at release ``version``."""
    if overlay is None:
        update: dict[str, Any] = {"version": version}
    else:
        update = {
            "overlays": tuple(
                o.model_copy(update={"version": version}) if o.package == overlay else o
                for o in engine.overlays
            )
        }
    return EngineSpec.model_validate(engine.model_copy(update=update).model_dump())


# --- setup --------------------------------------------------------------------------


def _one_engine_job(job: JobSpec, engine: EngineSpec, name: str) -> JobSpec:
    """``job`` with ``engine`` only (rules about other engines dropped), named ``name``."""

    def keep(rules: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        return tuple(r for r in rules if r.get("engine", engine.name) == engine.name)

    return job.model_copy(
        update={
            "name": name,
            "engines": (engine,),
            "include": keep(job.include),
            "exclude": keep(job.exclude),
        }
    )


def job_engine(job: JobSpec, name: str) -> EngineSpec:
    """The engine ``--engine name`` of ``job``; FarmError naming the job's engines."""
    engine = next((e for e in job.engines if e.name == name), None)
    if engine is None:
        names = ", ".join(e.name for e in job.engines)
        raise FarmError(f"--engine {name}: job {job.name} has no such engine ({names})")
    return engine


def prepare_bisect(
    job: JobSpec,
    engine_name: str,
    good_ref: str,
    bad_ref: str,
    only: dict[str, str],
    cache_dir: Path,
) -> BisectSetup:
    """Find what to bisect; nothing is built, run or written. Raises FarmError."""
    engine = job_engine(job, engine_name)
    if "engine" in only:
        raise FarmError("--only engine=...: farm bisect runs the engine --engine names")
    part = bisected_part(engine)
    if part.kind == "pypi":
        # Checked before asking the index: ends that are no versions, or in the wrong
        # order, are refused without a listing.
        check_release_ends(part.package, good_ref, bad_ref)
        commits = releases_between(part.package, list_releases(part.package), good_ref, bad_ref)
        location = "the package index"
    else:
        source = part.source
        assert isinstance(source, GitSource | PullRequestSource)
        location = (
            source.mirror if source.mirror and Path(source.mirror).exists() else source.repo or ""
        )
        repo, remote = history_repository(source, cache_dir, (good_ref, bad_ref))
        commits = tuple(
            Commit.of(sha, subject)
            for sha, subject in first_parent_commits(repo, good_ref, bad_ref, remote=remote)
        )
    overlay = part.overlay
    planned = plan_job(_one_engine_job(job, engine, job.name), only)
    cells = tuple(c for c in planned.cells if c.mtp_depth > 0)
    if not cells:
        raise FarmError(
            "no speculative cell to bisect: the job (and --only) select no cell with mtp_depth > 0"
        )
    chosen = {c.cell_id for c in cells}
    every = plan_job(_one_engine_job(job, engine, job.name)).cells if only else ()
    setup = BisectSetup(
        job=job,
        engine=engine,
        overlay=overlay,
        repo=location,
        commits=commits,
        cells=cells,
        outside=tuple(c for c in every if c.mtp_depth > 0 and c.cell_id not in chosen),
    )
    for end in (commits[0], commits[-1]):
        [plan] = plan_builds([setup.engine_at(end.sha)])
        if plan.build_id is None:
            raise FarmError(f"the build at {end.sha[:12]} cannot be planned: {plan.error}")
    return setup


# --- measuring ----------------------------------------------------------------------


class _Measured(_Frozen):
    record: SweepRecord | None
    build_id: str | None
    sweep_ids: tuple[int, ...] = ()
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
        config: CheckConfig,
    ) -> None:
        self.setup = setup
        self.db = store.open_store(db_url)
        self.runner = runner
        self.cache_dir = cache_dir
        self.say = say
        self.config = config
        self.builds = 0
        self.cells = 0
        self.engine_s = 0.0

    def session(self) -> Session:
        return Session(self.db)

    def step_job(self, engine: EngineSpec, run: Sequence[ServerCell]) -> JobSpec:
        job = _one_engine_job(self.setup.job, engine, bisect_job_name(self.setup.job.name))
        wanted = {c.cell_id for c in run}
        cells = (*self.setup.cells, *self.setup.outside)
        skip = tuple(cell_rule(c) for c in cells if c.cell_id not in wanted)
        # Speed-off cells of the job (mtp_depth 0) are not measured by a bisection.
        return job.model_copy(update={"exclude": job.exclude + skip + ({"mtp_depth": 0},)})

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
        got = [s.stored for s in taken]
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
            ran = self.runner(job, text)
            with self.session() as s:
                record = store.load_sweep(s, ran)
            new = [c for c in record.cells if c.cell.cell_id in set(selection.missing)]
            got += new
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
        merged = base.model_copy(update={"cells": tuple(got)})
        return _Measured(
            record=merged,
            build_id=plan.build_id,
            sweep_ids=tuple(dict.fromkeys(sweeps)),
            ran_sweep=ran,
            cells_run=len(selection.missing),
            built=built,
            engine_s=engine_s,
        )

    def end_record(self, end: Endpoint, name: str, cell_ids: Sequence[str]) -> SweepRecord:
        """An end's regressed cells: stored ones of its build (run again only when
        they were pruned)."""
        measured = self.measure(end.commit, cell_ids)
        if measured.record is None:
            raise FarmError(f"the {name} end {end.commit[:12]}: {measured.error}")
        return measured.record


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
    config: CheckConfig | None = None,
) -> BisectRun:
    """Measure the ends (unless stored), store the bisection, and run its steps until
    the search ends; each step is stored when it finishes.

    ``resume``: the id of a stored bisection to continue (it must be this one).
    Raises FarmError for ends that do not show the drop (nothing about the bisection
    is stored then) or a bisection that is not this one.
    """
    started = time.monotonic()
    cfg = config or CheckConfig()
    work = _Bisector(setup, db_url, runner, cache_dir, say, cfg)
    with work.session() as s:
        stored = get_bisection(s, resume) if resume is not None else find_bisection(s, setup.key)
    if resume is not None and stored is not None and stored.key != setup.key:
        raise FarmError(
            f"--resume {resume}: bisection {resume} searched {stored.engine} from "
            f"{stored.good.commit[:12]} to {stored.bad.commit[:12]} over other cells; "
            "give the same job, engine and ends (or none: they are taken from it)"
        )
    commits = setup.commits
    noun = "release" if commits[0].release else "commit"
    if stored is not None:
        bisection = stored
        say(
            f"bisection {bisection.id}: {len(bisection.steps)} stored step(s) reused, "
            f"{bisection.status}"
        )
        regressed_cells = sorted(set(bisection.regressed.values()))
        good_rec = work.end_record(bisection.good, "good", regressed_cells)
        bad_rec = work.end_record(bisection.bad, "bad", regressed_cells)
    else:
        say(f"{len(commits) - 1} {noun}(s) after the good end; measuring the ends first")
        all_cells = [c.cell_id for c in setup.cells]
        good_m = work.measure(commits[0].sha, all_cells)
        bad_m = work.measure(commits[-1].sha, all_cells)
        for m, name in ((good_m, "good"), (bad_m, "bad")):
            if m.record is None:
                raise FarmError(f"the {name} end: {m.error}")
            say(
                f"{name} end {commits[0 if name == 'good' else -1].describe()}: "
                + (f"cells from sweep(s) {', '.join(map(str, m.sweep_ids))}" if m.sweep_ids else "")
                + (" (stored)" if m.ran_sweep is None else "")
            )
        assert good_m.record is not None and bad_m.record is not None
        assert good_m.build_id is not None and bad_m.build_id is not None
        good_rec, bad_rec = good_m.record, bad_m.record
        check = check_endpoints(
            good_rec,
            bad_rec,
            good_ref=commits[0].sha[:12],
            bad_ref=commits[-1].sha[:12],
            config=cfg,
        )
        # Only the regressed cells matter from here on.
        keep = set(check.cells)
        good_rec = good_rec.model_copy(
            update={"cells": tuple(c for c in good_rec.cells if c.cell.cell_id in keep)}
        )
        bad_rec = bad_rec.model_copy(
            update={"cells": tuple(c for c in bad_rec.cells if c.cell.cell_id in keep)}
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
            say(f"regressed: {row.label}: AL {row.baseline_al} -> {row.candidate_al}")
    bisection_id = bisection.id
    assert bisection_id is not None
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
        commit = commits[outcome.next]
        measured = work.measure(commit.sha, sorted(set(bisection.regressed.values())))
        if measured.record is None:
            step = BisectStep(
                position=outcome.next, commit=commit.sha, verdict="skip", reason=measured.error
            )
        else:
            verdict, judged, reason = judge_step(
                measured.record, good_rec, bad_rec, bisection.regressed, cfg
            )
            step = BisectStep(
                position=outcome.next,
                commit=commit.sha,
                build_id=measured.build_id,
                sweep_id=measured.ran_sweep
                or (measured.sweep_ids[0] if measured.sweep_ids else None),
                verdict=verdict,
                judgements=judged,
                reason=reason,
                engine_s=_engine_s(measured.record.cells),
            )
        with work.session() as s:
            step, _ = record_step(s, bisection_id, step)
        bisection = bisection.model_copy(update={"steps": (*bisection.steps, step)})
        _say_step(say, len(bisection.steps), commits, step, reused=False)
    wall = time.monotonic() - started
    with work.session() as s:
        if bisection.status == "running":
            finish_bisection(s, bisection_id, outcome)
        add_counts(s, bisection_id, builds=work.builds, cells=work.cells, wall_s=wall)
        bisection = get_bisection(s, bisection_id)
    work.db.dispose()
    return BisectRun(
        bisection=bisection,
        reused=stored is not None,
        builds=work.builds,
        cells=work.cells,
        wall_s=wall,
        engine_s=work.engine_s,
    )

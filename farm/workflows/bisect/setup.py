"""What `farm bisect` searches, found before anything is built, run or written.

What is searched is :func:`bisected_part` of the engine: a git overlay, else the
engine's own git source, else a PyPI overlay, else the engine's own PyPI release. A
step at a release builds that release: a cold build of the engine package, or a
layered build of the overlay on the cached base.

Everything that can refuse a bisection without measuring (an engine the job lacks, a
source that is neither git nor PyPI, refs or releases that do not exist, ends swapped
in the history or in version order, a range with nothing between the ends) is checked
by :func:`prepare_bisect`; the git history is read through the builds' git runner
(:mod:`farm.builds.git_history`), the releases through pip.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from farm.builds.git_history import first_parent_commits, history_repository
from farm.builds.sources import list_releases
from farm.builds.venv import plan_builds
from farm.errors import FarmError
from farm.frozen import Frozen
from farm.inert import untrusted
from farm.orchestrate.driver import plan_job
from farm.plan import ServerCell
from farm.records import BuildInfo
from farm.spec import BuildSource, EngineSpec, GitSource, JobSpec, PullRequestSource
from farm.workflows.bisect.decide import (
    Commit,
    check_release_ends,
    commit_of_source,
    release_of_source,
    releases_between,
)
from farm.workflows.pr.decide import (
    job_engine,
    replaced_overlay,
    replaced_source,
    with_replaced_source,
)

__all__ = [
    "BisectSetup",
    "BisectedPart",
    "bisect_job_name",
    "bisected_part",
    "one_engine_job",
    "prepare_bisect",
]


class BisectedPart(Frozen):
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


class BisectSetup(Frozen):
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


def one_engine_job(job: JobSpec, engine: EngineSpec, name: str) -> JobSpec:
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
    if len(commits) < 3:
        # Adjacent ends: the answer is the bad end itself; nothing to build or measure.
        noun = "releases" if part.kind == "pypi" else "commits"
        raise FarmError(
            f"--good {good_ref} and --bad {bad_ref} are adjacent {noun}: nothing between "
            f"them to bisect (the first bad one is {bad_ref} itself)"
        )
    overlay = part.overlay
    planned = plan_job(one_engine_job(job, engine, job.name), only)
    cells = tuple(c for c in planned.cells if c.speculative)
    if not cells:
        raise FarmError(
            "no speculative cell to bisect: the job (and --only) select no cell with mtp_depth > 0"
        )
    chosen = {c.cell_id for c in cells}
    every = plan_job(one_engine_job(job, engine, job.name)).cells if only else ()
    setup = BisectSetup(
        job=job,
        engine=engine,
        overlay=overlay,
        repo=untrusted(location),  # a job's source URL: its credentials masked here
        commits=commits,
        cells=cells,
        outside=tuple(c for c in every if c.speculative and c.cell_id not in chosen),
    )
    for end in (commits[0], commits[-1]):
        [plan] = plan_builds([setup.engine_at(end.sha)])
        if plan.build_id is None:
            raise FarmError(f"the build at {end.sha[:12]} cannot be planned: {plan.error}")
    return setup

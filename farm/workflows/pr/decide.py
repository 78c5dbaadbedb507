"""A pull request's verdict: the candidate build against the same engine at the PR's base.

Pure: no store, git or HTTP here (:mod:`farm.workflows.pr.steps` does the I/O).

- The *candidate* is the job's engine with one source replaced by the PR head: the
  first overlay with a git source when the engine has one (a vllm-ascend PR on a cached
  vLLM base), else the engine's own source (:func:`candidate_engine`). It is named
  ``<engine>-pr<N>`` so that it runs beside the base in one sweep.
- The *baseline* is the engine as the job names it (the branch PRs target). Its cells
  are reused from the newest stored sweep that ran the same build (same build id) with
  the same comparable key, when they are younger than the age limit
  (:func:`select_baseline`); only the missing ones run, in the PR's sweep, so candidate
  and baseline pair on the same prompts (:func:`pr_job`).
- The verdict (:func:`judge_pr`) is the paired comparison of ``farm compare``
  (:func:`farm.analysis.compare.compare_sweeps`, the rule of the within-sweep checks),
  rendered as one GitHub comment (:func:`render_pr_comment`) and a commit status
  (:func:`commit_status`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from farm.analysis.compare import SweepComparison
from farm.analysis.judgement import GOLDEN_CHECK, NOTHING_COMPARED, PR_CHECK, JudgeRules, judge
from farm.analysis.rules import pr_rules
from farm.axes import SERVER_AXES, AxisValue
from farm.bounds import parse_age as bounded_age
from farm.errors import FarmError
from farm.frozen import Frozen
from farm.plan import ServerCell
from farm.records import StoredCell, SweepRecord
from farm.results.baseline import StoredBaselineCell
from farm.results.verdict import (
    ReusedCell,
    SweepVerdict,
)
from farm.spec import BuildSource, EngineSpec, GitSource, JobSpec, PullRequestSource

__all__ = [
    "PR_CHECK",
    "BaselineSelection",
    "CommitStatus",
    "DroppedPatch",
    "PrJudgement",
    "StoredBaselineCell",
    "candidate_engine",
    "candidate_name",
    "cell_rule",
    "comment_marker",
    "commit_status",
    "git_ref_source",
    "job_engine",
    "judge_pr",
    "parse_age",
    "pr_head_source",
    "pr_job",
    "pr_job_name",
    "replaced_overlay",
    "replaced_source",
    "select_baseline",
    "with_replaced_source",
]

# GitHub truncates a status description beyond this (REST "Create a commit status").
_STATUS_MAX = 140

StatusState = Literal["success", "failure", "error"]
DropReason = Literal["already upstream", "conflict", "not applicable"]


class DroppedPatch(Frozen):
    """A bundled patch of the engine left out of the candidate build, and why."""

    patch_id: str
    reason: DropReason
    detail: str = ""

    def describe(self) -> str:
        return f"{self.patch_id} ({self.reason}{': ' + self.detail if self.detail else ''})"


class BaselineSelection(Frozen):
    """Which base cells are reused (and from where) and which must run."""

    reused: tuple[ReusedCell, ...] = ()
    missing: tuple[str, ...] = ()

    @property
    def sweep_ids(self) -> tuple[int, ...]:
        return tuple(sorted({c.sweep_id for c in self.reused}))


class CommitStatus(Frozen):
    """What ``POST /repos/{o}/{r}/statuses/{sha}`` sends for a verdict."""

    state: StatusState
    description: str


class PrJudgement(Frozen):
    verdict: SweepVerdict
    comparison: SweepComparison


def parse_age(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` as a duration; FarmError otherwise."""
    try:
        return bounded_age(text)
    except ValueError as exc:
        raise FarmError(f"--baseline-max-age {exc}") from None


def candidate_name(engine: str, number: int) -> str:
    """The candidate engine's name in the PR sweep: ``<engine>-pr<N>``."""
    return f"{engine}-pr{number}"


def pr_job_name(job: str, number: int) -> str:
    """The PR sweep's job name: apart from the job's own, so nightly history and the
    last good night never see a PR's sweep."""
    return f"{job}-pr{number}"


def comment_marker(job: str, engine: str) -> str:
    """The hidden line that finds the farm's earlier comment on the PR."""
    return f"<!-- mtp-farm:{job}:{engine} -->"


def replaced_overlay(engine: EngineSpec) -> str | None:
    """The overlay package a PR of ``engine`` replaces: the first overlay with a git
    source (its repository is the one PRs are opened against), else None (the PR
    replaces the engine's own source)."""
    for overlay in engine.overlays:
        if overlay.source.kind in ("git", "pr"):
            return overlay.package
    return None


def _pr_source(current: BuildSource, number: int, where: str) -> PullRequestSource:
    if not isinstance(current, GitSource | PullRequestSource):
        raise FarmError(
            f"{where} comes from a {current.kind} source: there is no repository to fetch "
            f"refs/pull/{number}/head from; give the PR's code with --source (a ref, a tree "
            "or a wheel)"
        )
    return PullRequestSource(
        kind="pr",
        repo=current.repo,
        mirror=current.mirror,
        subdirectory=current.subdirectory,
        number=number,
    )


def pr_head_source(engine: EngineSpec, number: int) -> BuildSource:
    """``refs/pull/N/head`` of the repository of the part a PR replaces."""
    overlay = replaced_overlay(engine)
    if overlay is not None:
        spec = next(o for o in engine.overlays if o.package == overlay)
        return _pr_source(spec.source, number, f"overlay {overlay} of engine {engine.name}")
    return _pr_source(engine.source, number, f"engine {engine.name}")


def job_engine(job: JobSpec, name: str) -> EngineSpec:
    """The engine ``--engine name`` of ``job``; FarmError naming the job's engines."""
    engine = next((e for e in job.engines if e.name == name), None)
    if engine is None:
        names = ", ".join(e.name for e in job.engines)
        raise FarmError(f"--engine {name}: job {job.name} has no such engine ({names})")
    return engine


def replaced_source(engine: EngineSpec) -> BuildSource:
    """The source of the part a PR (or a bisection) replaces: the first overlay with a
    git source (:func:`replaced_overlay`), else the engine's own source."""
    overlay = replaced_overlay(engine)
    if overlay is None:
        return engine.source
    return next(o for o in engine.overlays if o.package == overlay).source


def with_replaced_source(engine: EngineSpec, source: BuildSource, **update: Any) -> EngineSpec:
    """``engine`` with the part a PR replaces built from ``source`` (and ``update``
    applied to the engine's other fields), validated again."""
    overlay = replaced_overlay(engine)
    if overlay is not None:
        update["overlays"] = tuple(
            o.model_copy(update={"source": source}) if o.package == overlay else o
            for o in engine.overlays
        )
    else:
        update["source"] = source
    return EngineSpec.model_validate(engine.model_copy(update=update).model_dump())


def git_ref_source(engine: EngineSpec, ref: str) -> GitSource:
    """``ref`` in the repository of the part a PR replaces (``--source REF``)."""
    current = replaced_source(engine)
    if not isinstance(current, GitSource | PullRequestSource):
        raise FarmError(
            f"--source {ref}: engine {engine.name} has no git repository to find a ref in; "
            "give a tree or a wheel"
        )
    return GitSource(
        kind="git",
        repo=current.repo,
        mirror=current.mirror,
        subdirectory=current.subdirectory,
        ref=ref,
    )


def candidate_engine(
    engine: EngineSpec, number: int, source: BuildSource, patches: tuple[str, ...]
) -> EngineSpec:
    """``engine`` with the part a PR replaces built from ``source``, keeping only
    ``patches`` (those that still apply), named :func:`candidate_name`."""
    return with_replaced_source(
        engine, source, name=candidate_name(engine.name, number), patches=patches
    )


def cell_rule(cell: ServerCell) -> dict[str, AxisValue]:
    """An exclude rule that drops exactly ``cell`` (every server axis named)."""
    return {a.name: cell.axes[a.name] for a in SERVER_AXES if a.name in cell.axes}


def pr_job(
    job: JobSpec,
    base: EngineSpec,
    candidate: EngineSpec,
    number: int,
    reused: Collection[ServerCell] = (),
) -> JobSpec:
    """The PR sweep's job: ``base`` and ``candidate`` only, the job's rules about the
    base engine applied to the candidate too, and the reused base cells excluded."""

    def renamed(rules: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        out = []
        for rule in rules:
            if "engine" in rule and rule["engine"] != base.name:
                continue  # about an engine that is not in the PR sweep
            out.append(rule)
            if rule.get("engine") == base.name:
                out.append(rule | {"engine": candidate.name})
        return tuple(out)

    return job.model_copy(
        update={
            "name": pr_job_name(job.name, number),
            "engines": (base, candidate),
            "include": renamed(job.include),
            "exclude": renamed(job.exclude) + tuple(cell_rule(c) for c in reused),
        }
    )


def _variant_keys(cell: ServerCell) -> set[str]:
    return {cell.variant_key(v.axes).fingerprint for v in cell.variants}


def _usable(stored: StoredCell) -> bool:
    result = stored.result
    return result is not None and result.status == "ok"


def select_baseline(
    planned: Sequence[ServerCell],
    stored: Sequence[StoredBaselineCell],
    build_id: str | None,
    *,
    now: datetime,
    max_age: timedelta,
) -> BaselineSelection:
    """Which ``planned`` base cells can be taken from ``stored`` cells.

    A planned cell is reused from the newest sweep that holds a cell which ran the
    same build (``build_id``), ended ok no longer than ``max_age`` before ``now``,
    has the same cell id and measured every comparable key (fingerprint) the planned
    cell measures. Every other planned cell is ``missing`` (it runs). Without a build
    id (the base cannot be identified) nothing is reused.
    """
    reused: list[ReusedCell] = []
    missing: list[str] = []
    newest_first = sorted(stored, key=lambda s: -s.sweep_id)
    for cell in planned:
        wanted = _variant_keys(cell)
        found = None
        for s in newest_first if build_id is not None else ():
            result = s.stored.result
            if (
                s.build_id != build_id
                or s.stored.cell.cell_id != cell.cell_id
                or not _usable(s.stored)
                or result is None
                or result.finished_at < now - max_age
            ):
                continue
            ran = {s.stored.cell.variant_key(v.axes).fingerprint for v in result.variants}
            if wanted <= ran:
                found = s
                break
        if found is None:
            missing.append(cell.cell_id)
        else:
            reused.append(
                ReusedCell(sweep_id=found.sweep_id, cell_id=cell.cell_id, build_id=build_id)
            )
    return BaselineSelection(reused=tuple(reused), missing=tuple(missing))


def judge_pr(
    sweep: SweepRecord,
    *,
    base: str,
    candidate: str,
    reused: Sequence[StoredBaselineCell],
    job: str,
    number: int,
    head_sha: str | None = None,
    dropped: Sequence[DroppedPatch] = (),
    rules: JudgeRules | None = None,
) -> PrJudgement:
    """The verdict on PR sweep ``sweep``: every candidate cell against the same
    comparable cell of the base, taken from ``reused`` stored cells or from the base
    cells this sweep ran (:func:`farm.analysis.judgement.judge`, no within-sweep or
    history checks), and the candidate's variants against the job's ``goldens``.
    ``job`` is the job file's name (the verdict's ``engine`` is ``base``). Failed
    cells of either side are findings of source ``cells``. ``rules``: the PR's
    (:func:`farm.analysis.rules.pr_rules`, the ones its fail-fast judged by: the
    job's goldens, and the keys flaky in its nightly history, shown and failing no PR).
    """
    base_cells = [s for s in sweep.cells if s.cell.engine == base]
    cand_cells = [s for s in sweep.cells if s.cell.engine == candidate]
    taken = [r.stored for r in reused]
    baseline = sweep.model_copy(
        update={"cells": tuple(taken) + tuple(base_cells), "job": f"{job} at the base"}
    )
    cand = sweep.model_copy(update={"cells": tuple(cand_cells)})
    rules = rules or pr_rules(candidate=candidate, base=base)
    judgement = judge(cand, baseline, None, rules)
    assert judgement.comparison is not None
    notes = (*judgement.notes, *(f"patch dropped: {d.describe()}" for d in dropped))
    verdict = judgement.verdict(
        "pr",
        notes=tuple(dict.fromkeys(notes)),
        baseline_sweep_ids=tuple(sorted({r.sweep_id for r in reused})),
        reused_cells=tuple(
            ReusedCell(sweep_id=r.sweep_id, cell_id=r.stored.cell.cell_id, build_id=r.build_id)
            for r in reused
        ),
        engine=base,
        pr_number=number,
        head_sha=head_sha,
    )
    return PrJudgement(verdict=verdict, comparison=judgement.comparison)


def commit_status(verdict: SweepVerdict) -> CommitStatus:
    """``success`` (clean), ``failure`` (regression) or ``error`` (cells failed, so the
    PR could not be judged), with a one-line description of at most 140 characters."""
    missed = sum(f.check == GOLDEN_CHECK for f in verdict.regressions)
    regressions = len(verdict.regressions) - missed
    compared = verdict.comparisons
    reused = len(verdict.reused_cells)
    if verdict.outcome == "regression":
        state: StatusState = "failure"
        said = []
        if regressions:
            said.append(f"AL regressed in {regressions} of {compared} compared variant(s)")
        if missed:
            said.append(f"{missed} golden position(s) missed")
        text = "; ".join(said)
    elif any(f.check == NOTHING_COMPARED for f in verdict.findings):
        state = "error"
        text = "nothing compared: no candidate variant had a comparable base variant"
    elif verdict.outcome == "failed_cells":
        state = "error"
        text = f"{len(verdict.findings)} cell(s) failed; no AL regression among the rest"
    else:
        state = "success"
        text = f"no AL regression in {compared} compared variant(s)"
    text += f"; sweep {verdict.sweep_id}" + (f", {reused} base cell(s) reused" if reused else "")
    if len(text) > _STATUS_MAX:
        text = text[: _STATUS_MAX - 3] + "..."
    return CommitStatus(state=state, description=text)

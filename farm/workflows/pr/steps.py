"""The I/O around a PR run: resolve the PR head and the base, check the bundled
patches against the head, find the stored baseline, judge the sweep once, and tell
GitHub (one comment per PR and job, updated; a commit status on the head).

Everything that can refuse the run (an engine the job does not have, a PR without
``refs/pull/N/head``, ``--base merge-base`` without a git base or a common commit, a
base that cannot be identified when its cells must run, GitHub refusing the token) is
checked by :func:`prepare_pr` and :func:`plan_baseline` before the sweep is created, so
bad input writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from packaging.utils import canonicalize_name
from pydantic import ValidationError
from sqlmodel import Session

from farm.analysis.confirm import ConfirmRule
from farm.analysis.judgement import JudgeRules
from farm.analysis.noise import NoiseRule
from farm.analysis.rules import pr_rules
from farm.builds.git_history import changed_paths, merge_base
from farm.builds.patches import PatchError, check_patch
from farm.builds.series import Patch, Target
from farm.builds.sources import ResolvedSource, SourceError, installable, resolve_source
from farm.builds.venv import patches_of, plan_builds
from farm.errors import FarmError
from farm.frozen import Frozen
from farm.notify.github import GitHubClient, GitHubError, PullRequestRef
from farm.plan import ServerCell
from farm.report.pr_comment import render_pr_comment
from farm.spec import (
    BuildSource,
    EngineSpec,
    GitSource,
    JobSpec,
    PullRequestSource,
    TreeSource,
    WheelSource,
)
from farm.spec.goldens import GoldenCheck
from farm.store.baselines import cells_of_build
from farm.store.cells import load_sweep
from farm.store.summaries import SweepCost, sweep_cost
from farm.store.verdicts import record_verdict
from farm.workflows.nightly.spread import job_key_noise
from farm.workflows.nightly.steps import flaky_keys
from farm.workflows.pr.decide import (
    BaselineSelection,
    DroppedPatch,
    PrJudgement,
    StoredBaselineCell,
    candidate_engine,
    comment_marker,
    commit_status,
    git_ref_source,
    job_engine,
    judge_pr,
    pr_head_source,
    replaced_overlay,
    replaced_source,
    select_baseline,
    with_replaced_source,
)

__all__ = [
    "BaseAt",
    "PrBaseline",
    "PrCheck",
    "PrSetup",
    "check_pr",
    "plan_baseline",
    "prepare_pr",
    "publish_pr",
    "report_name",
    "source_argument",
    "write_pr_report",
]

LineSink = Callable[[str], None]
# What the candidate is compared with: the tip of the base's branch as the job names
# it, or the commit the PR branched from (`git merge-base`, GitHub's base of the diff).
BaseAt = Literal["branch", "merge-base"]


class PrSetup(Frozen):
    """What a PR run builds: the base and candidate engines and their build ids."""

    job: str
    number: int
    base: EngineSpec
    candidate: EngineSpec
    base_build_id: str | None
    base_error: str | None = None
    candidate_build_id: str | None
    candidate_label: str
    base_label: str
    head_sha: str | None
    dropped: tuple[DroppedPatch, ...] = ()
    # The files the PR changes (git diff base...head), when both ends are git refs.
    touched: tuple[str, ...] = ()


class PrBaseline(Frozen):
    selection: BaselineSelection
    reused: tuple[StoredBaselineCell, ...] = ()


class PrCheck(Frozen):
    """What one check of a PR sweep did; ``judged`` False when its verdict was stored
    before (by an earlier check of the same sweep)."""

    judgement: PrJudgement
    judged: bool
    comment: str
    cost: SweepCost | None = None


def source_argument(engine: EngineSpec, value: str) -> BuildSource:
    """``--source``: a wheel file, a source tree (a folder), or a ref of the repository
    the PR replaces. FarmError for an empty value (not "the current folder") or a ref
    the repository's source cannot take."""
    if not value.strip():
        raise FarmError("--source is empty: give a wheel file, a source folder or a ref")
    path = Path(value).expanduser()
    if value.endswith(".whl"):
        if not path.is_file():
            raise FarmError(f"--source {value}: no such wheel file")
        return WheelSource(kind="wheel", path=str(path.resolve()))
    if path.is_dir():
        return TreeSource(kind="tree", path=str(path.resolve()))
    try:
        return git_ref_source(engine, value)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise FarmError(f"--source {value!r}: not a ref the farm can fetch ({reason})") from None


def _part(engine: EngineSpec, overlay: str | None, source: BuildSource) -> EngineSpec:
    """The engine the source functions take for the replaced part (the overlay as an
    engine, as farm.builds.layers does)."""
    if overlay is None:
        return engine.model_copy(update={"source": source, "patches": (), "overlays": ()})
    spec = next(o for o in engine.overlays if o.package == overlay)
    return engine.model_copy(
        update={
            "name": f"{engine.name}: overlay {overlay}",
            "package": overlay,
            "version": spec.version,
            "source": source,
            "patches": (),
            "overlays": (),
        }
    )


def _checkout_folder(requirement: str) -> Path | None:
    _, _, url = requirement.partition(" @ ")
    parsed = urlparse(url)
    return Path(url2pathname(unquote(parsed.path))) if parsed.scheme == "file" else None


def _check_patches(
    patches: Sequence[Patch],
    part: EngineSpec,
    resolved: ResolvedSource,
    cache_dir: Path,
    say: LineSink,
) -> tuple[list[str], list[DroppedPatch]]:
    """Dry-run each patch against the PR head's source: kept, or dropped as already
    upstream (the reverse applies) or conflict."""
    if not patches:
        return [], []
    if resolved.kind in ("wheel", "pypi"):
        say("patches are not checked against a wheel: kept as the job names them")
        return [p.id for p in patches], []
    kept: list[str] = []
    dropped: list[DroppedPatch] = []
    with installable(part, resolved, cache_dir, say) as requirement:
        folder = _checkout_folder(requirement)
        assert folder is not None, "a tree or a checkout is a folder"
        for patch in patches:
            try:
                status = check_patch(patch, folder, Target(tree="source"))
            except PatchError as exc:
                dropped.append(DroppedPatch(patch_id=patch.id, reason="conflict", detail=str(exc)))
                continue
            if status.state == "applied":
                kept.append(patch.id)
            elif status.state == "already_upstream":
                dropped.append(DroppedPatch(patch_id=patch.id, reason="already upstream"))
            elif status.state == "conflict":
                failing = "; ".join(f"{f.file} hunk #{f.hunk}" for f in status.failures)
                dropped.append(DroppedPatch(patch_id=patch.id, reason="conflict", detail=failing))
            else:
                dropped.append(
                    DroppedPatch(patch_id=patch.id, reason="not applicable", detail=status.detail)
                )
    return kept, dropped


def _describe(engine: EngineSpec, source: BuildSource) -> str:
    if isinstance(source, PullRequestSource):
        return f"pull request #{source.number}"
    if isinstance(source, WheelSource | TreeSource):
        return f"the {source.kind} {source.path}"
    return f"the PyPI release {engine.package}=={engine.version}"


def _git_base(engine: EngineSpec) -> GitSource:
    """The replaced part's source, which ``--base merge-base`` moves: a git ref."""
    current = replaced_source(engine)
    if not isinstance(current, GitSource):
        overlay = replaced_overlay(engine)
        part = f"overlay {overlay} of engine {engine.name}" if overlay else f"engine {engine.name}"
        raise FarmError(
            f"--base merge-base needs a git base (a branch, tag or commit of a repository): "
            f"{part} comes from {_describe(engine, current)}; use --base branch"
        )
    return current


def _touched(
    engine: EngineSpec, head: BuildSource, cache_dir: Path, say: LineSink
) -> tuple[str, ...]:
    """The files the head changes against the replaced part's ref; nothing (said why)
    when either end is no git ref or git cannot tell: the order only loses a hint."""
    base = replaced_source(engine)
    if not isinstance(base, GitSource) or not isinstance(head, GitSource | PullRequestSource):
        return ()
    try:
        return changed_paths(base, cache_dir, base.ref, head.ref)
    except SourceError as exc:
        say(f"order: the files the PR changes are unknown ({exc})")
        return ()


def _merge_base_engine(
    engine: EngineSpec,
    base: GitSource,
    head: BuildSource,
    number: int,
    source: str | None,
    cache_dir: Path,
) -> tuple[EngineSpec, str]:
    """``engine`` with the replaced part (``base``) at the merge base of its ref and
    the head's ref, and the base's label. FarmError for a head that is not a git ref;
    SourceError for a ref that does not exist or histories without a common commit."""
    if not isinstance(head, GitSource | PullRequestSource):
        raise FarmError(
            f"--base merge-base needs a git ref for the head: --source {source} is a "
            f"{head.kind}; give a ref, or use --base branch"
        )
    sha = merge_base(base, cache_dir, base.ref, head.ref)
    # The same repository at a commit: the engine keeps its name (cells key on it).
    at = with_replaced_source(engine, base.model_copy(update={"ref": sha}))
    of = f"PR #{number}" if source is None else head.ref
    return at, f"merge-base {sha[:12]} of {base.ref} and {of}"


def prepare_pr(
    job: JobSpec,
    engine_name: str,
    number: int,
    *,
    source: str | None,
    cache_dir: Path,
    say: LineSink,
    base_at: BaseAt = "branch",
) -> PrSetup:
    """Resolve the PR's candidate and base builds (no engine is built here).

    The base is the engine as the job names it (``base_at="branch"``: its branch's
    tip), or with the replaced part at ``git merge-base <its ref> <PR head>``
    (``"merge-base"``: changes merged into the branch after the PR branched are then
    not counted as the PR's).

    Raises FarmError for an engine the job does not have, a source that cannot be
    resolved (a PR without ``refs/pull/N/head``: git's message), a candidate
    whose build id cannot be computed, or, for ``"merge-base"``, a base or a head
    that is not a git ref and refs without a common commit. A base that cannot be
    identified is not an error yet (``base_error``): stored cells cannot be matched,
    so it fails only when baseline cells must run (:func:`plan_baseline`).
    """
    engine = job_engine(job, engine_name)
    # Checked before the PR is looked up: without a git base the option cannot work.
    git_base = _git_base(engine) if base_at == "merge-base" else None
    overlay = replaced_overlay(engine)
    new_source = (
        pr_head_source(engine, number) if source is None else source_argument(engine, source)
    )
    part = _part(engine, overlay, new_source)
    resolved = resolve_source(part)  # SourceError: a PR that does not exist, a bad ref
    base, base_label = engine, None
    if git_base is not None:
        base, base_label = _merge_base_engine(
            engine, git_base, new_source, number, source, cache_dir
        )
    mine = [
        p
        for p in patches_of(engine)
        if (p.overlay == canonicalize_name(overlay) if overlay else p.overlay is None)
    ]
    kept, dropped = _check_patches(mine, part, resolved, cache_dir, say)
    others = [p for p in engine.patches if p not in {m.id for m in mine}]
    keep = tuple(p for p in engine.patches if p in set(kept) | set(others))
    candidate = candidate_engine(engine, number, new_source, keep)
    touched = _touched(engine, new_source, cache_dir, say)
    base_plan, cand_plan = plan_builds([base, candidate])
    if cand_plan.build_id is None:
        raise FarmError(f"the candidate build of PR #{number}: {cand_plan.error}")
    return PrSetup(
        job=job.name,
        number=number,
        base=base,
        candidate=candidate,
        base_build_id=base_plan.build_id,
        base_error=base_plan.error,
        candidate_build_id=cand_plan.build_id,
        candidate_label=cand_plan.source,
        base_label=base_label or (base_plan.source if base_plan.build_id else "unresolved"),
        head_sha=resolved.commit,
        dropped=tuple(dropped),
        touched=touched,
    )


def plan_baseline(
    session: Session | None,
    setup: PrSetup,
    planned: Sequence[ServerCell],
    *,
    max_age: timedelta,
    now: datetime | None = None,
) -> PrBaseline:
    """The stored base cells to reuse for the ``planned`` base cells (``session`` None:
    there is no store yet); FarmError when some must run but the base cannot be
    identified (so cannot be built)."""
    now = now or datetime.now(UTC)
    stored: list[StoredBaselineCell] = []
    if setup.base_build_id is not None and session is not None:
        stored = cells_of_build(session, setup.base_build_id, setup.base.name, now - max_age)
    selection = select_baseline(planned, stored, setup.base_build_id, now=now, max_age=max_age)
    if selection.missing and setup.base_build_id is None:
        raise FarmError(
            f"the base of engine {setup.base.name} has no stored baseline and cannot be built: "
            f"{setup.base_error}"
        )
    wanted = {(c.sweep_id, c.cell_id) for c in selection.reused}
    reused = tuple(s for s in stored if (s.sweep_id, s.stored.cell.cell_id) in wanted)
    return PrBaseline(selection=selection, reused=reused)


def pr_judge_rules(
    session: Session | None,
    setup: PrSetup,
    goldens: Sequence[GoldenCheck] = (),
    *,
    history: int = 0,
    confirm: ConfirmRule | None = None,
) -> JudgeRules:
    """The rules a PR is judged by, its fail-fast as its verdict, made before its sweep
    runs: the job's ``goldens``, the keys the job's nightlies found flaky
    (quarantined as there: shown, failing no PR), and each key's run-to-run noise over
    the job's last ``history`` nights (``nightly.history``), which calibrates its
    threshold and has a suspicious cell confirmed by ``confirm`` reruns
    (``nightly.confirm_runs`` and ``confirm_budget_s``). None of them without a store
    (``session`` None)."""
    # The base's keys are the nightly's (same engine name): its history says which flip
    # and how far a run strays.
    flaky = flaky_keys(session, setup.job) if session is not None else {}
    noise = job_key_noise(session, setup.job, history) if session is not None else {}
    return pr_rules(
        candidate=setup.candidate.name,
        base=setup.base.name,
        goldens=goldens,
        quarantine=flaky,
        calibration=noise,
        noise=NoiseRule(confirm=confirm or ConfirmRule()),
    )


def check_pr(
    session: Session,
    sweep_id: int,
    setup: PrSetup,
    baseline: PrBaseline,
    *,
    rules: JudgeRules,
    report_url: str | None = None,
) -> PrCheck:
    """Judge PR sweep ``sweep_id`` (the candidate against the base) by ``rules``
    (:func:`pr_judge_rules`) and store its verdict (once); render the comment."""
    record = load_sweep(session, sweep_id)
    flaky = rules.quarantine
    judgement = judge_pr(
        record,
        base=setup.base.name,
        candidate=setup.candidate.name,
        reused=baseline.reused,
        job=setup.job,
        number=setup.number,
        head_sha=setup.head_sha,
        dropped=setup.dropped,
        rules=rules,
    )
    verdict, new = record_verdict(session, judgement.verdict)
    judgement = judgement.model_copy(update={"verdict": verdict})
    cost = sweep_cost(session, sweep_id)
    comment = render_pr_comment(
        verdict,
        judgement.comparison,
        marker=comment_marker(setup.job, setup.base.name),
        candidate_label=setup.candidate_label,
        base_label=setup.base_label,
        dropped=[d.describe() for d in setup.dropped],
        report_url=report_url,
        cost=cost.describe(),
        quarantined={
            r.key.label: flaky[r.key.label]
            for r in judgement.comparison.rows
            if r.key.label in flaky
        },
    )
    return PrCheck(judgement=judgement, judged=new, comment=comment, cost=cost)


def publish_pr(
    client: GitHubClient,
    ref: PullRequestRef,
    check: PrCheck,
    setup: PrSetup,
    *,
    sha: str | None,
    report_url: str | None = None,
) -> tuple[str, bool, str | None]:
    """Create or update the PR's comment and set the head's status ``mtp-farm/JOB``.

    The status is set even when the comment cannot be written (GitHub refused it, or
    failed): the status is what a branch protection rule reads. Returns (comment URL,
    created, the status state set or None without a sha). Raises GitHubError, after
    the status, when either call failed.
    """
    marker = comment_marker(setup.job, setup.base.name)
    failure: GitHubError | None = None
    url, created = "", False
    try:
        url, created = client.upsert_comment(ref, marker, check.comment)
    except GitHubError as exc:
        failure = exc
    state: str | None = None
    if sha is not None:
        status = commit_status(check.judgement.verdict)
        client.set_status(
            ref.owner,
            ref.repo,
            sha,
            status.state,
            f"mtp-farm/{setup.job}",
            status.description,
            target_url=report_url,
        )
        state = status.state
    if failure is not None:
        done = f"the status {state} was set on {sha}; " if state else ""
        raise GitHubError(f"{failure} ({done}the comment was not written)") from None
    return url, created, state


def report_name(number: int, sweep_id: int) -> str:
    """The report file of a PR run in the publish folder."""
    return f"pr-{number}-sweep-{sweep_id}.html"


def write_pr_report(session: Session, check: PrCheck, folder: Path) -> Path:
    """Write the PR sweep's HTML report (with its verdict) into ``folder``; its path.
    Raises OutputError when the folder cannot be written."""
    # Imported here: the HTML report pulls in the figures only a published run needs.
    from farm.analysis.judgement import judge_within
    from farm.analysis.summary import summarize_sweep
    from farm.errors import OutputError
    from farm.report.html import render_html
    from farm.workflows.common import write_page

    verdict = check.judgement.verdict
    record = load_sweep(session, verdict.sweep_id)
    page = render_html(
        record,
        summarize_sweep(record),
        judge_within(record),
        verdict=verdict,
        cost=sweep_cost(session, verdict.sweep_id).describe(),
    )
    assert verdict.pr_number is not None
    path = folder / report_name(verdict.pr_number, verdict.sweep_id)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the publish folder {folder}: {exc.strerror}") from None
    write_page(path, page)
    return path

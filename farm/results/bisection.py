"""A bisection as stored: the candidates, the search over them, each step's verdict.

Pure: pydantic only. :mod:`farm.workflows.bisect` judges the steps,
:mod:`farm.store.bisections` keeps them, the reports and notices show them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Final, Literal

from pydantic import ConfigDict

from farm.frozen import Frozen
from farm.inert import UntrustedText

__all__ = [
    "BISECTION_STATUSES",
    "STEP_VERDICTS",
    "BisectStep",
    "Bisection",
    "BisectionStatus",
    "Commit",
    "Endpoint",
    "SearchOutcome",
    "StepVerdict",
    "VariantFigures",
    "VariantJudgement",
    "max_steps",
    "next_position",
    "pr_number",
    "search_outcome",
]

StepVerdict = Literal["good", "bad", "skip"]
STEP_VERDICTS: Final[tuple[StepVerdict, ...]] = ("good", "bad", "skip")
BisectionStatus = Literal["running", "found", "inconclusive"]
BISECTION_STATUSES: Final[tuple[BisectionStatus, ...]] = ("running", "found", "inconclusive")

# "Fix the window (#8210)" (a squash merge) or "Merge pull request #8210 from ..."
_PR_IN_SUBJECT = re.compile(r"\(#(\d+)\)\s*$|^Merge pull request #(\d+)\b")


class _Stored(Frozen):
    # Read back from the store by whichever farm version runs next.
    model_config = ConfigDict(extra="ignore")


def pr_number(subject: str) -> int | None:
    """The pull request a commit subject names: ``... (#123)`` or ``Merge pull request
    #123 ...``; None otherwise."""
    m = _PR_IN_SUBJECT.search(subject.strip())
    if m is None:
        return None
    return int(m[1] or m[2])


class Commit(_Stored):
    """One candidate: a commit (its id, subject line and the PR its subject names) or,
    with ``release``, a PyPI release (``sha`` is its version, ``subject``
    ``package==version``)."""

    sha: str
    subject: UntrustedText = ""  # git metadata: credentials masked
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


class SearchOutcome(Frozen):
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


class VariantFigures(_Stored):
    """One variant of a regressed cell at one commit: AL with its interval and the
    acceptance rate per draft position (per draft, 0..1); ``looks``: how its sequential
    looks ended when it ran in looks (``regress: decided after 4 of 12 prompts (look 1
    of 3)``)."""

    key: str
    label: str
    cell_id: str
    al: float | None = None
    al_low: float | None = None
    al_high: float | None = None
    per_position: tuple[float, ...] = ()
    requests: int = 0
    looks: str = ""


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
    reason: UntrustedText = ""  # a failed build's or cell's error: credentials masked
    engine_s: float = 0.0
    created_at: datetime | None = None


class Bisection(_Stored):
    """A bisection as stored: what is searched, the ends, the steps so far, the answer."""

    id: int | None = None
    key: str
    job: str
    engine: str
    overlay: str | None = None
    # The job's source.repo: its user information (https://user:PASSWORD@host) masked
    # when the bisection is built or read back, so no page or notice can show it.
    repo: UntrustedText
    commits: tuple[Commit, ...]
    planned_cells: tuple[str, ...]
    regressed: dict[str, str]
    good: Endpoint
    bad: Endpoint
    status: BisectionStatus = "running"
    first_bad: int | None = None
    last_good: int | None = None
    reason: UntrustedText = ""
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

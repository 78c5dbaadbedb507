"""`farm compare` as one workflow: read the two sweeps once, judge, render, write, post.

The CLI checks the options (two sweeps, an ``--out`` that is not the store, a token
when posting) and builds the :class:`CompareRequest`; :func:`run_compare` does the
rest and returns the :class:`CompareOutcome` it prints from.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from sqlmodel import Session

from farm.analysis.compare import SweepComparison
from farm.errors import FarmError
from farm.notify.github import PullRequestRef
from farm.report.markdown import render_comparison
from farm.store.cells import load_sweep
from farm.workflows.common import post_pr_comment
from farm.workflows.compare.decide import judge_comparison, nothing_compared

__all__ = ["CompareDeps", "CompareOutcome", "CompareRequest", "run_compare"]


@dataclass(frozen=True)
class CompareRequest:
    """What `farm compare` was asked: the two sweeps, the store, the engine renames,
    where to write the Markdown too, and the PR (OWNER/REPO#N) to post it to."""

    baseline: int
    candidate: int
    url: str
    engine_map: dict[str, str] = field(default_factory=dict)
    out: Path | None = None
    post_github: str | None = None


def _not_told(ref: PullRequestRef, link: str) -> None:
    pass


@dataclass(frozen=True)
class CompareDeps:
    """The I/O a comparison is handed: the store session, what shows the Markdown,
    what writes it to ``--out``, and who is told of the posted comment."""

    open_session: Callable[[str], AbstractContextManager[Session]]
    shown: Callable[[str], None]
    write_output: Callable[[Path, str], None]
    posted: Callable[[PullRequestRef, str], None] = _not_told


@dataclass(frozen=True)
class CompareOutcome:
    """The comparison and its Markdown."""

    comparison: SweepComparison
    text: str


def run_compare(request: CompareRequest, deps: CompareDeps) -> CompareOutcome:
    """Judge ``request.candidate`` against ``request.baseline``, show, write and post
    the Markdown. FarmError (after showing, writing and posting it) when nothing was
    compared; FarmError for an engine map naming an engine a sweep did not run,
    StoreError (store), FarmError when GitHub refuses."""
    with deps.open_session(request.url) as session:
        base = load_sweep(session, request.baseline)
        cand = load_sweep(session, request.candidate)
    judgement = judge_comparison(base, cand, request.engine_map)
    assert judgement.comparison is not None
    text = render_comparison(judgement.comparison)
    deps.shown(text)
    if request.out is not None:
        deps.write_output(request.out, text)
    if request.post_github is not None:
        deps.posted(*post_pr_comment(request.post_github, text))
    if (why := nothing_compared(judgement)) is not None:
        raise FarmError(why)
    return CompareOutcome(comparison=judgement.comparison, text=text)

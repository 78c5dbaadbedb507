"""A bisection's answer as a :class:`~farm.notify.message.Notice` for the chat channels.
Pure.

Here and not in :mod:`farm.notify`: the store imports ``farm.notify`` and
``farm.workflows`` imports the store, so ``farm.notify`` must not import the
bisection model. The words are those of the terminal and of
:func:`farm.report.markdown.render_bisection` (the answer is
:meth:`~farm.workflows.bisect.Bisection.headline`, what was searched
:meth:`~farm.workflows.bisect.Bisection.searched`), cut to what a chat message holds.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from farm.notify.message import Notice

if TYPE_CHECKING:
    from farm.results.bisection import Bisection, Commit, VariantFigures

__all__ = ["bisection_notice"]

# A chat message is read at a glance: past these, a line says how many more there are
# and `farm report --bisection` shows them all.
_MAX_VARIANTS = 10
_MAX_CANDIDATES = 10

# https://github.com/OWNER/REPO(.git), git@github.com:OWNER/REPO.git, ssh://git@github.com/...
_GITHUB_REPO = re.compile(
    r"(?:https://|ssh://git@|git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?"
)


def bisection_notice(b: Bisection) -> Notice:
    """The answer of bisection ``b`` for the notification channels: the first bad
    commit (or release) with its pull request and the last good one, or why it is
    inconclusive; what was searched; each regressed variant's AL at both ends; what it
    cost; and the command that shows every step. Level ``warning`` when a culprit was
    found, ``info`` otherwise; the link is the culprit's commit page when the searched
    repository is on GitHub."""
    culprit = _culprit(b)
    lines = [b.headline()]
    if culprit is not None and culprit.pr is not None:
        lines.append(f"pull request: #{culprit.pr}")
    lines += _candidates(b)
    lines.append(
        f"searched: {b.searched()} from {b.good.commit[:12]} to {b.bad.commit[:12]} "
        f"(job {b.job}, engine {b.engine})"
    )
    lines += _regressed(b)
    skips = sum(s.verdict == "skip" for s in b.steps)
    lines.append(
        f"cost: {len(b.steps)} step(s) ({skips} skipped), {b.builds_run} build(s), "
        f"{b.cells_run} cell(s), {b.wall_s:.0f} s wall"
    )
    link = None
    if culprit is not None and not culprit.release:
        link = _commit_url(b.repo, culprit.sha)
    stored = b.id is not None
    which = f"bisection {b.id}" if stored else "bisection"
    return Notice(
        title=f"mtp-farm {which} ({b.job} / {b.engine}): {_answer(b, culprit)}",
        level="warning" if culprit is not None else "info",
        lines=tuple(lines),
        footer=f"`farm report --bisection {b.id}` shows every step" if stored else "",
        link=link,
        topic=f"bisection:{b.id}" if stored else "bisection",
    )


def _culprit(b: Bisection) -> Commit | None:
    """The first bad commit (or release) of a found bisection, else None."""
    if b.status != "found" or b.first_bad is None:
        return None
    return b.commits[b.first_bad]


def _answer(b: Bisection, culprit: Commit | None) -> str:
    """The title's answer: ``first bad commit <sha> (PR #n)``, ``first bad release
    <package==version>``, or the status."""
    if culprit is None:
        return b.status
    if culprit.release:
        return f"first bad release {culprit.subject}"
    pr = f" (PR #{culprit.pr})" if culprit.pr is not None else ""
    return f"first bad commit {culprit.sha[:12]}{pr}"


def _candidates(b: Bisection) -> list[str]:
    """Inconclusive: the commits the first bad one is among (as the terminal lists them)."""
    if b.status != "inconclusive" or b.first_bad is None or b.last_good is None:
        return []
    among = [b.commits[i].describe() for i in range(b.last_good + 1, b.first_bad + 1)]
    lines = [f"candidate: {c}" for c in among[:_MAX_CANDIDATES]]
    if len(among) > _MAX_CANDIDATES:
        lines.append(f"and {len(among) - _MAX_CANDIDATES} more candidate(s)")
    return lines


def _al(f: VariantFigures | None) -> str:
    """``2.651 [2.526, 2.750]``, or ``n/a``."""
    if f is None or f.al is None:
        return "n/a"
    if f.al_low is None or f.al_high is None:
        return f"{f.al:.3f}"
    return f"{f.al:.3f} [{f.al_low:.3f}, {f.al_high:.3f}]"


def _regressed(b: Bisection) -> list[str]:
    """One line per regressed variant: its AL at the good end and at the bad end."""
    good = {f.key: f for f in b.good.figures}
    bad = {f.key: f for f in b.bad.figures}
    lines = []
    for key in sorted(b.regressed)[:_MAX_VARIANTS]:
        g, x = good.get(key), bad.get(key)
        shown = x or g
        label = shown.label if shown is not None else key
        change = ""
        if g is not None and x is not None and g.al and x.al is not None:
            change = f" ({(x.al - g.al) / g.al:+.1%})"
        lines.append(
            f"regressed: {label}: AL {_al(g)} at the good end, {_al(x)} at the bad end{change}"
        )
    more = len(b.regressed) - _MAX_VARIANTS
    if more > 0:
        lines.append(f"and {more} more regressed variant(s)")
    return lines


def _commit_url(repo: str, sha: str) -> str | None:
    """The commit's page when ``repo`` is a GitHub repository (by URL), else None."""
    m = _GITHUB_REPO.fullmatch(repo.strip())
    return f"https://github.com/{m[1]}/{m[2]}/commit/{sha}" if m else None

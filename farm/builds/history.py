"""A git source's history: the first-parent commits between two refs, for `farm
bisect`. Read from the mirror or local repository itself, or from the source cache's
bare copy of a remote (the one builds fetch into), with the farm's git runner (its
deadline, no credential prompt, URLs masked in errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from farm.builds.environment import mask_text
from farm.builds.sources import SourceError, git, local_commit, source_repository
from farm.spec import GitSource, PullRequestSource

__all__ = ["first_parent_commits", "history_repository"]

# Where the ends are fetched in a bare copy of a remote: refs of the farm's own.
_END_REFS = ("refs/farm-bisect/0", "refs/farm-bisect/1")


def history_repository(
    source: GitSource | PullRequestSource, cache_dir: Path, refs: Sequence[str]
) -> tuple[Path, bool]:
    """A repository holding ``refs`` and their history, and whether it is a copy of a
    remote (the refs then live as ``refs/farm-bisect/<i>`` there)."""
    location = source.mirror if source.mirror and Path(source.mirror).exists() else source.repo
    if not location:
        raise SourceError("the bisected source names no repository")
    if not source.is_remote(location):
        repo = Path(location)
        if not repo.is_dir() or git(["-C", location, "rev-parse"], check=False).returncode:
            raise SourceError(f"{location} is not a git repository")
        return repo, False
    with source_repository(cache_dir, location) as bare:
        for ref, into in zip(refs, _END_REFS, strict=False):
            fetch = ["--git-dir", str(bare), "fetch", "--quiet", "--tags", "--", location]
            if git([*fetch, f"+{ref}:{into}"], check=False).returncode != 0:
                raise SourceError(f"ref {ref!r} not found at {mask_text(location)}")
    return bare, True


def _commit(repo: Path, ref: str, option: str) -> str:
    found = local_commit(repo, ref)
    if found is None:
        raise SourceError(f"{option} {ref}: no such commit, branch or tag in {repo}")
    return found


def _is_ancestor(repo: Path, older: str, newer: str) -> bool:
    argv = ["-C", str(repo), "merge-base", "--is-ancestor", older, newer]
    return git(argv, check=False).returncode == 0


def first_parent_commits(
    repo: Path, good_ref: str, bad_ref: str, remote: bool = False
) -> tuple[tuple[str, str], ...]:
    """(commit id, subject) of the first-parent commits from ``good_ref`` to
    ``bad_ref``, oldest first, both ends included. SourceError for a ref that does not
    exist, ends in the wrong order, a good end off the bad end's first-parent line, or
    no commit between them."""
    refs = _END_REFS if remote else (good_ref, bad_ref)
    good = _commit(repo, refs[0], "--good")
    bad = _commit(repo, refs[1], "--bad")
    if good == bad:
        raise SourceError(
            f"--good {good_ref} and --bad {bad_ref} are the same commit {good[:12]}: "
            "no commits to bisect"
        )
    if not _is_ancestor(repo, good, bad):
        if _is_ancestor(repo, bad, good):
            raise SourceError(
                f"--good {good_ref} ({good[:12]}) comes after --bad {bad_ref} ({bad[:12]}) in "
                "the history: are the ends swapped?"
            )
        raise SourceError(
            f"--good {good_ref} is not an ancestor of --bad {bad_ref}: "
            "no range of commits between them"
        )
    log = ["-C", str(repo), "log", "--first-parent", "--reverse", "--format=%H%x00%P%x00%s"]
    rows = [
        line.split("\x00", 2) for line in git([*log, f"{good}..{bad}"]).stdout.splitlines() if line
    ]
    if not rows:
        raise SourceError(f"no commits between --good {good_ref} and --bad {bad_ref}")
    if rows[0][1].split()[:1] != [good]:
        raise SourceError(
            f"--good {good_ref} ({good[:12]}) is not on the first-parent line of --bad "
            f"{bad_ref}; give a commit of that line (the merge that brought it in)"
        )
    subject = git(["-C", str(repo), "log", "-1", "--format=%s", good]).stdout.strip()
    return ((good, subject), *((sha, subj) for sha, _, subj in rows))

"""A git source's history: the first-parent commits between two refs, for `farm
bisect`, and the merge base of two refs, for `farm pr --base merge-base`. Read from the
mirror or local repository itself, or from the source cache's bare copy of a remote
(the one builds fetch into), with the farm's git runner (its deadline, no credential
prompt, URLs masked in errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from farm.builds.sources import SourceError, git, local_commit, source_repository
from farm.masking import mask_text
from farm.spec import GitSource, PullRequestSource

__all__ = ["changed_paths", "first_parent_commits", "history_repository", "merge_base"]

# Where the ends are fetched in a bare copy of a remote: refs of the farm's own.
_END_REFS = ("refs/farm-bisect/0", "refs/farm-bisect/1")
# Where `farm pr --base merge-base` fetches its two refs (apart from bisect's).
_PR_REFS = ("refs/farm-pr/base", "refs/farm-pr/head")


def _location(source: GitSource | PullRequestSource, what: str) -> str:
    """The mirror when this machine has it, else the repository (as builds choose)."""
    location = source.mirror if source.mirror and Path(source.mirror).exists() else source.repo
    if not location:
        raise SourceError(f"the {what} names no repository")
    if source.is_remote(location):
        return location
    if not Path(location).is_dir() or git(["-C", location, "rev-parse"], check=False).returncode:
        raise SourceError(f"{location} is not a git repository")
    return location


def _fetch_refs(
    bare: Path, location: str, refs: Sequence[str], into: Sequence[str], tags: bool
) -> None:
    """Fetch each of ``refs`` of ``location`` into ``bare`` as the ref ``into`` names."""
    fetch = ["--git-dir", str(bare), "fetch", "--quiet", *(["--tags"] if tags else [])]
    for ref, name in zip(refs, into, strict=False):
        if git([*fetch, "--", location, f"+{ref}:{name}"], check=False).returncode != 0:
            raise SourceError(f"ref {ref!r} not found at {mask_text(location)}")


def history_repository(
    source: GitSource | PullRequestSource, cache_dir: Path, refs: Sequence[str]
) -> tuple[Path, bool]:
    """A repository holding ``refs`` and their history, and whether it is a copy of a
    remote (the refs then live as ``refs/farm-bisect/<i>`` there)."""
    location = _location(source, "bisected source")
    if not source.is_remote(location):
        return Path(location), False
    with source_repository(cache_dir, location) as bare:
        _fetch_refs(bare, location, refs, _END_REFS, tags=True)
    return bare, True


def merge_base(
    source: GitSource | PullRequestSource, cache_dir: Path, base_ref: str, head_ref: str
) -> str:
    """The full id of the best common ancestor of ``base_ref`` and ``head_ref`` in
    ``source``'s repository (``git merge-base``: GitHub's base of a PR's diff).

    A local repository or mirror is read in place; a remote's refs are fetched into
    the source cache's bare copy as ``refs/farm-pr/base`` and ``refs/farm-pr/head``,
    and read under its lock (two runs do not mix their refs). Raises SourceError for
    a ref the repository does not have or two histories without a common commit.
    """
    location = _location(source, "source")
    if not source.is_remote(location):
        return _merge_base(Path(location), (base_ref, head_ref), (base_ref, head_ref), location)
    with source_repository(cache_dir, location) as bare:
        _fetch_refs(bare, location, (base_ref, head_ref), _PR_REFS, tags=False)
        return _merge_base(bare, _PR_REFS, (base_ref, head_ref), mask_text(location))


def changed_paths(
    source: GitSource | PullRequestSource, cache_dir: Path, base_ref: str, head_ref: str
) -> tuple[str, ...]:
    """The files ``head_ref`` changes since it branched from ``base_ref`` (``git diff
    --name-only base...head``: what GitHub shows as the PR's files), read as
    :func:`merge_base` reads the repository. Raises SourceError as it does."""
    location = _location(source, "source")
    if not source.is_remote(location):
        repo, refs, where = Path(location), (base_ref, head_ref), location
        base = _merge_base(repo, refs, (base_ref, head_ref), where)
        return _diff_names(repo, base, _commit(repo, head_ref, "the head ref"), where)
    with source_repository(cache_dir, location) as bare:
        _fetch_refs(bare, location, (base_ref, head_ref), _PR_REFS, tags=False)
        where = mask_text(location)
        base = _merge_base(bare, _PR_REFS, (base_ref, head_ref), where)
        return _diff_names(bare, base, _commit(bare, _PR_REFS[1], "the head ref"), where)


def _diff_names(repo: Path, base: str, head: str, where: str) -> tuple[str, ...]:
    found = git(["-C", str(repo), "diff", "--name-only", base, head], check=False)
    if found.returncode != 0:
        raise SourceError(
            f"git diff in {where} failed (exit {found.returncode}):\n"
            + mask_text(found.stderr.strip())
        )
    return tuple(line for line in found.stdout.splitlines() if line.strip())


def _merge_base(repo: Path, refs: Sequence[str], names: tuple[str, str], where: str) -> str:
    """The merge base of ``refs`` in ``repo``; errors name the refs as ``names`` (what
    the user gave) and the repository as ``where``."""
    base_ref, head_ref = names
    base = local_commit(repo, refs[0])
    if base is None:
        raise SourceError(f"the base ref {base_ref!r}: no such commit, branch or tag in {where}")
    head = local_commit(repo, refs[1])
    if head is None:
        raise SourceError(f"the head ref {head_ref!r}: no such commit, branch or tag in {where}")
    found = git(["-C", str(repo), "merge-base", base, head], check=False)
    if found.returncode not in (0, 1):  # 1 is "no common ancestor"; the rest, git's error
        raise SourceError(
            f"git merge-base in {where} failed (exit {found.returncode}):\n"
            + mask_text(found.stderr.strip())
        )
    if found.returncode == 1 or not found.stdout.strip():
        raise SourceError(
            f"{base_ref} ({base[:12]}) and {head_ref} ({head[:12]}) have no common commit "
            f"in {where}: unrelated histories (is the PR from another repository?)"
        )
    return found.stdout.split()[0]


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

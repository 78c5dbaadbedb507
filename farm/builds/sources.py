"""Build sources: pin an engine's source to its content, then make it installable.

Two steps, so that ``farm plan`` can show build ids without downloading anything:

- :func:`resolve_source` finds the identity of the source: nothing for a PyPI
  release (``package==version`` is its identity), the sha256 of a wheel, a hash of
  a source tree's files, or the commit a git ref points at (``git rev-parse`` in a
  local repository, ``git ls-remote`` for a URL).
- :func:`installable` yields the pip requirement that installs exactly that
  content: a ``package @ file://`` reference to the wheel, a snapshot of the tree,
  or a checkout of the commit fetched into a cached bare repository.
- :func:`list_releases` lists the releases of a package on the index pip is
  configured with (``farm bisect`` over PyPI releases).

A tree is installed from a copy of exactly the files its identity hashes, never in
place: an in-place build leaves ``build/`` behind for the next one to reuse, and pip
caches the wheel of a folder named like ``name-version`` by its path alone.

Everything that can go wrong raises :class:`SourceError` naming the engine and the
source, with git's own message.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from filelock import FileLock
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from farm.builds.environment import (
    StepTimeoutError,
    build_environment,
    git_environment,
    run_step,
)
from farm.errors import BuildError
from farm.frozen import Frozen
from farm.masking import mask_text
from farm.settings import get_settings
from farm.spec import EngineSpec, GitSource, PullRequestSource

__all__ = [
    "USED_MARK",
    "ResolvedSource",
    "SourceError",
    "git",
    "installable",
    "list_releases",
    "local_commit",
    "resolve_source",
    "source_repository",
    "tree_digest",
]

SourceKind = Literal["pypi", "wheel", "tree", "git"]
USED_MARK = "farm-last-used"
LineSink = Callable[[str], None]

# `pip index versions` (pip >= 21.2; no --json before pip 25): "Available versions: a, b"
_AVAILABLE = re.compile(r"^Available versions:(.*)$", re.MULTILINE)
_FULL_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")
_SHORT_COMMIT = re.compile(r"^[0-9a-fA-F]{4,39}\Z")
# Never part of a tree's identity: VCS data, caches, and what building it writes
# into it (setuptools' build/ and *.egg-info), so installing a tree does not change
# its id.
_SKIP_DIRS = {".git", "__pycache__", ".venv", ".tox", ".nox", ".eggs"}
_SKIP_DIRS |= {".mypy_cache", ".pytest_cache", ".ruff_cache"}
_SKIP_TOP = {"build", "dist"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class SourceError(BuildError):
    """A build source cannot be found, read or fetched; names the engine and source."""


class ResolvedSource(Frozen):
    """An engine's build source pinned to its content.

    ``identity`` is what goes into the build id: ``None`` for a PyPI release,
    ``sha256:<hex>`` for a wheel, ``tree:<hex>`` for a source tree, ``git:<commit>``
    (plus ``:<subdirectory>``) for a git ref or pull request. ``version`` is the release
    the source declares or the wheel's file name says, when known.
    """

    kind: SourceKind
    label: str
    identity: str | None = None
    version: str | None = None
    commit: str | None = None
    location: str | None = None
    ref: str | None = None
    subdirectory: str = ""

    def requirement_key(self, package: str) -> str:
        """The requirement as it enters the build id: the content, not where it lies."""
        return f"{package} @ {self.identity}" if self.identity else self.label


def resolve_source(engine: EngineSpec) -> ResolvedSource:
    """Pin ``engine``'s source to its content (see the module docstring).

    Reads the wheel or tree, or asks git (a network call for a remote repository,
    retried once). Raises SourceError for a missing file, a folder that is not a git
    repository, or a ref the repository does not have.
    """
    src = engine.source
    if src.kind == "pypi":
        return ResolvedSource(
            kind="pypi", label=f"{engine.package}=={engine.version}", version=engine.version
        )
    if src.kind == "wheel":
        return _resolve_wheel(engine, Path(src.path))
    if src.kind == "tree":
        root = Path(src.path)
        if not root.is_dir():
            raise _error(engine, f"tree {root}", "no such directory")
        digest = tree_digest(root)
        return ResolvedSource(
            kind="tree",
            label=f"tree {root} ({digest[:12]})",
            identity=f"tree:{digest}",
            version=engine.version,
            location=str(root),
        )
    return _resolve_git(engine, src)


@contextmanager
def installable(
    engine: EngineSpec, source: ResolvedSource, cache_dir: Path, say: LineSink
) -> Iterator[str]:
    """The pip requirement that installs ``source``, valid inside the ``with`` block.

    A git source is fetched into ``cache_dir/sources/git`` (kept, so the next ref of
    the same repository fetches only what is new) and checked out into a temporary
    folder that is removed afterwards. A tree is copied into a temporary folder; one
    that changed since it was resolved raises SourceError (the build would not
    match its id).
    """
    if source.kind == "pypi":
        yield source.label
    elif source.kind == "wheel":
        yield f"{engine.package} @ {Path(str(source.location)).as_uri()}"
    elif source.kind == "tree":
        with _snapshot(engine, source, cache_dir) as tree:
            yield f"{engine.package} @ {tree.as_uri()}"
    else:
        with _checkout(engine, source, cache_dir, say) as tree:
            yield f"{engine.package} @ {(tree / source.subdirectory).as_uri()}"


def list_releases(package: str) -> tuple[str, ...]:
    """Every release of ``package`` (pre-releases too) that pip would install on this
    Python from the index it is configured with (``pip config list``, ``PIP_*``:
    index URL, extra indexes, find-links), as the index spells them, newest first.

    Asks ``pip index versions`` rather than the index itself, so what is listed is
    what a build of one of them installs. Raises SourceError when pip fails (no such
    package on the index, the index unreachable) with pip's own message.
    """
    limits = get_settings().builds
    argv = [sys.executable, "-m", "pip", "index", "versions", "--pre", package]
    proc = run_step(
        argv,
        what=f"list the releases of {package}",
        timeout_s=limits.pip_timeout_s,
        kill_wait_s=limits.kill_wait_s,
        setting="FARM_PIP_TIMEOUT_S",
        env=build_environment(),
    )
    found = _AVAILABLE.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        problem = " ".join(errors) or proc.stderr.strip() or proc.stdout.strip()
        raise SourceError(
            mask_text(f"cannot list the releases of {package} on the package index: {problem}")
        )
    return tuple(v.strip() for v in found[1].split(",") if v.strip())


def tree_digest(root: Path) -> str:
    """sha256 over the relative paths, executable bits and contents of a tree's files.

    In a git work tree the files are those git lists (tracked, or untracked and not
    ignored); elsewhere every file. Build artefacts and caches never count.
    """
    h = hashlib.sha256()
    for rel in sorted(_tree_files(root)):
        path = root / rel
        if path.is_symlink():
            h.update(f"L\0{rel}\0{os.readlink(path)}\0".encode())
        elif path.is_file():
            executable = os.access(path, os.X_OK)
            h.update(f"F\0{rel}\0{int(executable)}\0".encode())
            h.update(_file_sha256(path).encode())
    return h.hexdigest()


@contextmanager
def _snapshot(engine: EngineSpec, source: ResolvedSource, cache_dir: Path) -> Iterator[Path]:
    root = Path(str(source.location))
    scratch_root = cache_dir / "sources" / "trees"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=scratch_root))
    try:
        tree = scratch / "src"
        tree.mkdir()
        for rel in _tree_files(root):
            src, dst = root / rel, tree / rel
            if not (src.is_symlink() or src.is_file()):
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
        if f"tree:{tree_digest(tree)}" != source.identity:
            raise _error(engine, source.label, "changed since it was resolved; run again")
        # Version schemes such as setuptools-scm read git metadata: point the copy at
        # the original repository when the tree is the top of a work tree.
        argv = ["-C", str(root), "rev-parse", "--show-toplevel", "--absolute-git-dir"]
        top = git(argv, check=False).stdout.splitlines()
        if len(top) == 2 and Path(top[0]) == root.resolve():
            (tree / ".git").write_text(f"gitdir: {top[1]}\n")
        yield tree
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:  # streamed: engine wheels are hundreds of MB
        return hashlib.file_digest(f, "sha256").hexdigest()


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    if parts[0] in _SKIP_TOP and len(parts) > 1:
        return True
    dirs = parts[:-1]
    return any(d in _SKIP_DIRS or d.endswith(".egg-info") for d in dirs) or rel.endswith(
        _SKIP_SUFFIXES
    )


def _tree_files(root: Path) -> list[str]:
    names = _git_listed(root)
    if not names:  # not in a git work tree, or a folder the enclosing repo ignores
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            dirnames[:] = [
                d
                for d in dirnames
                if d not in _SKIP_DIRS
                and not d.endswith(".egg-info")
                and not (rel_dir == Path(".") and d in _SKIP_TOP)
            ]
            names += [(rel_dir / f).as_posix() for f in filenames]
    return [n for n in names if not _skipped(n)]


def _git_listed(root: Path) -> list[str]:
    """Files git tracks or would track under ``root``; empty outside a work tree."""
    argv = ["-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = git(argv, check=False)
    if listed.returncode != 0:
        return []
    return [n for n in listed.stdout.split("\0") if n]


def _resolve_wheel(engine: EngineSpec, path: Path) -> ResolvedSource:
    where = f"wheel {path}"
    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise _error(engine, where, f"not a wheel file name: {exc}") from None
    if name != canonicalize_name(engine.package):
        raise _error(engine, where, f"is a wheel of {name}, not of {engine.package}")
    try:
        digest = _file_sha256(path)
    except OSError as exc:
        raise _error(engine, where, f"cannot read it: {exc.strerror}") from None
    return ResolvedSource(
        kind="wheel",
        label=f"wheel {path.name} ({digest[:12]})",
        identity=f"sha256:{digest}",
        version=engine.version or str(version),
        location=str(path),
    )


def _location(engine: EngineSpec, src: GitSource | PullRequestSource) -> str:
    # A mirror wins when this machine has it; otherwise the configured remote.
    if src.mirror and Path(src.mirror).exists():
        return src.mirror
    if src.repo:
        return src.repo
    raise _error(engine, _describe(src, str(src.mirror)), "the mirror does not exist")


def _describe(src: GitSource | PullRequestSource, location: str) -> str:
    # Shown and stored (labels, errors): a URL's token is not.
    where = mask_text(location)
    if src.kind == "pr":
        return f"pull request #{src.number} of {where}"
    return f"git {where}@{src.ref}"


def _resolve_git(engine: EngineSpec, src: GitSource | PullRequestSource) -> ResolvedSource:
    location = _location(engine, src)
    where = _describe(src, location)
    if src.is_remote(location):
        commit = _remote_commit(engine, where, location, src.ref)
    else:
        commit = _local_commit(engine, where, Path(location), src.ref)
    identity = f"git:{commit}" + (f":{src.subdirectory}" if src.subdirectory else "")
    return ResolvedSource(
        kind="git",
        label=f"{where} ({commit[:12]})",
        identity=identity,
        version=engine.version,
        commit=commit,
        location=location,
        ref=src.ref,
        subdirectory=src.subdirectory,
    )


def _local_commit(engine: EngineSpec, where: str, repo: Path, ref: str) -> str:
    if not repo.is_dir():
        raise _error(engine, where, f"{repo} does not exist")
    probe = git(["-C", str(repo), "rev-parse", "--git-dir"], check=False)
    if probe.returncode != 0:
        raise _error(engine, where, f"{repo} is not a git repository")
    found = local_commit(repo, ref)
    if found is None:
        raise _error(engine, where, f"ref {ref!r} not found in {repo}")
    return found


def local_commit(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` names in the local repository ``repo``, or None."""
    argv = ["-C", str(repo), "rev-parse", "--verify", "--quiet", "--end-of-options"]
    found = git([*argv, f"{ref}^{{commit}}"], check=False)
    return found.stdout.strip() if found.returncode == 0 else None


def _remote_commit(engine: EngineSpec, where: str, url: str, ref: str) -> str:
    if _FULL_COMMIT.match(ref.lower()):
        return ref.lower()  # checked when it is fetched
    # Asking for ref^{} too: with patterns, ls-remote lists a tag's commit only then.
    argv = ["ls-remote", "--", url, ref, f"{ref}^{{}}"]
    listing = _git_retrying(engine, where, argv, "ls-remote")
    refs: dict[str, str] = {}
    for line in listing.splitlines():
        sha, _, name = line.partition("\t")
        refs[name] = sha
    # git's own order (gitrevisions(7)), a tag's commit rather than the tag object.
    for name in (ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if f"{name}^{{}}" in refs:
            return refs[f"{name}^{{}}"]
        if name in refs:
            return refs[name]
    # A remote only advertises refs: an abbreviated commit id cannot be looked up.
    hint = "; give the full commit id" if _SHORT_COMMIT.match(ref) else ""
    raise _error(engine, where, f"ref {ref!r} not found at {mask_text(url)}{hint}")


@contextmanager
def _checkout(
    engine: EngineSpec, source: ResolvedSource, cache_dir: Path, say: LineSink
) -> Iterator[Path]:
    assert source.commit and source.location and source.ref
    where = source.label
    keep = f"refs/farm/{source.commit}"
    with source_repository(cache_dir, source.location) as bare:
        if not _has(bare, keep):
            _fetch(engine, source, bare, keep, say)
    scratch = Path(tempfile.mkdtemp(prefix=f"{source.commit[:12]}-", dir=bare.parent))
    try:
        tree = scratch / "src"
        git(["clone", "--quiet", "--shared", "--no-checkout", str(bare), str(tree)])
        git(["-C", str(tree), "checkout", "--quiet", "--detach", source.commit])
        if not (tree / source.subdirectory).is_dir():
            raise _error(engine, where, f"no folder {source.subdirectory!r} at this commit")
        yield tree
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def source_repository(cache_dir: Path, location: str) -> Iterator[Path]:
    """The source cache's bare repository of ``location`` (made when missing), held
    under its lock for the block: builds fetch commits into it, `farm bisect` its
    history."""
    root = cache_dir / "sources" / "git"
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(location.encode()).hexdigest()[:16]
    bare = root / f"{key}.git"
    with FileLock(str(root / f"{key}.lock")):
        if not bare.exists():
            git(["init", "--quiet", "--bare", str(bare)])
            (bare / "farm-source").write_text(location + "\n")
        (bare / USED_MARK).touch()  # `farm builds gc` prunes repositories unused a while
        yield bare


def _has(bare: Path, ref: str) -> bool:
    return (
        git(["--git-dir", str(bare), "rev-parse", "-q", "--verify", ref], check=False).returncode
        == 0
    )


def _fetch(
    engine: EngineSpec, source: ResolvedSource, bare: Path, keep: str, say: LineSink
) -> None:
    """Fetch ``source.commit`` into ``bare`` as ``keep`` (a ref, so gc keeps it)."""
    assert source.commit and source.location and source.ref
    say(f"fetching {source.ref} ({source.commit[:12]}) from {mask_text(source.location)}")
    # --tags: version schemes such as setuptools-scm describe a commit by its nearest tag.
    fetch = ["--git-dir", str(bare), "fetch", "--quiet", "--tags", "--force", "--", source.location]
    # The commit itself first: exactly what was resolved, even if the ref moved since.
    # Servers that refuse unadvertised commits get the ref, checked against the commit.
    if git([*fetch, f"+{source.commit}:{keep}"], check=False).returncode == 0:
        return
    _git_retrying(engine, source.label, [*fetch, f"+{source.ref}:{keep}"], "fetch")
    got = git(["--git-dir", str(bare), "rev-parse", f"{keep}^{{commit}}"]).stdout.strip()
    if got != source.commit:
        git(["--git-dir", str(bare), "update-ref", "-d", keep])
        raise _error(
            engine, source.label, f"{source.ref} moved to {got[:12]} while building; run again"
        )


def git(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git with the build environment (no secrets, no credential prompt) and the
    FARM_GIT_TIMEOUT_S deadline. Raises SourceError on failure when ``check``, and
    StepTimeoutError on the deadline whatever ``check`` says."""
    limits = get_settings().builds
    try:
        proc = run_step(
            ["git", *argv],
            what=f"run git {argv[2] if argv[0] in ('-C', '--git-dir') else argv[0]}",
            timeout_s=limits.git_timeout_s,
            kill_wait_s=limits.kill_wait_s,
            setting="FARM_GIT_TIMEOUT_S",
            env=git_environment(),
        )
    except FileNotFoundError:
        raise SourceError("git is not installed (apt-get install git)") from None
    if check and proc.returncode != 0:
        raise SourceError(
            mask_text(
                f"git {' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}"
            )
        )
    return proc


def _git_retrying(engine: EngineSpec, where: str, argv: list[str], what: str) -> str:
    """Run a git command that may touch the network: once more on failure, then fail.
    A command that ran out of time is not run again."""
    try:
        proc = git(argv, check=False)
        if proc.returncode != 0:
            proc = git(argv, check=False)
    except StepTimeoutError as exc:
        raise _error(engine, where, str(exc)) from None
    if proc.returncode != 0:
        raise _error(
            engine,
            where,
            mask_text(f"git {what} failed twice (exit {proc.returncode}):\n{proc.stderr.strip()}"),
        )
    return proc.stdout


def _error(engine: EngineSpec, where: str, problem: str) -> SourceError:
    return SourceError(f"engine {engine.name}: source {where}: {problem}")

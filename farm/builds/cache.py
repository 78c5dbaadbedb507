"""The build cache on disk: list what is there, prune what is old.

Each finished build has a marker, ``build.json``: its :class:`~farm.records.BuildInfo`
with ``format_version`` (:mod:`farm.fileformat`; a marker without one is version 1).
A marker that cannot be read is reported with its path and reason, never skipped
silently, and its build is left in place.

A folder without a marker is a build that has not finished: being built while its
``builds/<folder>.lock`` is held, otherwise abandoned (a build killed mid-install leaves
hundreds of MB that nothing will use: the next build of that id starts afresh). Both
are listed; gc removes the abandoned ones whatever their age.

A build in use is held with a shared lock on ``builds/<folder>.inuse``
(:func:`use_build`: a running sweep holds each build it uses on its host, a cell its
build); gc takes that lock exclusively without waiting, and skips the build when it
cannot. gc removes the folder it found under the cache, never a path read from the
marker (a moved FARM_HOME leaves markers naming folders elsewhere).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import Field

from farm.builds.sources import USED_MARK
from farm.fileformat import UnreadableFileError, read_versioned, write_versioned
from farm.frozen import Frozen
from farm.records import BuildInfo
from farm.yamlfile import ParseError, parse_json

__all__ = [
    "BUILD_FORMAT",
    "MARKER",
    "SOURCE_FILE",
    "BuildGc",
    "BuildScan",
    "CachedBuild",
    "UnfinishedBuild",
    "gc_builds",
    "list_builds",
    "prune_builds",
    "prune_sources",
    "read_marker",
    "removed_on_failure",
    "scan_builds",
    "touch_build",
    "use_build",
    "write_marker",
]

MARKER = "build.json"
BUILD_FORMAT = 1
"""The marker format this code writes and reads (``format_version``)."""
SOURCE_FILE = "source.json"  # the resolved source, written next to the marker
_LAST_USED = "last_used"


class CachedBuild(Frozen):
    info: BuildInfo
    size_bytes: int
    last_used: float
    source: str = Field(description="where the engine came from, with its content hash")
    folder: Path = Field(description="the build's folder under the cache, where it was found")


class UnfinishedBuild(Frozen):
    """A build folder without a marker: being built, or left by a build that died."""

    folder: Path
    size_bytes: int
    last_written: float
    building: bool  # its lock is held: a build is filling it now


class BuildScan(Frozen):
    """The readable builds of a cache, the markers that cannot be read and the
    folders of builds that have not finished."""

    builds: tuple[CachedBuild, ...] = ()
    unreadable: tuple[str, ...] = ()  # "<marker>: unreadable ...: <reason>; <what to do>"
    unfinished: tuple[UnfinishedBuild, ...] = ()

    @property
    def abandoned(self) -> tuple[UnfinishedBuild, ...]:
        return tuple(u for u in self.unfinished if not u.building)


def write_marker(env_dir: Path, info: BuildInfo) -> None:
    """Mark the build in ``env_dir`` finished: write its ``build.json`` (atomically)."""
    write_versioned(env_dir / MARKER, info, BUILD_FORMAT, indent=2)


def read_marker(path: Path) -> BuildInfo:
    """The build a ``build.json`` describes. Raises UnreadableFileError (path, reason)."""
    return read_versioned(path, BuildInfo, version=BUILD_FORMAT, what="build marker")


def touch_build(env_dir: Path) -> None:
    """Record that a build was just used (gc keeps recently used builds)."""
    (env_dir / _LAST_USED).touch()


def _in_use_file(env_dir: Path) -> Path:
    return env_dir.with_name(env_dir.name + ".inuse")


@contextlib.contextmanager
def use_build(env_dir: Path) -> Iterator[None]:
    """Hold the build in ``env_dir`` in use (a shared lock) for the block: gc spares it.

    Any number of sweeps and cells may hold one build at once; the lock goes with the
    process, so a killed sweep holds nothing."""
    fd = os.open(_in_use_file(env_dir), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _unused(env_dir: Path) -> Iterator[bool]:
    """Whether nobody holds the build in use; if so, nobody can start to in the block."""
    fd = os.open(_in_use_file(env_dir), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


@contextlib.contextmanager
def removed_on_failure(env_dir: Path) -> Iterator[None]:
    """Remove the build folder ``env_dir`` when the block raises (a failed install
    leaves nothing behind; a killed one is left to gc, :class:`UnfinishedBuild`)."""
    try:
        yield
    except BaseException:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise


def _being_built(folder: Path) -> bool:
    try:
        with FileLock(str(folder.with_suffix(".lock")), timeout=0):
            return False
    except Timeout:
        return True


def _unfinished(cache_dir: Path, sizes: bool = True) -> Iterator[UnfinishedBuild]:
    root = cache_dir / "builds"
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.is_symlink() or not folder.is_dir() or (folder / MARKER).exists():
            continue
        try:
            last = folder.stat().st_mtime
        except OSError:
            continue  # removed since it was listed
        yield UnfinishedBuild(
            folder=folder,
            size_bytes=_size(folder) if sizes else 0,
            last_written=last,
            building=_being_built(folder),
        )


def _size(path: Path) -> int:
    # Hard links shared with a base build are counted once per inode.
    seen: set[int] = set()
    total = 0
    for f in path.rglob("*"):
        try:
            st = f.lstat()
        except OSError:
            continue
        if st.st_ino not in seen and not f.is_symlink():
            seen.add(st.st_ino)
            total += st.st_size
    return total


def _source_label(path: Path, info: BuildInfo) -> str:
    # Builds made before sources were recorded all came from PyPI.
    try:
        label = parse_json(path.read_text())["label"]
    except (OSError, ValueError, KeyError, TypeError, ParseError):
        return f"{info.package}=={info.version}"
    return str(label)


def scan_builds(cache_dir: Path, sizes: bool = True) -> BuildScan:
    """Every finished build under ``cache_dir``, most recently used first, every
    marker that cannot be read (with its path and the reason) and every folder of a
    build that has not finished."""
    builds = []
    unreadable = []
    for marker in sorted((cache_dir / "builds").glob(f"*/{MARKER}")):
        try:
            info = read_marker(marker)
        except UnreadableFileError as exc:
            unreadable.append(str(exc))
            continue
        used = marker.parent / _LAST_USED
        last = used.stat().st_mtime if used.exists() else marker.stat().st_mtime
        builds.append(
            CachedBuild(
                info=info,
                size_bytes=_size(marker.parent) if sizes else 0,
                last_used=last,
                source=_source_label(marker.parent / SOURCE_FILE, info),
                folder=marker.parent,
            )
        )
    ordered = sorted(builds, key=lambda b: -b.last_used)
    return BuildScan(
        builds=tuple(ordered),
        unreadable=tuple(unreadable),
        unfinished=tuple(_unfinished(cache_dir, sizes)),
    )


def list_builds(cache_dir: Path, sizes: bool = True) -> list[CachedBuild]:
    """Every readable build under ``cache_dir``, most recently used first
    (:func:`scan_builds` also names the unreadable markers)."""
    return list(scan_builds(cache_dir, sizes).builds)


class BuildGc(Frozen):
    """What a gc of the build cache removed (or would), and what it spared as busy."""

    removed: tuple[CachedBuild, ...] = ()
    in_use: tuple[CachedBuild, ...] = ()  # held by a running sweep or cell
    building: tuple[CachedBuild, ...] = ()  # locked by a build of the same id
    abandoned: tuple[UnfinishedBuild, ...] = ()  # folders of builds that died, removed


def gc_builds(cache_dir: Path, older_than_days: float, dry_run: bool = False) -> BuildGc:
    """Remove builds unused for ``older_than_days``, each by the folder it was found in,
    and the folders of builds that died before they finished, whatever their age.

    Skips (and names) builds in use (:func:`use_build`) and builds being built; skips
    builds whose marker cannot be read (:func:`scan_builds` names them).
    """
    cutoff = time.time() - older_than_days * 86400
    removed, in_use, building = [], [], []
    for build in list_builds(cache_dir, sizes=False):
        if build.last_used >= cutoff:
            continue
        folder = build.folder
        try:
            with FileLock(str(folder.with_suffix(".lock")), timeout=0), _unused(folder) as free:
                if not free:
                    in_use.append(build)
                    continue
                if not dry_run:
                    _remove(folder)
        except Timeout:
            building.append(build)
            continue
        removed.append(build)
    abandoned = []
    for unfinished in _unfinished(cache_dir):
        try:
            # Under the build's own lock: a build of that id starting now waits.
            with FileLock(str(unfinished.folder.with_suffix(".lock")), timeout=0):
                if (unfinished.folder / MARKER).exists():
                    continue  # finished since it was listed
                if not dry_run:
                    _remove(unfinished.folder)
        except Timeout:
            continue
        abandoned.append(unfinished)
    return BuildGc(
        removed=tuple(removed),
        in_use=tuple(in_use),
        building=tuple(building),
        abandoned=tuple(abandoned),
    )


def _remove(folder: Path) -> None:
    """Remove a build folder of the cache; a symlink there goes, not what it points to."""
    if folder.is_symlink():
        folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)


def prune_builds(cache_dir: Path, older_than_days: float, dry_run: bool = False) -> list[BuildInfo]:
    """The builds :func:`gc_builds` removes (or would, with ``dry_run``)."""
    return [b.info for b in gc_builds(cache_dir, older_than_days, dry_run).removed]


def prune_sources(cache_dir: Path, older_than_days: float, dry_run: bool = False) -> list[Path]:
    """Remove git repositories fetched for builds and unused for ``older_than_days``.

    Skips a repository while a build is fetching from it. Finished builds do not
    need them: a pruned repository is fetched again by the next build that does.
    """
    cutoff = time.time() - older_than_days * 86400
    root = cache_dir / "sources" / "git"
    removed = []
    for bare in sorted(root.glob("*.git")):
        used = bare / USED_MARK
        try:
            last = (used if used.exists() else bare).stat().st_mtime
        except OSError:
            continue
        if last >= cutoff:
            continue
        try:
            with FileLock(str(root / f"{bare.stem}.lock"), timeout=0):
                if not dry_run:
                    shutil.rmtree(bare, ignore_errors=True)
        except Timeout:
            continue
        removed.append(bare)
    return removed

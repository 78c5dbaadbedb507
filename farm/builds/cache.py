"""The build cache on disk: list what is there, prune what is old."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.builds.sources import USED_MARK
from farm.records import BuildInfo

__all__ = [
    "MARKER",
    "SOURCE_FILE",
    "CachedBuild",
    "list_builds",
    "prune_builds",
    "prune_sources",
    "touch_build",
]

MARKER = "build.json"
SOURCE_FILE = "source.json"  # the resolved source, written next to the marker
_LAST_USED = "last_used"


class CachedBuild(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    info: BuildInfo
    size_bytes: int
    last_used: float
    source: str = Field(description="where the engine came from, with its content hash")


def touch_build(env_dir: Path) -> None:
    """Record that a build was just used (gc keeps recently used builds)."""
    (env_dir / _LAST_USED).touch()


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
        label = json.loads(path.read_text())["label"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{info.package}=={info.version}"
    return str(label)


def list_builds(cache_dir: Path, sizes: bool = True) -> list[CachedBuild]:
    """Every finished build under ``cache_dir``, most recently used first."""
    builds = []
    for marker in sorted((cache_dir / "builds").glob(f"*/{MARKER}")):
        try:
            info = BuildInfo.model_validate_json(marker.read_text())
        except (OSError, ValidationError):
            continue
        used = marker.parent / _LAST_USED
        last = used.stat().st_mtime if used.exists() else marker.stat().st_mtime
        builds.append(
            CachedBuild(
                info=info,
                size_bytes=_size(marker.parent) if sizes else 0,
                last_used=last,
                source=_source_label(marker.parent / SOURCE_FILE, info),
            )
        )
    return sorted(builds, key=lambda b: -b.last_used)


def prune_builds(cache_dir: Path, older_than_days: float, dry_run: bool = False) -> list[BuildInfo]:
    """Remove builds unused for ``older_than_days``; skip builds locked by a running build."""
    cutoff = time.time() - older_than_days * 86400
    removed = []
    root = cache_dir / "builds"
    for build in list_builds(cache_dir, sizes=False):
        if build.last_used >= cutoff:
            continue
        try:
            with FileLock(str(root / f"{build.info.build_id}.lock"), timeout=0):
                if not dry_run:
                    shutil.rmtree(build.info.env_dir, ignore_errors=True)
        except Timeout:
            continue
        removed.append(build.info)
    return removed


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

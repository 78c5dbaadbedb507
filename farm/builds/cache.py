"""The build cache on disk: list what is there, prune what is old."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, ValidationError

from farm.records import BuildInfo

__all__ = ["MARKER", "CachedBuild", "list_builds", "prune_builds", "touch_build"]

MARKER = "build.json"
_LAST_USED = "last_used"


class CachedBuild(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    info: BuildInfo
    size_bytes: int
    last_used: float


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
            CachedBuild(info=info, size_bytes=_size(marker.parent) if sizes else 0, last_used=last)
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

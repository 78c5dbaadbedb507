"""Retention of the farm's logs: what `farm logs gc` may remove, and removing it.

Two kinds of folders grow with every sweep and were never pruned:

- engine logs, ``FARM_HOME/logs/sweep-<id>-<time>/`` (one per sweep run);
- the session folders of the local Ray cluster the farm starts for this FARM_HOME,
  ``<tmp>/mtpfarm-ray-<uid>-<home digest>/session_*`` (see
  :mod:`farm.orchestrate.host_cluster`), each holding a cluster's logs. Another
  FARM_HOME's folders are its own store's business: gc never looks at them.

A folder is old when nothing in it was written for ``older_than_days``. Whatever its
age, a folder is kept when it may belong to a run still going: written in the last
hour (:data:`RECENT_S`), an engine log folder of a sweep the store lists as running,
a Ray session whose starting process is alive (the pid ends its name) or that
``session_latest`` points at while that process lives.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Literal

from farm.frozen import Frozen
from farm.paths import ray_temp_dir

__all__ = [
    "RECENT_S",
    "LogFolder",
    "LogScan",
    "find_old_logs",
    "ray_temp_dirs",
    "remove_logs",
]

RECENT_S = 3600.0
"""Folders written this recently are never removed: a run may be writing them."""

_SWEEP_LOGS = re.compile(r"^sweep-(\d+)-")
_SESSION = re.compile(r"^session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)\Z")

LogKind = Literal["engine logs", "ray session"]


class LogFolder(Frozen):
    """One folder of logs: its size, when it was last written, and why it is kept."""

    path: str
    kind: LogKind
    size_bytes: int
    last_written: float  # Unix seconds: the newest mtime of anything in it
    kept_because: str | None = None  # None: old enough and in no run's use


class LogScan(Frozen):
    """The folders :func:`find_old_logs` looked at: those to remove and those it keeps
    although they are old (with the reason)."""

    old: tuple[LogFolder, ...] = ()
    kept: tuple[LogFolder, ...] = ()

    @property
    def old_bytes(self) -> int:
        """What removing :attr:`old` frees, in bytes."""
        return sum(f.size_bytes for f in self.old)


def ray_temp_dirs(home: Path) -> list[Path]:
    """The temp folder of the local Ray cluster the farm starts for ``home``
    (:func:`farm.paths.ray_temp_dir`), if it exists: never another FARM_HOME's, whose
    runs this home's store knows nothing of."""
    temp = ray_temp_dir(home)
    return [temp] if temp.is_dir() and not temp.is_symlink() else []


def _walk(path: Path) -> Iterator[os.stat_result]:
    yield path.lstat()
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            try:
                yield (Path(dirpath) / name).lstat()
            except OSError:  # removed while walking (a live Ray rotates files)
                continue


def _measure(path: Path) -> tuple[int, float]:
    """Bytes in ``path`` (each inode once, links not followed) and its newest mtime."""
    seen: set[int] = set()
    size, newest = 0, 0.0
    for st in _walk(path):
        newest = max(newest, st.st_mtime)
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            size += st.st_size
    return size, newest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def _candidates(
    home: Path, ray_dirs: Collection[Path], running_sweeps: Collection[int]
) -> Iterator[tuple[Path, LogKind, str | None]]:
    """Every log folder with its kind and, when a live run may use it, why."""
    logs = home / "logs"
    for path in sorted(logs.iterdir()) if logs.is_dir() else []:
        if path.is_symlink() or not path.is_dir():
            continue
        m = _SWEEP_LOGS.match(path.name)
        running = m is not None and int(m.group(1)) in running_sweeps
        yield path, "engine logs", f"sweep {m.group(1)} is running" if m and running else None
    for temp in ray_dirs:
        latest = temp / "session_latest"
        current = latest.resolve() if latest.is_symlink() else None
        for path in sorted(temp.glob("session_*")):
            if path.is_symlink() or not path.is_dir():
                continue
            m = _SESSION.match(path.name)
            if m is None:
                continue
            pid = int(m.group(1))
            why = None
            if _alive(pid):
                why = f"its cluster's starting process {pid} is alive"
                if path.resolve() == current:
                    why += " (the latest session)"
            yield path, "ray session", why


def find_old_logs(
    home: Path,
    older_than_days: float,
    *,
    running_sweeps: Collection[int] = (),
    ray_dirs: Collection[Path] | None = None,
    now: float | None = None,
) -> LogScan:
    """The log folders under ``home`` (FARM_HOME) and ``ray_dirs`` (default:
    :func:`ray_temp_dirs` of ``home``) not written for ``older_than_days`` days, and the old ones
    kept because a run may still use them (module docstring). Reads only."""
    now = time.time() if now is None else now
    cutoff = now - older_than_days * 86400
    old: list[LogFolder] = []
    kept: list[LogFolder] = []
    dirs = ray_temp_dirs(home) if ray_dirs is None else ray_dirs
    for path, kind, in_use in _candidates(home, dirs, set(running_sweeps)):
        try:
            size, newest = _measure(path)
        except OSError:
            continue  # gone since it was listed
        if newest >= cutoff:
            continue
        why = in_use
        if why is None and newest > now - RECENT_S:
            why = "written in the last hour"
        folder = LogFolder(
            path=str(path), kind=kind, size_bytes=size, last_written=newest, kept_because=why
        )
        (kept if why else old).append(folder)
    return LogScan(old=tuple(old), kept=tuple(kept))


def remove_logs(folders: Collection[LogFolder]) -> list[tuple[LogFolder, str]]:
    """Remove ``folders``; return those that could not be removed whole, with why."""
    failed: list[tuple[LogFolder, str]] = []
    for folder in folders:
        shutil.rmtree(folder.path, ignore_errors=True)
        if os.path.lexists(folder.path):
            left = sum(1 for _ in _walk(Path(folder.path)))
            failed.append((folder, f"{left} entries left (permissions, or a process using them)"))
    return failed

"""Checks of what a command will write, made before it runs anything.

`farm nightly` and `farm pr` judge a sweep that took an hour and then write a report
folder: a folder that cannot be written must be found before the sweep, not after the
verdict is stored. :func:`check_publish_folder` creates the folder and writes (then
removes) a probe file in it, so a path under a file, a device (``/dev/null``), a
kernel file system (``/proc``, ``/sys``), a read-only or a full disk is refused with
the reason before anything runs.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from farm.errors import OutputError

__all__ = ["check_publish_folder"]

_KERNEL = (Path("/proc"), Path("/sys"), Path("/dev"))
_PROBE = b"mtp-farm publish probe\n" * 64  # a few KB: a full disk refuses it


def check_publish_folder(folder: Path, option: str = "--publish") -> Path:
    """``folder`` once it exists as a folder a report can be written into; OutputError
    naming ``option``, the folder and the reason otherwise."""
    where = f"{option} {folder}"
    resolved = folder.expanduser().resolve()
    if any(resolved == k or k in resolved.parents for k in _KERNEL):
        raise OutputError(f"{where}: a kernel or device file system, not a folder for reports")
    try:
        resolved.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{where}: a file is in the way; name a folder") from None
    except OSError as exc:
        raise OutputError(f"{where}: cannot create the folder ({_reason(exc)})") from None
    if not resolved.is_dir():
        raise OutputError(f"{where}: not a folder; name a folder")
    probe = resolved / f".mtp-farm-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _PROBE)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise OutputError(f"{where}: cannot write a report there ({_reason(exc)})") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return folder


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full"
    if exc.errno == errno.EROFS:
        return "the file system is read-only"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a file is in the way"
    return exc.strerror or str(exc)

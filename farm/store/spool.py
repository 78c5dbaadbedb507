"""Results the store refused, kept on local disk until the store takes them.

When the store is unreachable mid-sweep, a finished cell's result is written to
``FARM_HOME/spool/sweep-<id>/<cell id>.json`` with the store it was meant for (its
URL, password masked) instead of being lost. ``flush_spool`` writes the files meant
for a store into it and removes each one it stored; the sweep calls it at its end
and when the next sweep starts, and ``farm spool flush`` calls it by hand.

Spool files carry ``format_version`` (:mod:`farm.fileformat`; none means 1). A file
that cannot be read (truncated, newer format, no longer validates) is reported as
unreadable, with the reason, and left in place.

A spool file is on disk when ``spool_result`` returns (written, fsynced, renamed into
place, folder fsynced); when it cannot be written (a full or read-only disk), nothing
is left behind and the caller gets the OSError. Concurrent flushes (two `farm spool
flush`, or one and a sweep's end) each claim a file with a lock on it before storing
it, so each file is stored once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlmodel import Session

from farm.bounds import StoredId
from farm.errors import StoreError
from farm.fileformat import UnreadableFileError, dump_versioned, read_versioned
from farm.frozen import Frozen
from farm.masking import mask_url
from farm.records import CellResult
from farm.store.cells import CellAlreadyStoredError, save_cell_result
from farm.store.connection import answer_within
from farm.store.urls import normalize_url
from farm.yamlfile import ParseError, parse_json

__all__ = [
    "SPOOL_FORMAT",
    "FlushReport",
    "SpoolScan",
    "SpooledResult",
    "flush_spool",
    "scan_spool",
    "spool_dir",
    "spool_result",
    "spooled",
]

SPOOL_FORMAT = 2
# Version 2 keeps axis values under ``axes`` (farm.axes); version 1 wrote them flat
# (``thinking``, ``graph_mode``...), which the records' validators still fold in.
_UPGRADES = {1: lambda data: data}
"""The spool file format this code writes and reads (``format_version``)."""
_WHAT = "spooled result"


class SpooledResult(Frozen):
    """One spooled cell result and where it belongs."""

    store: str
    sweep_id: StoredId  # past 2**63 - 1 the file is unreadable, not a crash of the flush
    result: CellResult


class SpoolScan(Frozen):
    """The spool files meant for one store, and the files nobody can read."""

    files: tuple[Path, ...] = ()
    unreadable: tuple[str, ...] = ()  # "<path>: unreadable ...: <reason>; <what to do>"


class FlushReport(Frozen):
    """What a flush stored (cell ids by sweep), what it kept with the reason, the files
    it could not read (left in place), and the files another flush was storing."""

    stored: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()


def spool_dir(home: Path) -> Path:
    """The spool folder under the farm's folder ``home``."""
    return home / "spool"


def _identity(url: str) -> str:
    return mask_url(normalize_url(url))


def spool_result(home: Path, url: str, sweep_id: int, result: CellResult) -> Path:
    """Write ``result`` of sweep ``sweep_id`` for the store at ``url``; return the file.

    Durable when it returns (fsynced, as is its folder). Raises OSError when the file
    cannot be written (disk full, folder not writable); nothing is left behind then.
    """
    path = spool_dir(home) / f"sweep-{sweep_id}" / f"{result.cell_id}.json"
    record = SpooledResult(store=_identity(url), sweep_id=sweep_id, result=result)
    data = (dump_versioned(record, SPOOL_FORMAT) + "\n").encode("utf-8")
    for attempt in range(2):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            _write_durably(path, data)
            return path
        except FileNotFoundError:
            if attempt:  # a flush removed the emptied folder in between: once more
                raise
    raise AssertionError("unreachable")


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file, fsync it, rename it to ``path`` and fsync the
    folder: a driver killed (or a machine losing power) mid-write leaves no half file."""
    partial = path.with_name(path.name + ".partial")
    try:
        # 0600: the file holds the store's name and the cell's outputs, the user's alone.
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        partial.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _store_of(path: Path) -> str | None:
    """The store an unreadable file names, when its JSON still says so."""
    try:
        store = parse_json(path.read_text(encoding="utf-8")).get("store")
    except (OSError, ValueError, AttributeError, ParseError):
        return None
    return store if isinstance(store, str) else None


def _read(path: Path) -> SpooledResult:
    return read_versioned(path, SpooledResult, version=SPOOL_FORMAT, what=_WHAT, upgrades=_UPGRADES)


def _scan(
    home: Path, url: str, sweep_id: int | None
) -> tuple[list[tuple[Path, SpooledResult]], list[str]]:
    folders = f"sweep-{sweep_id}" if sweep_id is not None else "sweep-*"
    identity = _identity(url)
    mine: list[tuple[Path, SpooledResult]] = []
    unreadable: list[str] = []
    for path in sorted(spool_dir(home).glob(f"{folders}/*.json")):
        try:
            record = _read(path)
        except UnreadableFileError as exc:
            # Another store's file stays out of this store's listing, readable or not.
            if _store_of(path) in (None, identity):
                unreadable.append(str(exc))
            continue
        if record.store == identity:
            mine.append((path, record))
    return mine, unreadable


def scan_spool(home: Path, url: str, sweep_id: int | None = None) -> SpoolScan:
    """Spool files meant for the store at ``url`` (and ``sweep_id`` when given), and
    the spool files that cannot be read, each with its path and the reason."""
    mine, unreadable = _scan(home, url, sweep_id)
    return SpoolScan(files=tuple(p for p, _ in mine), unreadable=tuple(unreadable))


def spooled(home: Path, url: str, sweep_id: int | None = None) -> list[Path]:
    """Readable spool files meant for the store at ``url`` (and ``sweep_id`` when given)."""
    return list(scan_spool(home, url, sweep_id).files)


def flush_spool(engine: Engine, home: Path, url: str, sweep_id: int | None = None) -> FlushReport:
    """Store every result spooled for ``url`` (only sweep ``sweep_id`` when given).

    Each stored file is removed; a file the store still refuses (or whose values
    its driver cannot bind) is kept and named with the reason, and the files after
    it are stored, and so is a file for a cell that already has a result (first
    writer wins: a flush never replaces a stored result); an unreadable file is left
    in place and reported. Once the store cannot be reached (or does not answer within
    the store timeouts), the remaining files are kept without trying each. A file
    another flush is storing right now is left to it (``busy``). Files for other
    stores are not touched.
    """
    stored: list[str] = []
    kept: list[str] = []
    busy: list[str] = []
    unreachable: str | None = None
    mine, unreadable = _scan(home, url, sweep_id)
    for path, record in mine:
        if unreachable is not None:
            kept.append(f"{path}: not tried, {unreachable}")
            continue
        with _claim(path) as claimed:
            if claimed is None:
                busy.append(str(path))
                continue
            if not claimed:
                continue  # stored and removed by another flush since the scan
            try:  # read again: the file may have been spooled anew since the scan
                record = _read(path)
            except UnreadableFileError:
                continue  # the next scan reports it
            try:
                with answer_within(engine), Session(engine) as session:
                    save_cell_result(session, record.sweep_id, record.result, replace=False)
            except CellAlreadyStoredError as exc:
                # First writer wins: another driver (a resume on another host) stored
                # this cell. Kept, for a person to look at; never replaces it.
                kept.append(
                    f"{path}: the store already holds a result ({exc.status}) of sweep "
                    f"{record.sweep_id} cell {record.result.cell_id}, stored first by "
                    f"another driver; this {record.result.status} result is not stored "
                    "(delete the file once it is known to be stale)"
                )
                continue
            except (StoreError, SQLAlchemyError) as exc:
                reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
                first = reason[0] if reason else type(exc).__name__
                kept.append(f"{path}: {first}")
                if isinstance(exc, OperationalError) or (
                    isinstance(exc, StoreError) and isinstance(exc.__cause__, SQLAlchemyError)
                ):
                    unreachable = f"the store did not take {path.name}: {first}"
                continue
            except (ValueError, OverflowError, TypeError) as exc:
                # A value the driver cannot bind (a number past 64 bits, text no UTF-8
                # encoder takes): this file is kept and named, the next one is stored.
                first = (str(exc).splitlines() or [""])[0][:300]
                kept.append(f"{path}: the store cannot take it: {type(exc).__name__}: {first}")
                continue
            path.unlink()
        stored.append(f"sweep {record.sweep_id}: {record.result.cell_id}")
        with contextlib.suppress(OSError):  # not empty, or gone: another process's business
            path.parent.rmdir()
    return FlushReport(
        stored=tuple(stored), kept=tuple(kept), unreadable=tuple(unreadable), busy=tuple(busy)
    )


@contextlib.contextmanager
def _claim(path: Path) -> Iterator[bool | None]:
    """Lock the spool file at ``path`` for this flush: yields True when this process
    holds it, False when it was removed meanwhile (another flush stored it), None when
    another flush holds it now. The lock goes with the file, so nothing is left over."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        # Still this path's file? Removed or replaced after another flush stored it.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        yield same
    finally:
        os.close(fd)

"""Results the store refused, kept on local disk until the store takes them.

When the store is unreachable mid-sweep, a finished cell's result is written to
``FARM_HOME/spool/sweep-<id>/<cell id>.json`` with the store it was meant for (its
URL, password masked) instead of being lost. ``flush_spool`` writes the files meant
for a store into it and removes each one it stored; the sweep calls it at its end
and when the next sweep starts, and ``farm spool flush`` calls it by hand.

Spool files carry ``format_version`` (:mod:`farm.fileformat`; none means 1). A file
that cannot be read (truncated, newer format, no longer validates) is reported as
unreadable, with the reason, and left in place.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from farm.errors import StoreError
from farm.fileformat import UnreadableFileError, read_versioned, write_versioned
from farm.records import CellResult
from farm.store.db import mask_url, normalize_url
from farm.store.repository import save_cell_result

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


class SpooledResult(BaseModel):
    """One spooled cell result and where it belongs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str
    sweep_id: int
    result: CellResult


class SpoolScan(BaseModel):
    """The spool files meant for one store, and the files nobody can read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: tuple[Path, ...] = ()
    unreadable: tuple[str, ...] = ()  # "<path>: unreadable ...: <reason>; <what to do>"


class FlushReport(BaseModel):
    """What a flush stored (cell ids by sweep), what it kept with the reason, and the
    files it could not read (left in place)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stored: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()


def spool_dir(home: Path) -> Path:
    """The spool folder under the farm's folder ``home``."""
    return home / "spool"


def _identity(url: str) -> str:
    return mask_url(normalize_url(url))


def spool_result(home: Path, url: str, sweep_id: int, result: CellResult) -> Path:
    """Write ``result`` of sweep ``sweep_id`` for the store at ``url``; return the file."""
    path = spool_dir(home) / f"sweep-{sweep_id}" / f"{result.cell_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = SpooledResult(store=_identity(url), sweep_id=sweep_id, result=result)
    # Written then renamed: a driver killed mid-write leaves no half file to choke on.
    write_versioned(path, record, SPOOL_FORMAT)
    return path


def _store_of(path: Path) -> str | None:
    """The store an unreadable file names, when its JSON still says so."""
    try:
        store = json.loads(path.read_text(encoding="utf-8")).get("store")
    except (OSError, ValueError, AttributeError):
        return None
    return store if isinstance(store, str) else None


def _scan(
    home: Path, url: str, sweep_id: int | None
) -> tuple[list[tuple[Path, SpooledResult]], list[str]]:
    folders = f"sweep-{sweep_id}" if sweep_id is not None else "sweep-*"
    identity = _identity(url)
    mine: list[tuple[Path, SpooledResult]] = []
    unreadable: list[str] = []
    for path in sorted(spool_dir(home).glob(f"{folders}/*.json")):
        try:
            record = read_versioned(
                path, SpooledResult, version=SPOOL_FORMAT, what=_WHAT, upgrades=_UPGRADES
            )
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

    Each stored file is removed; a file the store still refuses is kept and named
    with the reason; an unreadable file is left in place and reported. Files for
    other stores are not touched.
    """
    stored: list[str] = []
    kept: list[str] = []
    mine, unreadable = _scan(home, url, sweep_id)
    for path, record in mine:
        try:
            with Session(engine) as session:
                save_cell_result(session, record.sweep_id, record.result)
        except (StoreError, SQLAlchemyError) as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            kept.append(f"{path}: {reason[0] if reason else type(exc).__name__}")
            continue
        path.unlink()
        stored.append(f"sweep {record.sweep_id}: {record.result.cell_id}")
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    return FlushReport(stored=tuple(stored), kept=tuple(kept), unreadable=tuple(unreadable))

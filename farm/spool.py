"""Results the store refused, kept on local disk until the store takes them.

When the store is unreachable mid-sweep, a finished cell's result is written to
``FARM_HOME/spool/sweep-<id>/<cell id>.json`` with the store it was meant for (its
URL, password masked) instead of being lost. ``flush_spool`` writes the files meant
for a store into it and removes each one it stored; the sweep calls it at its end
and when the next sweep starts, and ``farm spool flush`` calls it by hand.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from farm import store
from farm.errors import StoreError
from farm.records import CellResult

__all__ = ["FlushReport", "SpooledResult", "flush_spool", "spool_dir", "spool_result", "spooled"]


class SpooledResult(BaseModel):
    """One spooled cell result and where it belongs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str
    sweep_id: int
    result: CellResult


class FlushReport(BaseModel):
    """What a flush stored (cell ids by sweep) and what it kept, with the reason."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stored: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def spool_dir(home: Path) -> Path:
    return home / "spool"


def _identity(url: str) -> str:
    return store.mask_url(store.normalize_url(url))


def spool_result(home: Path, url: str, sweep_id: int, result: CellResult) -> Path:
    """Write ``result`` of sweep ``sweep_id`` for the store at ``url``; return the file."""
    path = spool_dir(home) / f"sweep-{sweep_id}" / f"{result.cell_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = SpooledResult(store=_identity(url), sweep_id=sweep_id, result=result)
    # Write then rename: a driver killed mid-write leaves no half file to choke on.
    partial = path.with_suffix(".json.partial")
    partial.write_text(record.model_dump_json())
    partial.replace(path)
    return path


def spooled(home: Path, url: str, sweep_id: int | None = None) -> list[Path]:
    """Spool files meant for the store at ``url`` (and ``sweep_id`` when given)."""
    folders = f"sweep-{sweep_id}" if sweep_id is not None else "sweep-*"
    identity = _identity(url)
    mine = []
    for path in sorted(spool_dir(home).glob(f"{folders}/*.json")):
        try:
            record = SpooledResult.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            continue
        if record.store == identity:
            mine.append(path)
    return mine


def flush_spool(engine: Engine, home: Path, url: str, sweep_id: int | None = None) -> FlushReport:
    """Store every result spooled for ``url`` (only sweep ``sweep_id`` when given).

    Each stored file is removed; a file the store still refuses is kept and named
    with the reason. Files for other stores are not touched.
    """
    stored: list[str] = []
    kept: list[str] = []
    for path in spooled(home, url, sweep_id):
        record = SpooledResult.model_validate_json(path.read_text())
        try:
            with store.Session(engine) as session:
                store.save_cell_result(session, record.sweep_id, record.result)
        except (StoreError, SQLAlchemyError) as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            kept.append(f"{path}: {reason[0] if reason else type(exc).__name__}")
            continue
        path.unlink()
        stored.append(f"sweep {record.sweep_id}: {record.result.cell_id}")
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    return FlushReport(stored=tuple(stored), kept=tuple(kept))

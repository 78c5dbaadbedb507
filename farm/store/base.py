"""What every repository function of the store shares: the unit of work, the sweep
lookup, the dialect's upsert.

Repository functions (:mod:`farm.store.sweeps`, :mod:`farm.store.cells`,
:mod:`farm.store.builds`, :mod:`farm.store.summaries`, :mod:`farm.store.history`, and
the stores of verdicts, alerts, spreads...) take typed records in and give typed
records out; rows stay inside the package. Every function takes an explicit
``Session``. Functions that write commit their own unit of work, so the driver can
call them between cells and a crash loses at most the cell in flight; when they fail
they roll the session back (discarding anything else pending in it) and write nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session

from farm.errors import StoreError
from farm.store.tables import SweepRow

__all__ = ["dialect_insert"]


@contextmanager
def _unit_of_work(session: Session) -> Iterator[None]:
    """Commit what the block wrote, or roll it back so the session stays usable."""
    try:
        yield
        session.commit()
    except BaseException:
        session.rollback()
        raise


def _require_sweep(session: Session, sweep_id: int, lock: bool = False) -> SweepRow:
    sweep = session.get(SweepRow, sweep_id, with_for_update=lock or None)
    if sweep is None:
        raise StoreError(f"no sweep {sweep_id}; `farm sweeps` lists them")
    return sweep


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def dialect_insert(session: Session) -> Any:
    """The store's dialect's ``insert`` (it has ``on_conflict_do_update`` / ``_nothing``)."""
    dialect = _dialect(session)
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise StoreError(f"unsupported database dialect {dialect!r}")  # pragma: no cover


def _id(value: int | None) -> int:
    # Primary keys are None only before the first flush; every caller flushes first.
    assert value is not None, "row has no primary key yet"
    return value

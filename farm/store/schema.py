"""The store's schema and identity: the revisions this farm knows, what makes a
database the farm's (its tables and revision), which tables or columns it lacks, and
whether it accepts writes. Checked by :func:`farm.store.db.upgrade` before and after
migrating.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from farm.errors import StoreDamagedError, StoreError
from farm.masking import mask_url
from farm.store.urls import _store_error

__all__ = ["MIGRATIONS_DIR", "revisions"]


MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Revision files are named after their revision id ("0008_....py"): the ids are
# known without Alembic (a test holds Alembic's own view of them to this).
_REVISION_FILE = re.compile(r"^(\d{4})_\w+\.py$")


def revisions() -> tuple[str, ...]:
    """The schema revisions this version knows, oldest first (the last is head)."""
    names = (p.name for p in (MIGRATIONS_DIR / "versions").iterdir())
    return tuple(sorted(m.group(1) for n in names if (m := _REVISION_FILE.match(n))))


_VERSION_TABLE = "alembic_version"


def _user_tables(connection: sa.Connection) -> set[str]:
    return {t for t in sa.inspect(connection).get_table_names() if not t.startswith("sqlite_")}


def _check_identity(connection: sa.Connection, url: str, create: bool) -> str | None:
    """Refuse a database that holds tables but not the farm's, or no store at all when
    ``create`` is false; before anything is migrated. The database's revision."""
    tables = _user_tables(connection)
    revision = None
    if _VERSION_TABLE in tables:
        revision = connection.execute(
            sa.text(f"SELECT version_num FROM {_VERSION_TABLE}")
        ).scalar_one_or_none()
    _judge_identity(tables, revision, url, create)
    return revision


# What SQLite says of a file that is not a database or is damaged; anything else (a
# full disk, an I/O error, a lock) says nothing of the file itself.
_NOT_A_STORE = frozenset({"SQLITE_NOTADB", "SQLITE_CORRUPT"})


def _sqlite_hint(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_FULL", "SQLITE_IOERR")):
        return "is its disk full or failing? `df` shows the space left"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return "another process holds it; try again"
    return "check the file and its folder"


def _check_sqlite_identity(path: Path, url: str, create: bool) -> None:
    """:func:`_check_identity` for an existing SQLite file, read through a read-only
    connection: the farm's own connections switch the file to WAL, a write that a
    foreign or empty file must not get."""
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return  # unreadable here: the farm's own connection reports why
    try:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = {r[0] for r in rows if not r[0].startswith("sqlite_")}
        if _VERSION_TABLE in tables:
            # A farm store: its revision is judged on the farm's own connection. A
            # read-only one cannot replay the WAL of a driver that was killed, so the
            # revision row may look missing here.
            return
        revision = None
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") not in _NOT_A_STORE:
            # The file may be fine: the disk, the folder or a lock stopped the read.
            raise StoreError(
                f"cannot read the farm store {path}: {exc} ({_sqlite_hint(exc)}; nothing "
                "was changed)"
            ) from None
        raise StoreDamagedError(
            f"{path} is not an mtp-farm store: SQLite cannot read it ({exc}); check --db "
            "or FARM_DB_URL (nothing was changed)"
        ) from None
    finally:
        connection.close()
    _judge_identity(tables, revision, url, create)


def _judge_identity(tables: set[str], revision: str | None, url: str, create: bool) -> None:
    """The verdict on a database's ``tables`` and schema ``revision``: empty (a store
    may be made when ``create``), the farm's, or refused."""
    if not tables:
        if not create:
            raise StoreError(
                f"no farm store at {mask_url(url)}: the database is empty; check --db or "
                "FARM_DB_URL (`farm run` or `farm db upgrade` creates a store)"
            )
        return
    if _VERSION_TABLE not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise StoreDamagedError(
            f"{mask_url(url)} is not an mtp-farm store: it holds tables ({shown}) but no "
            f"{_VERSION_TABLE}; point --db or FARM_DB_URL at the farm's store or at an "
            "empty database (nothing was changed)"
        )
    ours = set(revisions())
    if revision is None:
        raise StoreDamagedError(
            f"{mask_url(url)}: its {_VERSION_TABLE} table holds no revision (a migration "
            "stopped part-way, or the row was deleted), so its schema is unknown; restore a "
            "backup (nothing was changed)"
        )
    if revision not in ours:
        raise StoreDamagedError(
            f"{mask_url(url)} is not an mtp-farm store this version can use: its schema "
            f"revision {revision!r} is not one of ours ({', '.join(sorted(ours))}); "
            "a newer mtp-farm made it, or another application (nothing was changed)"
        )


def _expected_tables() -> dict[str, sa.Table]:
    # Imported here: the tables import the records, which this module must not need
    # just to build a URL. The alerts module registers its table on import.
    import farm.store.alerts  # noqa: F401
    from farm.store.tables import metadata

    return dict(metadata.tables)


def _check_tables(connection: sa.Connection, url: str) -> None:
    """StoreDamagedError naming every table or column of the schema that is missing."""
    inspector = sa.inspect(connection)
    present = _user_tables(connection)
    problems = []
    for name, table in _expected_tables().items():
        if name not in present:
            problems.append(f"table {name} is missing")
            continue
        columns = {c["name"] for c in inspector.get_columns(name)}
        lost = [c.name for c in table.columns if c.name not in columns]
        if lost:
            problems.append(f"table {name} lacks column(s) {', '.join(lost)}")
    if problems:
        raise StoreDamagedError(
            f"the store at {mask_url(url)} is damaged: {'; '.join(problems)}; restore it "
            "from a backup, or point --db or FARM_DB_URL at another store"
        )


def _check_writable(engine: Engine, url: str) -> None:
    """StoreError when the store refuses writes (a read-only file or database user).

    Probes with an update that changes nothing, rolled back."""
    try:
        with engine.connect() as connection, connection.begin() as transaction:
            connection.execute(sa.text(f"UPDATE {_VERSION_TABLE} SET version_num = version_num"))
            transaction.rollback()
    except SQLAlchemyError as exc:
        raise _store_error(
            url,
            "the farm store does not accept writes",
            exc,
            hint="this command writes to the store: make the file (and its folder) "
            "writable, or use another store (--db, FARM_DB_URL)",
        ) from exc

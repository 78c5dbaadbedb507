"""Opening the farm store: schema migrations, and what to report when reading it fails.

The same code runs on SQLite (the default, one file under ``FARM_HOME``) and on
PostgreSQL (for teams). The schema is owned by Alembic: ``upgrade`` brings any
database to the head revision, and ``open_store`` does that before handing out an
engine, so a store is never used with a stale schema. URLs are read by
:mod:`farm.store.urls`, engines made by :mod:`farm.store.connection`, the schema and
identity checked by :mod:`farm.store.schema`, damaged rows found by
:mod:`farm.store.damage`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import sqlalchemy as sa
from filelock import FileLock
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from farm.errors import StoreDamagedError, StoreError
from farm.masking import mask_url
from farm.store.connection import _SQLITE_BUSY_TIMEOUT_S, connect
from farm.store.damage import damaged_rows
from farm.store.schema import (
    MIGRATIONS_DIR,
    _check_identity,
    _check_sqlite_identity,
    _check_tables,
    _check_writable,
    revisions,
)
from farm.store.urls import _store_error, normalize_url, sqlite_file

if TYPE_CHECKING:
    # Imported where used: opening a store that is at head needs no Alembic, and every
    # CLI command that reads the store pays the import.
    from alembic.config import Config

__all__ = ["open_store", "read_error", "upgrade"]


# Any constant: the PostgreSQL advisory lock that serializes farm migrations.
_PG_MIGRATION_LOCK = 0x6D7470666172


def _alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Config values go through configparser interpolation: a '%' in a password must
    # be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, create: bool = True) -> str:
    """Run ``alembic upgrade head`` on ``url``; return the revision the database is at.

    Idempotent: an up-to-date database is left alone. Raises StoreError when the
    database cannot be reached or a migration fails, or (``create`` false) holds no
    store yet; StoreDamagedError when it holds tables but not the farm's (nothing is
    added to it) or a table of the farm's is missing.
    """
    url = normalize_url(url)
    path = sqlite_file(url)
    if path is not None and not path.parent.is_dir():
        # Checked before the lock, whose file would otherwise make the folder.
        raise _store_error(
            url, "cannot connect to the farm store", FileNotFoundError(f"no folder {path.parent}")
        )
    # Under the lock from the identity check on: a file another process is creating
    # right now has tables but no revision yet.
    with _migration_lock(url):
        return _upgrade_locked(url, create)


def _upgrade_locked(url: str, create: bool) -> str:
    path = sqlite_file(url)
    if path is not None and path.is_file():
        _check_sqlite_identity(path, url, create)
    engine = connect(url)
    try:
        try:
            connection = engine.connect()
        except SQLAlchemyError as exc:
            raise _store_error(url, "cannot connect to the farm store", exc) from exc
        try:
            with connection, connection.begin():
                if connection.dialect.name == "postgresql":
                    # A migration may rewrite big tables: not bound by the farm's timeout.
                    connection.execute(sa.text("SET LOCAL statement_timeout = 0"))
                    connection.execute(
                        sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
                    )
                revision = _check_identity(connection, url, create)
                if revision != revisions()[-1]:
                    revision = _migrate(connection, url)
                _check_tables(connection, url)
        except SQLAlchemyError as exc:
            raise _migration_error(url, exc) from exc
    finally:
        engine.dispose()
    if revision is None:
        raise StoreError(f"{mask_url(url)}: no schema revision after `alembic upgrade head`")
    return revision


def _migrate(connection: sa.Connection, url: str) -> str | None:
    """``alembic upgrade head`` on ``connection``; the revision it left."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.util.exc import CommandError

    cfg = _alembic_config(url)
    # Hand env.py our connection so the SQLite pragmas and timeouts apply.
    cfg.attributes["connection"] = connection
    try:
        command.upgrade(cfg, "head")
    except CommandError as exc:
        raise _migration_error(url, exc) from exc
    return MigrationContext.configure(connection).get_current_revision()


def _migration_error(url: str, exc: Exception) -> StoreError:
    return _store_error(
        url,
        "cannot migrate the farm store",
        exc,
        hint="if the database was migrated by a newer mtp-farm, upgrade mtp-farm; "
        "otherwise the reason given is the failing statement's (restore a backup)",
    )


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes: two farms opening a
    new store at once would otherwise both create its tables (PostgreSQL takes an
    advisory lock inside the migration's transaction instead)."""
    path = sqlite_file(url)
    if path is None:
        yield
        return
    with FileLock(f"{path}.migrate.lock", timeout=_SQLITE_BUSY_TIMEOUT_S):
        yield


def open_store(url: str, *, create: bool = True) -> Engine:
    """Normalize ``url``, migrate the database to head and return an engine for it.

    ``create`` false (commands that only read, or change what is stored): the store
    must exist already; nothing is created, a typo in ``--db`` is an error. ``create``
    true: a new store is made when there is none, and the store must be writable.
    Raises StoreError (URL shown with its password masked) when the database is
    unreachable, cannot be migrated, or is not writable; StoreDamagedError when it is
    not a farm store or a table is missing.
    """
    url = normalize_url(url)
    path = sqlite_file(url)
    try:
        exists = path is not None and path.exists()
    except OSError as exc:  # a name too long, a path through a file
        shown = str(path)[:80] + ("..." if len(str(path)) > 80 else "")
        raise StoreError(
            f"database URL sqlite:///{shown}: the store file cannot be used ({exc.strerror}); "
            "check --db or FARM_DB_URL"
        ) from None
    if path is not None and not create and not exists:
        raise StoreError(
            f"no farm store at {path}: the file does not exist; check --db or "
            "FARM_DB_URL (`farm run` creates a store)"
        )
    if path is not None and path.is_dir():
        raise StoreError(f"{path} is a folder, not a store file; check --db or FARM_DB_URL")
    upgrade(url, create=create)
    engine = connect(url)
    if create:
        try:
            _check_writable(engine, url)
        except BaseException:
            engine.dispose()
            raise
    return engine


def read_error(engine: Engine, url: str, exc: BaseException) -> StoreError | None:
    """The StoreError to report when reading the store raised ``exc``: the damaged rows
    when there are any, a StoreError for a database error; None when the store is not
    to blame (re-raise ``exc``)."""
    try:
        rows = damaged_rows(engine)
    except SQLAlchemyError:
        rows = []
    if rows:
        return StoreDamagedError(
            f"the store at {mask_url(url)} holds rows this farm cannot read "
            "(fix or delete them, or restore a backup):\n  " + "\n  ".join(rows)
        )
    if isinstance(exc, SQLAlchemyError):
        return _store_error(url, "the farm store refused the command", exc)
    return None

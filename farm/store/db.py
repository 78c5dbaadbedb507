"""Database URLs, engines and schema migrations for the farm store.

The same code runs on SQLite (the default, one file under ``FARM_HOME``) and on
PostgreSQL (for teams). The schema is owned by Alembic: ``upgrade`` brings any
database to the head revision, and ``open_store`` does that before handing out an
engine, so a store is never used with a stale schema.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util.exc import CommandError
from filelock import FileLock
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry

from farm.errors import StoreError
from farm.paths import farm_home
from farm.settings import get_settings

__all__ = [
    "MIGRATIONS_DIR",
    "connect",
    "default_db_url",
    "mask_url",
    "normalize_url",
    "open_store",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Long enough for a loaded server on the LAN, short enough that a typo in the host
# fails a CLI command in seconds instead of the OS default of minutes.
_PG_CONNECT_TIMEOUT_S = 10
# SQLite writers wait this long for a lock instead of failing with "database is locked";
# the driver writes while a report may be reading.
_SQLITE_BUSY_TIMEOUT_S = 30.0
# Any constant: the PostgreSQL advisory lock that serializes farm migrations.
_PG_MIGRATION_LOCK = 0x6D7470666172


def default_db_url() -> str:
    """The store URL: ``FARM_DB_URL`` if set, else SQLite in ``FARM_HOME`` (``~/.mtp-farm``).

    Creates the ``FARM_HOME`` folder when the SQLite default is used.
    """
    configured = get_settings().store.db_url
    if configured is not None:
        return configured.get_secret_value()
    home = farm_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'farm.db'}"


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        raise StoreError(
            f"malformed database URL {mask_url(url)}; use sqlite:///PATH or "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None


def normalize_url(url: str) -> str:
    """Rewrite ``url`` to the driver the farm uses; raise StoreError for other databases.

    ``postgresql://`` and ``postgres://`` become ``postgresql+psycopg://`` (psycopg 3);
    ``sqlite:///PATH`` is kept, with ``~`` in PATH expanded.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreError(
            "database URL has no scheme; use sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
        )
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        url = f"postgresql+psycopg://{rest}"
    elif scheme == "sqlite":
        if rest.startswith("/~"):
            url = f"sqlite:///{Path(rest[1:]).expanduser()}"
    else:
        raise StoreError(
            f"unsupported database URL scheme {scheme!r} in {mask_url(url)}; "
            "the farm stores to sqlite:///PATH or postgresql://..."
        )
    _parse(url)
    return url


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, safe to print or log."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        # Unparseable: do not echo anything that may hold a secret after the scheme.
        return url.partition("://")[0] + "://***"


def connect(url: str) -> Engine:
    """Create an engine for ``url`` (already normalized). Does not open a connection.

    SQLite connections use WAL, a busy timeout and enforced foreign keys; PostgreSQL
    connections get a connect timeout unless the URL sets ``connect_timeout``.
    """
    parsed = _parse(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": _SQLITE_BUSY_TIMEOUT_S}
        engine = sa.create_engine(parsed, **kwargs)
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if "connect_timeout" not in parsed.query:
        kwargs["connect_args"] = {"connect_timeout": _PG_CONNECT_TIMEOUT_S}
    return sa.create_engine(parsed, pool_pre_ping=True, **kwargs)


def _sqlite_pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets reports read while the driver writes; foreign keys are off by
        # default in SQLite and the schema relies on them.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Config values go through configparser interpolation: a '%' in a password must
    # be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str) -> str:
    """Run ``alembic upgrade head`` on ``url``; return the revision the database is at.

    Idempotent: an up-to-date database is left alone. Raises StoreError when the
    database cannot be reached or a migration fails.
    """
    url = normalize_url(url)
    cfg = _alembic_config(url)
    engine = connect(url)
    try:
        try:
            connection = engine.connect()
        except SQLAlchemyError as exc:
            raise _store_error(url, "cannot connect to the farm store", exc) from exc
        try:
            with _migration_lock(url), connection, connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(
                        sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
                    )
                # Hand env.py our connection so the SQLite pragmas and timeouts apply.
                cfg.attributes["connection"] = connection
                command.upgrade(cfg, "head")
                revision = MigrationContext.configure(connection).get_current_revision()
        except (SQLAlchemyError, CommandError) as exc:
            raise _store_error(
                url,
                "cannot migrate the farm store",
                exc,
                hint="if the database was migrated by a newer mtp-farm, upgrade mtp-farm; "
                "otherwise the error above names the failing statement",
            ) from exc
    finally:
        engine.dispose()
    if revision is None:
        raise StoreError(f"{mask_url(url)}: no schema revision after `alembic upgrade head`")
    return revision


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes: two farms opening a
    new store at once would otherwise both create its tables (PostgreSQL takes an
    advisory lock inside the migration's transaction instead)."""
    parsed = _parse(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        yield
        return
    with FileLock(f"{path}.migrate.lock", timeout=_SQLITE_BUSY_TIMEOUT_S):
        yield


def open_store(url: str) -> Engine:
    """Normalize ``url``, migrate the database to head and return an engine for it.

    Raises StoreError (URL shown with its password masked) when the database is
    unreachable or cannot be migrated.
    """
    url = normalize_url(url)
    upgrade(url)
    return connect(url)


def _store_error(url: str, what: str, exc: BaseException, hint: str | None = None) -> StoreError:
    parsed = _parse(url)
    # The driver's own message, not SQLAlchemy's wrapper with SQL text and a doc link.
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    detail = reason[0] if reason else type(exc).__name__
    if parsed.password:
        detail = detail.replace(str(parsed.password), "***")
    if hint is None and parsed.get_backend_name() == "postgresql":
        hint = (
            "is PostgreSQL running at that host and port, does the database exist and "
            "may this user connect? Set FARM_DB_URL to use another store"
        )
    elif hint is None:
        hint = "does the folder exist and is it writable? Set FARM_DB_URL to use another store"
    return StoreError(f"{what} at {mask_url(url)}: {detail}; {hint}")

"""Database URLs, engines and schema migrations for the farm store.

The same code runs on SQLite (the default, one file under ``FARM_HOME``) and on
PostgreSQL (for teams). The schema is owned by Alembic: ``upgrade`` brings any
database to the head revision, and ``open_store`` does that before handing out an
engine, so a store is never used with a stale schema.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from filelock import FileLock
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry

from farm.errors import StoreDamagedError, StoreError
from farm.job_text import user_path
from farm.masking import mask_secrets, secret_values
from farm.paths import farm_home
from farm.settings import get_settings
from farm.store.text import install as install_stored_text

if TYPE_CHECKING:
    # Imported where used: opening a store that is at head needs neither Alembic nor
    # (for SQLite) psycopg, and every CLI command that reads the store pays the import.
    import psycopg
    from alembic.config import Config

__all__ = [
    "MIGRATIONS_DIR",
    "answer_within",
    "call_timeout_s",
    "connect",
    "damaged_rows",
    "default_db_url",
    "mask_url",
    "normalize_url",
    "open_store",
    "read_error",
    "sqlite_file",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Revision files are named after their revision id ("0008_....py"): the ids are
# known without Alembic (a test holds Alembic's own view of them to this).
_REVISION_FILE = re.compile(r"^(\d{4})_\w+\.py$")

# TCP keepalive probes after FARM_DB_KEEPALIVE_IDLE_S of silence: this many, this far
# apart; a connection whose peer stopped answering is dropped after idle + 30 s.
_PG_KEEPALIVE_INTERVAL_S = 10
_PG_KEEPALIVE_COUNT = 3
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
    try:
        home = farm_home()
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        home = get_settings().paths.home
        raise StoreError(
            f"FARM_HOME {home} cannot be used as the farm's folder ({exc.strerror or exc}); "
            "set FARM_HOME to a folder, or FARM_DB_URL to a store"
        ) from None
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
        if rest.partition("/")[0].count("@") > 1:
            # The driver would take the password's tail for the host and print it in
            # its error ("failed to resolve host 'tail@host'"): refused before it runs.
            raise StoreError(
                f"database URL {scheme}://***: the password holds an '@'; write it "
                "percent-encoded, as %40"
            )
        url = f"postgresql+psycopg://{rest}"
    elif scheme == "sqlite":
        if rest.startswith("/~"):
            try:
                url = f"sqlite:///{user_path(rest[1:])}"
            except ValueError as exc:
                raise StoreError(f"database URL sqlite:///{rest[1:]}: {exc}") from None
    else:
        raise StoreError(
            f"unsupported database URL scheme {scheme!r} in {mask_url(url)}; "
            "the farm stores to sqlite:///PATH or postgresql://..."
        )
    _parse(url)
    return url


def mask_url(url: str) -> str:
    """``url`` with its password and secret-looking query parameters (``?password=``,
    ``sslpassword``, ...) replaced by ``***`` (:func:`farm.masking.mask_secrets`), safe
    to print, log or write to a spool file."""
    try:
        return mask_secrets(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        # Unparseable: do not echo anything that may hold a secret after the scheme.
        return url.partition("://")[0] + "://***"


def connect(url: str) -> Engine:
    """Create an engine for ``url`` (already normalized). Does not open a connection.

    SQLite connections use WAL, a busy timeout and enforced foreign keys. PostgreSQL
    connections get the store settings' connect timeout, TCP keepalives (and a TCP user
    timeout) and statement timeout, each unless the URL sets it; :func:`answer_within`
    bounds a block of calls on the engine.
    """
    parsed = _parse(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": _SQLITE_BUSY_TIMEOUT_S}
        engine = sa.create_engine(parsed, **kwargs)
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        install_stored_text(engine)
        return engine
    engine = sa.create_engine(parsed, pool_pre_ping=True, connect_args=_pg_connect_args(parsed))
    opened: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
    _OPENED[engine] = opened

    def track(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        opened.add(dbapi_connection)  # type: ignore[arg-type]

    sa.event.listen(engine, "connect", track)
    install_stored_text(engine)
    return engine


def call_timeout_s() -> float:
    """Seconds a store call may take before :func:`answer_within` gives up on it: the
    statement timeout plus the connect timeout (store settings)."""
    settings = get_settings().store
    return settings.statement_timeout_s + settings.connect_timeout_s


def _pg_connect_args(parsed: URL) -> dict[str, Any]:
    settings = get_settings().store
    idle = settings.keepalive_idle_s
    defaults: dict[str, Any] = {
        "connect_timeout": max(2, round(settings.connect_timeout_s)),
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": _PG_KEEPALIVE_INTERVAL_S,
        "keepalives_count": _PG_KEEPALIVE_COUNT,
        # Keepalives probe only an idle connection; this bounds unacknowledged data.
        "tcp_user_timeout": (idle + _PG_KEEPALIVE_INTERVAL_S * _PG_KEEPALIVE_COUNT) * 1000,
    }
    args = {k: v for k, v in defaults.items() if k not in parsed.query}
    # A transaction left open by a client that gave up (answer_within) must not hold
    # its row locks for good: the server ends it after twice the client's patience.
    server = (
        f"-c statement_timeout={int(settings.statement_timeout_s * 1000)} "
        f"-c idle_in_transaction_session_timeout={int(2 * call_timeout_s() * 1000)}"
    )
    given = parsed.query.get("options")  # the URL's own options come last, so they win
    args["options"] = f"{server} {given}" if isinstance(given, str) else server
    return args


# The PostgreSQL connections each engine opened, for answer_within to cut.
_OPENED: weakref.WeakKeyDictionary[Engine, weakref.WeakSet[psycopg.Connection[Any]]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.contextmanager
def answer_within(engine: Engine, seconds: float | None = None) -> Iterator[None]:
    """Give the store ``seconds`` (default :func:`call_timeout_s`) to answer the block.

    A PostgreSQL that goes silent (a network partition, a proxy that stops forwarding)
    answers no statement and trips no server-side timeout, and a socket whose peer's
    TCP stack still acknowledges never fails on its own. When the time is up, the
    sockets of the engine's connections are shut down, so the blocked call fails as on
    a dropped connection, and the block raises StoreError saying the store did not
    answer. SQLite engines are not bounded (a local file: its busy timeout applies).
    """
    opened = _OPENED.get(engine)
    if opened is None:
        yield
        return
    limit = call_timeout_s() if seconds is None else seconds
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        for connection in list(opened):
            _shut_down(connection)

    timer = threading.Timer(limit, cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    except SQLAlchemyError as exc:
        if not expired.is_set():
            raise
        where = engine.url.render_as_string(hide_password=True)
        raise StoreError(
            f"the store at {where} did not answer within {limit:.0f} s (a silent network "
            "or server); FARM_DB_STATEMENT_TIMEOUT_S and FARM_DB_CONNECT_TIMEOUT_S set how "
            "long the farm waits"
        ) from exc
    finally:
        timer.cancel()


def _shut_down(connection: psycopg.Connection[Any]) -> None:
    """Shut down a connection's socket under libpq: a thread waiting on it wakes up to
    a closed connection. The descriptor itself stays libpq's to close."""
    import psycopg

    try:
        fd = connection.pgconn.socket
    except psycopg.Error:
        return  # closed already
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


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


def revisions() -> tuple[str, ...]:
    """The schema revisions this version knows, oldest first (the last is head)."""
    names = (p.name for p in (MIGRATIONS_DIR / "versions").iterdir())
    return tuple(sorted(m.group(1) for n in names if (m := _REVISION_FILE.match(n))))


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


# Store identity and damage: what makes a database the farm's, and which table or
# row of it cannot be read.

_VERSION_TABLE = "alembic_version"


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store (``sqlite:///file:PATH?mode=ro&uri=true`` too);
    None for PostgreSQL and in-memory databases."""
    parsed = _parse(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    if path.startswith("file:"):
        path = path.removeprefix("file:").split("?", 1)[0]
    return Path(path)


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


_IN_LIST = re.compile(r"^\s*(\w+)\s+IN\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)


def _allowed_values(table: sa.Table) -> dict[str, tuple[str, ...]]:
    """Column -> allowed words, from the table's ``col IN ('a', 'b')`` check constraints."""
    allowed = {}
    for constraint in table.constraints:
        if isinstance(constraint, sa.CheckConstraint):
            match = _IN_LIST.match(str(constraint.sqltext))
            if match:
                allowed[match.group(1)] = tuple(re.findall(r"'([^']*)'", match.group(2)))
    return allowed


_PYTHON_TYPES: tuple[tuple[type[sa.types.TypeEngine[Any]], tuple[type, ...], str], ...] = (
    (sa.Boolean, (bool, int), "a boolean"),
    (sa.Integer, (int,), "a whole number"),
    (sa.Float, (int, float), "a number"),
    (sa.String, (str,), "text"),
)


def _value_problem(
    column: sa.Column[Any],
    raw: Any,
    process: Callable[[Any], Any] | None,
    allowed: tuple[str, ...] | None,
) -> str | None:
    """What is wrong with one stored value, or None."""
    shown = repr(raw) if len(repr(raw)) <= 60 else repr(raw)[:57] + "..."
    if process is not None:
        try:
            process(raw)
        except Exception as exc:  # the column type's own reader: any failure is damage
            base = getattr(column.type, "impl", column.type)
            kind = (
                "valid JSON"
                if isinstance(base, sa.JSON)
                else "a timestamp"
                if isinstance(base, sa.DateTime)
                else f"a {str(base).lower()} value"
            )
            return f"{shown} is not {kind} ({exc})"
    if allowed is not None and raw not in allowed:
        return f"{shown} is not one of {', '.join(allowed)}"
    for sql_type, python_types, what in _PYTHON_TYPES:
        if isinstance(column.type, sql_type) and process is None:
            if not isinstance(raw, python_types) or (
                sql_type is not sa.Boolean and isinstance(raw, bool)
            ):
                return f"{shown} is not {what}"
            break
    return None


def _reader(column: sa.Column[Any], dialect: sa.Dialect) -> Callable[[Any], Any] | None:
    """The column type's own reader of a raw value on ``dialect`` (SQLite keeps JSON and
    timestamps as text); None where the driver reads values itself (PostgreSQL)."""
    try:
        return column.type.dialect_impl(dialect).result_processor(dialect, None)
    except (TypeError, ValueError, NotImplementedError):
        return None


def damaged_rows(engine: Engine, limit: int = 20) -> list[str]:
    """``row <table> id=N: <column>: <problem>`` for stored values this farm cannot read
    (malformed JSON, an unparseable timestamp, a word outside its column's allowed
    values, a value of the wrong type), at most ``limit``. Reads every row: call it
    when reading the store failed, to say where."""
    problems: list[str] = []
    with engine.connect() as connection:
        present = _user_tables(connection)
        dialect = connection.dialect
        for name, table in _expected_tables().items():
            if name not in present:
                continue
            allowed = _allowed_values(table)
            readers = {c.name: _reader(c, dialect) for c in table.columns}
            keys = [c.name for c in table.primary_key.columns]
            # Raw values: no type processing, so one bad value cannot stop the scan.
            rows = connection.exec_driver_sql(f'SELECT * FROM "{name}"')
            for row in rows.mappings():
                for column in table.columns:
                    raw = row.get(column.name)
                    if raw is None:
                        continue
                    problem = _value_problem(
                        column, raw, readers[column.name], allowed.get(column.name)
                    )
                    if problem:
                        ident = " ".join(f"{k}={row.get(k)}" for k in keys)
                        problems.append(f"row {name} {ident}: {column.name}: {problem}")
                        if len(problems) >= limit:
                            return problems
    return problems


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


# What the driver's own words say went wrong, before the generic hint of the backend.
_DRIVER_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"database is locked|database table is locked", re.IGNORECASE),
        "another process holds the store's write lock (a running farm command or a sqlite3 "
        "shell): wait for it to finish, or close it",
    ),
    (
        re.compile(r"statement timeout|canceling statement", re.IGNORECASE),
        "the store took longer than its statement timeout (FARM_DB_STATEMENT_TIMEOUT_S, or "
        "options=-c statement_timeout in the URL): raise it, or narrow the command",
    ),
    (
        re.compile(r"lock timeout|could not obtain lock", re.IGNORECASE),
        "another session holds a lock on the store: wait for it, or find it in pg_stat_activity",
    ),
)


def _hint_for(detail: str) -> str | None:
    return next((hint for pattern, hint in _DRIVER_HINTS if pattern.search(detail)), None)


def _store_error(url: str, what: str, exc: BaseException, hint: str | None = None) -> StoreError:
    parsed = _parse(url)
    # The driver's own message, not SQLAlchemy's wrapper with SQL text and a doc link.
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    detail = reason[0] if reason else type(exc).__name__
    secrets = [str(parsed.password)] if parsed.password else []
    for secret in [*secrets, *secret_values(url)]:
        detail = detail.replace(secret, "***")
    # The driver's own words, when they say what went wrong, beat the caller's guess.
    hint = _hint_for(detail) or hint
    if hint is None and parsed.get_backend_name() == "postgresql":
        hint = (
            "is PostgreSQL running at that host and port, does the database exist and "
            "may this user connect? Set FARM_DB_URL to use another store"
        )
    elif hint is None:
        hint = "does the folder exist and is it writable? Set FARM_DB_URL to use another store"
    return StoreError(f"{what} at {mask_url(url)}: {detail}; {hint}")

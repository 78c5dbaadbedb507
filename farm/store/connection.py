"""Engines on a store URL: SQLite with WAL, a busy timeout and foreign keys; PostgreSQL
with connect, keepalive and statement timeouts; :func:`answer_within` bounds a block of
calls on a store that went silent.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry

from farm.errors import StoreError
from farm.settings import get_settings
from farm.store.text import install as install_stored_text
from farm.store.urls import _parse

if TYPE_CHECKING:
    # Imported where used: a SQLite store needs no psycopg.
    import psycopg

__all__ = ["answer_within", "call_timeout_s", "connect"]


# TCP keepalive probes after FARM_DB_KEEPALIVE_IDLE_S of silence: this many, this far
# apart; a connection whose peer stopped answering is dropped after idle + 30 s.
_PG_KEEPALIVE_INTERVAL_S = 10
_PG_KEEPALIVE_COUNT = 3
# SQLite writers wait this long for a lock instead of failing with "database is locked";
# the driver writes while a report may be reading.
_SQLITE_BUSY_TIMEOUT_S = 30.0


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

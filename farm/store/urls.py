"""Store URLs: the default store, normalizing a URL to the farm's driver, the SQLite
file it names, and the StoreError that says what failed at a URL (with the driver's
own words and a hint; the URL masked by :func:`farm.masking.mask_url`).
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from farm.errors import StoreError
from farm.job_text import user_path
from farm.masking import mask_url, secret_values
from farm.paths import farm_home
from farm.settings import get_settings

__all__ = ["default_db_url", "normalize_url", "sqlite_file"]


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

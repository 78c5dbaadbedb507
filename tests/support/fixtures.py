"""Fixtures the tests share, registered for every test by ``tests/conftest.py``.

``db_url`` asks for ``pg_url``, the fresh PostgreSQL database of
``tests/integration/conftest.py``: only integration tests use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.fakes.tcp_proxy import TcpProxy

__all__ = ["db_url", "proxied_url"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store's URL, once on SQLite and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'farm.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture()
def proxied_url(pg_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """The test's PostgreSQL database behind a :class:`TcpProxy`: its URL and the proxy."""
    url = sa.make_url(pg_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    try:
        yield url.set(port=proxy.port).render_as_string(hide_password=False), proxy
    finally:
        proxy.close()

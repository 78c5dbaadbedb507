"""What every `farm` sub-app shares: the consoles, `--db`, the sweep argument, the error
exit.

Errors go to standard error as one line, ``error: <what failed, where, what to do>``,
and exit with status 2 (:func:`fail`); a command never ends in a traceback for a
:class:`~farm.errors.FarmError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text
from sqlmodel import Session

from farm import store
from farm.errors import FarmError

__all__ = [
    "DbOption",
    "SweepArg",
    "console",
    "db_url",
    "err_console",
    "fail",
    "open_session",
    "parse_pairs",
    "resolve_sweep",
]

console = Console()
err_console = Console(stderr=True)

# FARM_DB_URL is read by farm.settings (through store.default_db_url), not by typer.
DbOption = Annotated[
    str | None,
    typer.Option("--db", help="SQLAlchemy URL; default: FARM_DB_URL, else SQLite in FARM_HOME"),
]


_SWEEP_FORM = "sweep {value!r}: expected a sweep id or 'latest' (`farm sweeps` lists them)"


def _sweep_argument(value: str) -> str:
    # Checked when the command line is parsed: a bad id fails before the store opens.
    if value != "latest" and not value.isdigit():
        raise typer.BadParameter(_SWEEP_FORM.format(value=value))
    return value


SweepArg = Annotated[str, typer.Argument(help="sweep id or 'latest'", callback=_sweep_argument)]


def fail(problem: FarmError | str, code: int = 2) -> typer.Exit:
    """Print ``error: <problem>`` to standard error; return the exit to raise."""
    # Text, not markup: a message may hold brackets (paths, lists) rich would eat.
    err_console.print(Text.assemble(("error:", "red"), f" {problem}"), soft_wrap=True)
    return typer.Exit(code)


def db_url(db: str | None) -> str:
    """``--db`` when given, else the configured store (FARM_DB_URL, else SQLite)."""
    return db or store.default_db_url()


@contextmanager
def open_session(db: str | None) -> Iterator[Session]:
    """A session on the store at ``--db`` (migrated first); the engine is disposed after.

    Raises StoreError when the store cannot be reached or migrated.
    """
    engine = store.open_store(db_url(db))
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def resolve_sweep(session: Session, sweep: str | int) -> int:
    """The id of sweep ``sweep``: a sweep id, or ``'latest'`` for the newest stored one.

    Raises FarmError for anything else and when the store holds no sweep.
    """
    if sweep == "latest":
        found = store.latest_sweep_id(session)
        if found is None:
            raise FarmError("the store holds no sweep yet; run `farm run JOB.yaml`")
        return found
    try:
        return int(sweep)
    except ValueError:
        raise FarmError(_SWEEP_FORM.format(value=sweep)) from None


def parse_pairs(values: Sequence[str] | None, option: str, form: str = "A=B") -> dict[str, str]:
    """``KEY=VALUE`` option values as a mapping; anything else is a usage error that
    quotes the option, the value and the expected ``form``."""
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise typer.BadParameter(f"{option} {item!r}: expected {form}")
        out[key] = value
    return out

"""`farm sweeps`, `farm export` and `farm db upgrade`: the SQL store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from farm import store
from farm.cli.common import (
    DbOption,
    SweepArg,
    console,
    db_url,
    err_console,
    fail,
    open_session,
    resolve_sweep,
)
from farm.errors import FarmError
from farm.store.export import dump_sweep_export

__all__ = ["db_app", "store_app"]

store_app = typer.Typer()
db_app = typer.Typer(help="The SQL store.", no_args_is_help=True)


@store_app.command()
def sweeps(db: DbOption = None, limit: int = 20) -> None:
    """List recent sweeps."""
    try:
        with open_session(db) as session:
            rows = store.list_sweeps(session, limit)
    except FarmError as exc:
        raise fail(exc) from None
    for s in rows:
        console.print(
            f"{s.id:>5}  {s.job:<20} {s.status:<12} {s.started_at:%Y-%m-%d %H:%M}  "
            f"ok={s.cells_ok} failed={s.cells_failed} planned={s.cells_planned}"
        )


@store_app.command()
def export(
    sweep: SweepArg = "latest",
    out: Annotated[Path | None, typer.Option(help="write here instead of standard output")] = None,
    db: DbOption = None,
) -> None:
    """Write a stored sweep (cells, builds, every request's counters) as JSON, the
    input of `bench/detection.py --recorded` and of analyses away from the store."""
    try:
        with open_session(db) as session:
            record = store.load_sweep(session, resolve_sweep(session, sweep))
    except FarmError as exc:
        raise fail(exc) from None
    text = dump_sweep_export(record)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n", encoding="utf-8")
        err_console.print(Text(f"sweep {record.sweep_id} -> {out}"))


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Create or migrate the store's tables to the newest schema."""
    url = db_url(db)
    try:
        revision = store.upgrade(store.normalize_url(url))
    except FarmError as exc:
        raise fail(exc) from None
    console.print(f"store at {store.mask_url(url)} is at revision {revision}")

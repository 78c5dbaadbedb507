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
    check_output,
    check_sweep_statuses,
    console,
    db_url,
    err_console,
    fail,
    open_session,
    resolve_sweep,
    write_output,
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
            check_sweep_statuses(*(s.status for s in rows))
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
        if out is not None:
            check_output(out, db)  # before the store is read: nothing half-done
        with open_session(db) as session:
            record = store.load_sweep(session, resolve_sweep(session, sweep))
            check_sweep_statuses(record.status)
        text = dump_sweep_export(record)
        if out is not None:
            write_output(out, text + "\n")
    except FarmError as exc:
        raise fail(exc) from None
    if out is None:
        typer.echo(text)
    else:
        err_console.print(Text(f"sweep {record.sweep_id} -> {out}"))


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Create or migrate the store's tables to the newest schema."""
    try:
        url = db_url(db)
        revision = store.upgrade(store.normalize_url(url))
    except FarmError as exc:
        raise fail(exc) from None
    console.print(f"store at {store.mask_url(url)} is at revision {revision}")

"""`farm spool list|flush`: results kept on disk while the store was unreachable."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from farm import store
from farm.errors import FarmError
from farm.paths import farm_home
from farm.spool import flush_spool, spooled

__all__ = ["spool_app"]

spool_app = typer.Typer(help="Results spooled to disk when the store refused them.")
console = Console()

DbOption = Annotated[
    str | None,
    typer.Option("--db", envvar="FARM_DB_URL", help="SQLAlchemy URL; default: SQLite in FARM_HOME"),
]


@spool_app.command("list")
def list_spool(db: DbOption = None) -> None:
    """List the spooled results meant for the store."""
    url = db or store.default_db_url()
    try:
        paths = spooled(farm_home(), url)
    except FarmError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    for path in paths:
        console.print(str(path), highlight=False)
    console.print(f"{len(paths)} spooled result(s) for {store.mask_url(url)}", highlight=False)


@spool_app.command("flush")
def flush(db: DbOption = None) -> None:
    """Write every result spooled for the store into it; exit 1 if any is still refused."""
    url = db or store.default_db_url()
    try:
        report = flush_spool(store.open_store(url), farm_home(), url)
    except FarmError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    for line in report.stored:
        console.print(f"stored {line}", highlight=False)
    for line in report.kept:
        console.print(f"[yellow]kept[/yellow] {line}", highlight=False)
    console.print(f"{len(report.stored)} stored, {len(report.kept)} still spooled")
    if report.kept:
        raise typer.Exit(1)

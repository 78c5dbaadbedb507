"""`farm spool list|flush`: results kept on disk while the store was unreachable."""

from __future__ import annotations

import typer
from rich.text import Text

from farm.cli.common import DbOption, console, db_url, fail, home
from farm.errors import FarmError

__all__ = ["spool_app"]

spool_app = typer.Typer(
    rich_markup_mode="markdown", help="Results spooled to disk when the store refused them."
)


def _print_unreadable(lines: tuple[str, ...]) -> None:
    for line in lines:
        console.print(Text.assemble(("unreadable", "red"), f" {line}"), soft_wrap=True)


@spool_app.command("list")
def list_spool(db: DbOption = None) -> None:
    """List the spooled results meant for the store, and spool files that cannot be read."""
    from farm.masking import mask_url
    from farm.store.spool import scan_spool

    try:
        url = db_url(db)
        scan = scan_spool(home(), url)
    except FarmError as exc:
        raise fail(exc) from None
    for path in scan.files:
        console.print(str(path), highlight=False)
    _print_unreadable(scan.unreadable)
    unreadable = f", {len(scan.unreadable)} unreadable" if scan.unreadable else ""
    console.print(
        f"{len(scan.files)} spooled result(s) for {mask_url(url)}{unreadable}",
        highlight=False,
    )


@spool_app.command("flush")
def flush(db: DbOption = None) -> None:
    """Write every result spooled for the store into it; exit 1 if any is still refused
    or cannot be read (those files stay where they are)."""
    from farm.store.db import open_store
    from farm.store.spool import flush_spool

    try:
        url = db_url(db)
        engine = open_store(url)
        try:
            report = flush_spool(engine, home(), url)
        finally:
            engine.dispose()
    except FarmError as exc:
        raise fail(exc) from None
    for line in report.stored:
        console.print(f"stored {line}", highlight=False)
    for line in report.kept:
        console.print(Text.assemble(("kept", "yellow"), f" {line}"), soft_wrap=True)
    _print_unreadable(report.unreadable)
    unreadable = f", {len(report.unreadable)} unreadable" if report.unreadable else ""
    busy = f", {len(report.busy)} left to a flush already running" if report.busy else ""
    console.print(
        f"{len(report.stored)} stored, {len(report.kept)} still spooled{unreadable}{busy}"
    )
    if report.kept or report.unreadable:
        raise typer.Exit(1)

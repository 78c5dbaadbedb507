"""`farm sweeps`, `farm export` and `farm db upgrade`: the SQL store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

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
from farm.cli.inputs import LIMIT
from farm.errors import FarmError

__all__ = ["db_app", "store_app"]

store_app = typer.Typer(rich_markup_mode="markdown")
db_app = typer.Typer(rich_markup_mode="markdown", help="The SQL store.", no_args_is_help=True)


@store_app.command()
def sweeps(
    db: DbOption = None,
    limit: Annotated[int, typer.Option(help="at most this many, newest first", parser=LIMIT)] = 20,
) -> None:
    """List recent sweeps: cells by outcome, server time (engine start-up plus
    generation, summed over the cells: what the sweep cost), and verdicts."""
    from farm.store.summaries import list_sweeps
    from farm.store.verdicts import list_verdicts

    try:
        with open_session(db) as session:
            rows = list_sweeps(session, limit)
            check_sweep_statuses(*(s.status for s in rows))
            verdicts = list_verdicts(session, [s.id for s in rows])
    except FarmError as exc:
        raise fail(exc) from None
    for s in rows:
        # A nightly's or PR run's verdict: `nightly: regression (2)`, `pr #12: clean`;
        # an A/A night's: `aa: 2 false alarm(s)`.
        judged = "  ".join(
            f"aa: {len(v.false_alarms)} false alarm(s)"
            if v.kind == "aa"
            else f"{v.kind}{f' #{v.pr_number}' if v.pr_number is not None else ''}: {v.outcome}"
            + (f" ({len(v.findings)})" if v.findings else "")
            for v in verdicts.get(s.id, ())
        )
        console.print(
            f"{s.id:>5}  {s.job:<20} {s.status:<12} {s.started_at:%Y-%m-%d %H:%M}  "
            f"ok={s.cells_ok} failed={s.cells_failed} planned={s.cells_planned}"
            f"  server {s.server_s / 60:.1f} min"
            # Servers that held several NPUs cost more device time than server time.
            + (f" ({s.device_s / 3600:.2f} device-h)" if s.device_s > s.server_s + 1 else "")
            + (f"  {judged}" if judged else "")
        )


@store_app.command()
def export(
    sweep: SweepArg = "latest",
    out: Annotated[Path | None, typer.Option(help="write here instead of standard output")] = None,
    db: DbOption = None,
) -> None:
    """Write a stored sweep (cells, builds, every request's counters) as JSON, the
    input of `bench/detection.py --recorded` and of analyses away from the store."""
    from farm.store.cells import load_sweep
    from farm.store.export import dump_sweep_export

    try:
        if out is not None:
            check_output(out, db)  # before the store is read: nothing half-done
        with open_session(db) as session:
            record = load_sweep(session, resolve_sweep(session, sweep))
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
    from farm.masking import mask_url
    from farm.store.db import upgrade
    from farm.store.urls import normalize_url

    try:
        url = db_url(db)
        revision = upgrade(normalize_url(url))
    except FarmError as exc:
        raise fail(exc) from None
    console.print(f"store at {mask_url(url)} is at revision {revision}")


@db_app.command("prune")
def db_prune(
    text_older_than: Annotated[
        str,
        typer.Option(
            "--text-older-than",
            help="drop the output text of sweeps started before this age: 30d, 12h, 2w",
        ),
    ],
    db: DbOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say what would go, change nothing")
    ] = False,
) -> None:
    """Drop the output text of old sweeps; every number, verdict and alert stays.

    Reports of a pruned sweep show its greedy agreement as unknown.
    """
    from farm.store.prune import parse_age, prune_text

    try:
        age = parse_age(text_older_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--text-older-than") from None
    try:
        with open_session(db) as session:
            pruned = prune_text(session, age, dry_run=dry_run)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(pruned.describe())

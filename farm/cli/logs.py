"""`farm logs gc`: prune engine logs and the farm's local Ray session folders."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from farm.cli.common import DbOption, console, fail, open_session
from farm.cli.inputs import DAYS
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.orchestrate.log_retention import LogFolder

__all__ = ["logs_app"]

logs_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Logs: engine logs in FARM_HOME/logs, the local Ray clusters' session folders.",
    no_args_is_help=True,
)

# Running sweeps are among the newest; this many covers any realistic backlog.
_SWEEPS_LOOKED_AT = 1000


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _describe(folder: LogFolder, now: float) -> str:
    age_days = (now - folder.last_written) / 86400
    return (
        f"{folder.kind} {folder.path} ({_size(folder.size_bytes)}, "
        f"last written {age_days:.1f} days ago)"
    )


@logs_app.command("gc")
def gc(
    older_than_days: Annotated[
        float, typer.Option(help="remove log folders not written this long", parser=DAYS)
    ] = 14,
    dry_run: Annotated[bool, typer.Option(help="only say what would go")] = False,
    db: DbOption = None,
) -> None:
    """Remove engine logs and Ray session folders nobody wrote for a while.

    Never removes a folder written in the last hour, the logs of a sweep the store
    lists as running, or the session of a local Ray cluster whose process is alive;
    those that are old are listed with the reason they stay.
    """
    from farm.orchestrate.log_retention import find_old_logs, remove_logs
    from farm.paths import farm_home
    from farm.store.summaries import list_sweeps

    try:
        with open_session(db) as session:
            sweeps = list_sweeps(session, limit=_SWEEPS_LOOKED_AT)
    except FarmError as exc:
        raise fail(f"cannot tell which sweeps are running, so nothing was removed: {exc}") from None
    running = {s.id for s in sweeps if s.status == "running"}
    now = time.time()
    scan = find_old_logs(farm_home(), older_than_days, running_sweeps=running, now=now)
    for folder in scan.kept:
        console.print(Text(f"kept {_describe(folder, now)}: {folder.kept_because}"))
    verb = "would remove" if dry_run else "removed"
    failed = [] if dry_run else remove_logs(scan.old)
    not_removed = {f.path for f, _ in failed}
    for folder in scan.old:
        if folder.path not in not_removed:
            console.print(Text(f"{verb} {_describe(folder, now)}"))
    for folder, why in failed:
        console.print(Text.assemble(("not removed", "red"), f" {folder.path}: {why}"))
    gone = [f for f in scan.old if f.path not in not_removed]
    freed = sum(f.size_bytes for f in gone)
    console.print(Text(f"{verb} {len(gone)} log folder(s), {_size(freed)}"))
    if failed:
        raise typer.Exit(1)

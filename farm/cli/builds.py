"""`farm builds list|gc`: the engine build cache."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from farm.cli.common import console, home
from farm.cli.inputs import DAYS

if TYPE_CHECKING:
    from farm.builds.cache import BuildScan

__all__ = ["builds_app"]

builds_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Engine builds cached under FARM_HOME/cache.",
    no_args_is_help=True,
)


def _print_unreadable(lines: tuple[str, ...]) -> None:
    for line in lines:
        console.print(Text.assemble(("unreadable", "red"), f" {line}"), soft_wrap=True)


def _print_unfinished(scan: BuildScan) -> None:
    for u in scan.unfinished:
        why = (
            "being built now"
            if u.building
            else "a build that stopped before it finished; `farm builds gc` removes it"
        )
        console.print(
            Text.assemble(("unfinished", "yellow"), f" {u.folder} ({_gib(u.size_bytes)}): {why}"),
            soft_wrap=True,
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@builds_app.command("list")
def list_() -> None:
    """Cached builds with their inputs, size on disk and last use; then the build markers
    that cannot be read."""
    from farm.builds.cache import scan_builds

    table = Table(title=f"builds in {home() / 'cache'}")
    for col in ("build id", "engine", "package", "source", "patches", "size", "last used"):
        table.add_column(col)
    scan = scan_builds(home() / "cache")
    for b in scan.builds:
        age_h = (time.time() - b.last_used) / 3600
        table.add_row(
            b.info.build_id,
            b.info.engine,
            f"{b.info.package}=={b.info.version}",
            b.source,
            ", ".join(b.info.patches) or "-",
            _gib(b.size_bytes),
            f"{age_h:.1f} h ago",
        )
    console.print(table)
    _print_unreadable(scan.unreadable)
    _print_unfinished(scan)


@builds_app.command("gc")
def gc(
    older_than_days: Annotated[
        float, typer.Option(help="remove builds unused this long", parser=DAYS)
    ] = 14,
    dry_run: Annotated[bool, typer.Option(help="only say what would go")] = False,
) -> None:
    """Remove builds and fetched git repositories not used for a while.

    Never removes one that a running sweep or cell uses, is being built or fetched, nor
    one whose marker cannot be read (listed: remove it by hand once you know what it is).
    Removes the build's folder under the cache only, whatever its marker says. The
    folders of builds that died before they finished go whatever their age.
    """
    from farm.builds.cache import gc_builds, prune_sources, scan_builds

    report = gc_builds(home() / "cache", older_than_days, dry_run)
    removed = report.removed
    verb = "would remove" if dry_run else "removed"
    for build in removed:
        console.print(
            f"{verb} {build.info.build_id} ({build.info.engine}, {build.folder})",
            markup=False,
            highlight=False,
        )
    for build in report.in_use:
        console.print(
            f"kept {build.info.build_id} ({build.folder}): in use by a running sweep or cell",
            markup=False,
            highlight=False,
        )
    for build in report.building:
        console.print(
            f"kept {build.info.build_id} ({build.folder}): being built",
            markup=False,
            highlight=False,
        )
    for u in report.abandoned:
        console.print(
            f"{verb} unfinished build folder {u.folder} ({_gib(u.size_bytes)})",
            markup=False,
            highlight=False,
        )
    repos = prune_sources(home() / "cache", older_than_days, dry_run)
    for repo in repos:
        console.print(f"{verb} git source {repo}")
    _print_unreadable(scan_builds(home() / "cache", sizes=False).unreadable)
    console.print(
        f"{verb} {len(removed)} build(s), {len(report.abandoned)} unfinished build "
        f"folder(s), {len(repos)} git source(s)"
    )

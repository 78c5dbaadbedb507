"""`farm dashboards build|check|push`: Grafana dashboards and alert rules as code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from farm.dashboards.alerting import alert_rules
from farm.dashboards.files import all_dashboards, default_out_dir, stale_files, write_files
from farm.dashboards.provisioning import DASHBOARD_FOLDER
from farm.errors import FarmError

__all__ = ["dashboards_app"]

dashboards_app = typer.Typer(
    help="Grafana dashboards and alert rules generated from code (dashboards/).",
    no_args_is_help=True,
)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

OutOption = Annotated[
    Path | None,
    typer.Option("--out", help="folder of the generated files; default: the repository's"),
]


def _out(out: Path | None) -> Path:
    return out if out is not None else default_out_dir()


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(Text(f"error: {message}", style="red"))
    return typer.Exit(code)


@dashboards_app.command("build")
def build(out: OutOption = None) -> None:
    """Write the dashboards' JSON and Grafana's provisioning files (other files stay)."""
    folder = _out(out)
    for path in write_files(folder):
        console.print(f"wrote {path}", soft_wrap=True)


@dashboards_app.command("check")
def check(out: OutOption = None) -> None:
    """Exit 1 when the files differ from what the code generates (run `build`)."""
    folder = _out(out)
    stale = stale_files(folder)
    if stale:
        for rel, problem in stale.items():
            err_console.print(f"{folder / rel}: {problem}", soft_wrap=True)
        raise _fail(
            f"{len(stale)} generated file(s) out of date; run `farm dashboards build`", code=1
        )
    console.print(f"dashboards in {folder} match the code")


@dashboards_app.command("push")
def push(
    url: Annotated[str, typer.Option("--url", envvar="GRAFANA_URL", help="Grafana's base URL")],
    folder: Annotated[str, typer.Option(help="Grafana folder for the dashboards")] = (
        DASHBOARD_FOLDER
    ),
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="FARM_DB_URL",
            help="PostgreSQL URL of the store as Grafana reaches it; used only to create "
            "the data source when Grafana lacks it",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds per HTTP request")] = 10.0,
    alerts: Annotated[
        bool,
        typer.Option(
            "--alerts/--no-alerts",
            help="also create or update the alert rules, in the same folder",
        ),
    ] = True,
) -> None:
    """Upload the dashboards and alert rules to Grafana; create the folder and data
    source if missing.

    The token comes from GRAFANA_TOKEN (a service account token); it is never printed.
    """
    # Imported here: the HTTP client is needed by this command only.
    from farm.dashboards.push import (
        PushedRule,
        push_alert_rules,
        push_dashboards,
        store_connection,
    )

    token = os.environ.get("GRAFANA_TOKEN", "")
    if not token:
        raise _fail("set GRAFANA_TOKEN to a Grafana service account token")
    try:
        store = store_connection(db) if db else None
        result = push_dashboards(
            url, token, all_dashboards(), folder=folder, store=store, timeout=timeout
        )
    except FarmError as exc:
        raise _fail(str(exc).replace(token, "***")) from None
    made = " (created)" if result.folder_created else ""
    console.print(f"folder {folder!r} uid {result.folder_uid}{made}")
    if result.datasource_created:
        console.print("data source created")
    for uid, path in result.dashboards:
        console.print(f"pushed {uid}: {url.rstrip('/')}{path}")
    if not alerts:
        return

    def report(rule: PushedRule) -> None:
        console.print(f"{rule.action} alert rule {rule.uid}: {rule.title}")

    try:
        push_alert_rules(
            url,
            token,
            alert_rules(),
            folder_uid=result.folder_uid,
            timeout=timeout,
            on_saved=report,
        )
    except FarmError as exc:
        raise _fail(str(exc).replace(token, "***")) from None

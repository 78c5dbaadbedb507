"""`farm dashboards build|check|push`: Grafana dashboards and alert rules as code."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.common import FarmConsole, fail
from farm.cli.inputs import SECONDS
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.dashboards.alerting import AlertRule

# farm.dashboards is imported by the commands, not here: building its models is most
# of what `farm --help` would otherwise spend.

__all__ = ["dashboards_app"]

dashboards_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Grafana dashboards and alert rules generated from code (dashboards/).",
    no_args_is_help=True,
)
# Markup off: paths, titles and Grafana's answers are text.
console = FarmConsole(highlight=False, markup=False)
err_console = FarmConsole(stderr=True, highlight=False, markup=False)

OutOption = Annotated[
    Path | None,
    typer.Option("--out", help="folder of the generated files; default: the repository's"),
]


def _out(out: Path | None) -> Path:
    from farm.dashboards.files import default_out_dir

    return out if out is not None else default_out_dir()


def alert_rules() -> tuple[AlertRule, ...]:
    """The alert rules `push` uploads (:func:`farm.dashboards.alerting.alert_rules`)."""
    from farm.dashboards.alerting import alert_rules as rules

    return rules()


@dashboards_app.command("build")
def build(out: OutOption = None) -> None:
    """Write the dashboards' JSON and Grafana's provisioning files (other files stay)."""
    from farm.cli.outputs import check_publish_folder
    from farm.dashboards.files import write_files

    folder = _out(out)
    try:
        check_publish_folder(folder, "--out")  # a file in the way, /proc, a full disk
        paths = write_files(folder)
    except FarmError as exc:
        raise fail(exc) from None
    except OSError as exc:
        raise fail(f"--out {folder}: cannot write the files ({exc.strerror or exc})") from None
    for path in paths:
        console.print(f"wrote {path}", soft_wrap=True)


@dashboards_app.command("check")
def check(out: OutOption = None) -> None:
    """Exit 1 when the files differ from what the code generates (run `build`)."""
    from farm.dashboards.files import stale_files

    folder = _out(out)
    if not folder.is_dir():
        # Not "N files out of date": there is nothing there to compare with.
        raise fail(f"--out {folder}: no such folder (`farm dashboards build --out` writes one)")
    stale = stale_files(folder)
    if stale:
        for rel, problem in stale.items():
            err_console.print(f"{folder / rel}: {problem}", soft_wrap=True)
        raise fail(
            f"{len(stale)} generated file(s) out of date; run `farm dashboards build`", code=1
        )
    console.print(f"dashboards in {folder} match the code", soft_wrap=True)


def _grafana_target(url: str | None, db: str | None) -> tuple[str, str, str | None]:
    """Grafana's URL, its token and the store URL: the options, else the settings."""
    from farm.settings import get_settings

    settings = get_settings()
    url = url or settings.grafana.url
    if not url:
        raise fail("give --url or set GRAFANA_URL to Grafana's base URL")
    if settings.grafana.token is None:
        raise fail("set GRAFANA_TOKEN to a Grafana service account token")
    if db is None and settings.store.db_url is not None:
        db = settings.store.db_url.get_secret_value()
    return url, settings.grafana.token.get_secret_value(), db


@dashboards_app.command("push")
def push(
    url: Annotated[
        str | None, typer.Option("--url", help="Grafana's base URL; default: GRAFANA_URL")
    ] = None,
    folder: Annotated[
        str | None,
        typer.Option(help="Grafana folder for the dashboards; default: the farm's, 'MTP farm'"),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="PostgreSQL URL of the store as Grafana reaches it (default: FARM_DB_URL); "
            "used only to create the data source when Grafana lacks it",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds per HTTP request", parser=SECONDS)] = 10.0,
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
    from farm.dashboards.files import all_dashboards
    from farm.dashboards.provisioning import DASHBOARD_FOLDER
    from farm.dashboards.push import (
        PushedRule,
        push_alert_rules,
        push_dashboards,
        store_connection,
    )

    folder = folder or DASHBOARD_FOLDER
    url, token, db = _grafana_target(url, db)
    try:
        store = store_connection(db) if db else None
        result = push_dashboards(
            url, token, all_dashboards(), folder=folder, store=store, timeout=timeout
        )
    except FarmError as exc:
        raise fail(str(exc).replace(token, "***")) from None
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
        raise fail(str(exc).replace(token, "***")) from None

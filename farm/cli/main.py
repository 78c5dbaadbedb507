"""The `farm` command: composes one typer sub-app per stage and nothing else.

Shared options, the sweep argument and the error exit are in :mod:`farm.cli.common`.
"""

from __future__ import annotations

import sys

import typer

from farm.cli.alerts import alerts_app
from farm.cli.bisect import bisect_app
from farm.cli.builds import builds_app
from farm.cli.dashboards import dashboards_app
from farm.cli.goldens import goldens_app
from farm.cli.logs import logs_app
from farm.cli.nightly import nightly_app
from farm.cli.noise import noise_app
from farm.cli.patches import patches_app
from farm.cli.pr import pr_app
from farm.cli.reports import reports_app
from farm.cli.run import run_app
from farm.cli.spool import spool_app
from farm.cli.store import db_app, store_app
from farm.cli.submit import submit_app

__all__ = ["app", "main"]

app = typer.Typer(
    rich_markup_mode="markdown",
    help="mtp-farm: sweep speculative decoding across engine builds and modes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# Sub-apps without a name add their commands at the top level.
app.add_typer(run_app)  # run, selftest, plan
app.add_typer(nightly_app)  # nightly
app.add_typer(pr_app)  # pr
app.add_typer(bisect_app)  # bisect
app.add_typer(submit_app)  # submit
app.add_typer(reports_app)  # report, compare
app.add_typer(store_app)  # sweeps, export
app.add_typer(noise_app)  # noise
app.add_typer(db_app, name="db")
app.add_typer(builds_app, name="builds")
app.add_typer(patches_app, name="patches")
app.add_typer(alerts_app, name="alerts")
app.add_typer(spool_app, name="spool")
app.add_typer(dashboards_app, name="dashboards")
app.add_typer(logs_app, name="logs")
app.add_typer(goldens_app, name="goldens")


def main() -> None:
    """The `farm` script: the app with the process edge's net (farm.cli.entry)."""
    from farm.cli.entry import run_cli

    run_cli(app, sys.argv[1:])

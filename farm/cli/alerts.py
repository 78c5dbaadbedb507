"""`farm alerts list|ack|resolve|check`: regression alerts in the store.

`check` calls the check-alert-notify stage (:func:`farm.notify.pipeline.check_and_notify`)
and prints what it did.
"""

from __future__ import annotations

import getpass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from farm.cli.common import (
    DbOption,
    SweepArg,
    console,
    err_console,
    fail,
    open_session,
    parse_pairs,
    resolve_sweep,
)
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.notify.pipeline import AlertCheck

__all__ = ["alerts_app"]

alerts_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Regression alerts: raise them from a sweep, list, acknowledge, resolve.",
    no_args_is_help=True,
)


class StateChoice(StrEnum):
    """The states `farm alerts list --state` accepts."""

    open = "open"
    acknowledged = "acknowledged"
    resolved = "resolved"


@alerts_app.command("list")
def list_command(
    state: Annotated[StateChoice | None, typer.Option(help="only alerts in this state")] = None,
    limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 50,
    db: DbOption = None,
) -> None:
    """List alerts, most recently updated first."""
    from farm.store.alerts import list_alerts

    try:
        with open_session(db) as session:
            alerts = list_alerts(session, state.value if state else None, limit)
    except FarmError as exc:
        raise fail(exc) from None
    if not alerts:
        console.print(f"no {state.value + ' ' if state else ''}alerts")
        return
    table = Table(title=f"{len(alerts)} alert(s)")
    for col in ("id", "state", "severity", "check", "cell", "sweeps", "summary"):
        table.add_column(col, overflow="fold")
    for a in alerts:
        sweeps = f"{a.first_sweep_id}..{a.last_sweep_id} ({a.occurrences}x)"
        who = f"\n{a.state} by {a.acknowledged_by}" if a.acknowledged_by else ""
        note = f"\nnote: {a.note}" if a.note else ""
        style = "red" if a.severity == "critical" and a.state == "open" else ""
        table.add_row(
            Text(str(a.id)),
            Text(a.state + who, style=style),
            Text(a.severity, style=style),
            Text(f"{a.kind} {a.metric or ''}".strip()),
            Text(str(a.details.cell)),
            Text(sweeps),
            Text(a.summary + note),
        )
    console.print(table)


@alerts_app.command("ack")
def ack_command(
    alert_id: Annotated[int, typer.Argument(help="alert id (`farm alerts list`)")],
    note: Annotated[str | None, typer.Option(help="why, or who is on it")] = None,
    by: Annotated[str | None, typer.Option(help="who acknowledges; default: $USER")] = None,
    db: DbOption = None,
) -> None:
    """Acknowledge an alert: it stays listed but is not notified again."""
    from farm.store.alerts import acknowledge

    try:
        with open_session(db) as session:
            record = acknowledge(session, alert_id, by or getpass.getuser(), note)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(Text(f"alert {record.id} acknowledged by {record.acknowledged_by}"))


@alerts_app.command("resolve")
def resolve_command(
    alert_id: Annotated[int, typer.Argument(help="alert id (`farm alerts list`)")],
    note: Annotated[str | None, typer.Option(help="what fixed it (PR, build)")] = None,
    db: DbOption = None,
) -> None:
    """Resolve an alert; a newer sweep that shows the same regression re-opens it."""
    from farm.store.alerts import resolve

    try:
        with open_session(db) as session:
            record = resolve(session, alert_id, note)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(Text(f"alert {record.id} resolved"))


@alerts_app.command("check")
def check_command(
    sweep: SweepArg = "latest",
    base_of: Annotated[
        list[str] | None,
        typer.Option(help="PATCHED=BASE engine pair; default: inferred from the builds"),
    ] = None,
    history: Annotated[
        int, typer.Option(help="also look for change points over this many sweeps of the job")
    ] = 0,
    notify: Annotated[
        bool, typer.Option(help="send new alerts to the channels set in FARM_NOTIFY_*")
    ] = True,
    db: DbOption = None,
) -> None:
    """Run the checks on a stored sweep, record alerts (deduplicated), notify new ones.

    Exit status 1 when a notification channel failed (the alerts stay pending).
    """
    from farm.notify.pipeline import check_and_notify

    pairs = parse_pairs(base_of, "--base-of")
    try:
        with open_session(db) as session:
            outcome = check_and_notify(
                session,
                resolve_sweep(session, sweep),
                base_of=pairs or None,
                history=history,
                notifiers=None if notify else (),
            )
    except FarmError as exc:
        raise fail(exc) from None
    _print_check(outcome)
    if not outcome.delivered:
        raise typer.Exit(1)


def _print_check(outcome: AlertCheck) -> None:
    console.print(
        Text(
            f"sweep {outcome.sweep_id}: {outcome.comparisons} comparisons, "
            f"{outcome.findings} finding(s); {len(outcome.raised)} alert(s) raised, "
            f"{len(outcome.fresh)} not yet notified"
        )
    )
    for a in outcome.fresh:
        console.print(Text(f"  #{a.id} {a.severity} {a.summary}"))
    if outcome.sent:
        names = ", ".join(outcome.channels)
        console.print(Text(f"sent {len(outcome.sent)} alert(s) to {names}"))
    for err in outcome.errors:
        err_console.print(Text(f"notification failed: {err}", style="red"))
    if outcome.errors:
        err_console.print(Text("alerts are stored; the next `farm alerts check` sends them again"))

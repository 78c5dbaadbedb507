"""`farm alerts list|triage|ack|resolve|check`: regression alerts in the store.

`check` judges a stored sweep as `farm nightly` does (:func:`farm.workflows.nightly.steps.
check_alerts`: within the sweep, against the job's last good night, over its history),
raises the alerts of its findings, notifies, and prints what it did.
"""

from __future__ import annotations

import getpass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.table import Table
from rich.text import Text

from farm.cli.common import (
    DbOption,
    SweepArg,
    console,
    db_url,
    err_console,
    fail,
    open_session,
    parse_pairs,
)
from farm.cli.inputs import LIMIT, STORE_ID, plain_text
from farm.errors import FarmError
from farm.inert import terminal
from farm.masking import mask_secrets
from farm.results.alerts import ALERT_STATES, OPEN_STATES, TRIAGE_STATES

if TYPE_CHECKING:
    from farm.workflows.alerts.steps import AlertCheck

__all__ = ["alerts_app"]

alerts_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Regression alerts: raise them from a sweep, list, triage.",
    no_args_is_help=True,
)


class StateChoice(StrEnum):
    """What `farm alerts list --state` accepts: a state, or ``open`` (any open one)."""

    open = "open"
    untriaged = "untriaged"
    acknowledged = "acknowledged"
    downstream = "downstream"
    invalid = "invalid"
    fixed = "fixed"
    recovered = "recovered"
    withdrawn = "withdrawn"


class TriageChoice(StrEnum):
    """The states a person sets (``recovered`` and ``withdrawn`` are the farm's)."""

    acknowledged = "acknowledged"
    downstream = "downstream"
    invalid = "invalid"
    fixed = "fixed"


assert {c.value for c in StateChoice} == {"open", *ALERT_STATES}
assert tuple(c.value for c in TriageChoice) == TRIAGE_STATES


@alerts_app.command("list")
def list_command(
    state: Annotated[StateChoice | None, typer.Option(help="only alerts in this state")] = None,
    limit: Annotated[int, typer.Option(help="at most this many, newest first", parser=LIMIT)] = 50,
    db: DbOption = None,
) -> None:
    """List alerts, most recently updated first, with their triage (who, when, why, link)."""
    from farm.store.alerts import list_alerts

    states = None if state is None else OPEN_STATES if state == "open" else (state.value,)
    try:
        with open_session(db) as session:
            alerts = list_alerts(session, states, limit)  # type: ignore[arg-type]
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
        who = f"\nby {a.triaged_by}" if a.triaged_by else ""
        note = f"\nwhy: {a.note}" if a.note else ""
        note += f"\nlink: {a.link}" if a.link else ""
        note += f"\nnews: {a.news}" if a.news else ""
        style = "red" if a.severity == "critical" and a.state == "untriaged" else ""
        # Stored text may predate the input checks: shown inert (farm.inert.terminal).
        table.add_row(
            Text(str(a.id)),
            Text(terminal(a.state + who, newlines=True), style=style),
            Text(a.severity, style=style),
            Text(terminal(f"{a.kind} {a.metric or ''}".strip())),
            Text(terminal(str(a.details.cell))),
            Text(sweeps),
            Text(terminal(a.summary + note, newlines=True)),
        )
    console.print(table)


@alerts_app.command("triage")
def triage_command(
    alert_id: Annotated[int, typer.Argument(help="alert id (`farm alerts list`)", parser=STORE_ID)],
    state: Annotated[TriageChoice, typer.Argument(help="the alert's new state")],
    reason: Annotated[str | None, typer.Option(help="why", callback=plain_text)] = None,
    link: Annotated[
        str | None,
        typer.Option(help="the bug, PR or bisection (an http(s) URL)", callback=_http_link),
    ] = None,
    by: Annotated[
        str | None, typer.Option(help="who triages; default: $USER", callback=plain_text)
    ] = None,
    db: DbOption = None,
) -> None:
    """Triage an alert: acknowledged (someone is on it), downstream (caused elsewhere),
    invalid (a false alarm) or fixed. Open ones are not notified again unless their
    cause changes; a newer sweep that shows a closed one again re-opens it."""
    from farm.store.alerts import triage

    try:
        with open_session(db) as session:
            who = by or getpass.getuser()
            record = triage(session, alert_id, state.value, who, reason, link)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(Text(terminal(f"alert {record.id} {record.state} by {record.triaged_by}")))


def _http_link(value: str | None) -> str | None:
    value = plain_text(value)
    if value is not None and not value.startswith(("http://", "https://")):
        raise typer.BadParameter(f"{value!r}: expected an http(s) URL")
    return mask_secrets(value) if value is not None else None


@alerts_app.command("ack")
def ack_command(
    alert_id: Annotated[int, typer.Argument(help="alert id (`farm alerts list`)", parser=STORE_ID)],
    note: Annotated[
        str | None, typer.Option(help="why, or who is on it", callback=plain_text)
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(help="who acknowledges; default: $USER", callback=plain_text),
    ] = None,
    db: DbOption = None,
) -> None:
    """Acknowledge an alert (`triage ID acknowledged`): it stays listed but is not
    notified again unless its cause changes."""
    from farm.store.alerts import acknowledge

    try:
        with open_session(db) as session:
            record = acknowledge(session, alert_id, by or getpass.getuser(), note)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(Text(terminal(f"alert {record.id} acknowledged by {record.triaged_by}")))


@alerts_app.command("resolve")
def resolve_command(
    alert_id: Annotated[int, typer.Argument(help="alert id (`farm alerts list`)", parser=STORE_ID)],
    note: Annotated[
        str | None, typer.Option(help="what fixed it (PR, build)", callback=plain_text)
    ] = None,
    db: DbOption = None,
) -> None:
    """Resolve an alert as fixed (`triage ID fixed`); a newer sweep that shows the same
    regression re-opens it."""
    from farm.store.alerts import resolve

    try:
        with open_session(db) as session:
            record = resolve(session, alert_id, note, getpass.getuser())
    except FarmError as exc:
        raise fail(exc) from None
    console.print(Text(f"alert {record.id} fixed"))


@alerts_app.command("check")
def check_command(
    sweep: SweepArg = "latest",
    base_of: Annotated[
        list[str] | None,
        typer.Option(help="PATCHED=BASE engine pair; default: inferred from the builds"),
    ] = None,
    history: Annotated[
        int | None,
        typer.Option(
            help="also look for change points over this many sweeps of the job; default: "
            "nightly.history of the job",
            parser=LIMIT,
        ),
    ] = None,
    baseline: Annotated[
        str,
        typer.Option(
            help="compare with this sweep id, 'last-good' (the job's last good night, as "
            "farm nightly does) or 'none'"
        ),
    ] = "last-good",
    job_file: Annotated[
        Path | None,
        typer.Option(
            "--job",
            help="the sweep's job file: its nightly.history and goldens, as farm nightly "
            "reads them; default: the job text stored with the sweep (no goldens)",
        ),
    ] = None,
    notify: Annotated[
        bool, typer.Option(help="send new alerts to the channels set in FARM_NOTIFY_*")
    ] = True,
    db: DbOption = None,
) -> None:
    """Judge a stored sweep as `farm nightly` does, record the alerts of its findings
    (deduplicated), notify new ones. No verdict is stored.

    Exit status 4 when a notification channel failed (the alerts stay pending), as
    `farm nightly` gives for the same failure.
    """
    from farm.workflows.alerts.run import AlertsDeps, AlertsRequest, run_alerts_check
    from farm.workflows.common import store_session

    pairs = parse_pairs(base_of, "--base-of")
    against = _baseline(baseline)
    deps = AlertsDeps(
        open_session=store_session,
        judged_as=lambda judged_as: console.print(Text(judged_as.describe())),
    )
    try:
        request = AlertsRequest(
            sweep=sweep,
            url=db_url(db),
            baseline=against,
            base_of=pairs,
            history=history,
            job_file=job_file,
            notify=notify,
        )
        outcome = run_alerts_check(request, deps)
    except FarmError as exc:
        raise fail(exc) from None
    _print_check(outcome)
    if not outcome.delivered:
        from farm.notify.delivery import EXIT_UNDELIVERED

        raise typer.Exit(EXIT_UNDELIVERED)


def _baseline(value: str) -> int | Literal["last-good"] | None:
    if value == "none":
        return None
    if value == "last-good":
        return "last-good"
    from farm.bounds import parse_stored_int

    try:
        return parse_stored_int(value, what="a sweep id")
    except ValueError as exc:
        raise typer.BadParameter(f"{exc}, 'last-good' or 'none'", param_hint="--baseline") from None


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
    from farm.notify.delivery import delivery_lines

    for line, good in delivery_lines(len(outcome.sent), outcome.delivered_to, outcome.errors):
        if good:
            console.print(Text(line))
        else:
            err_console.print(Text(line, style="red"))

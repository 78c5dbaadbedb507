"""`farm alerts list|ack|resolve|check`, `farm compare`, and report files (Markdown, HTML).

Commands only call into the stages: the store for sweeps and alerts, the analysis for
checks and history, ``farm.report`` to render, ``farm.notify`` to deliver.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlmodel import Session

from farm import store
from farm.analysis.checks import check_sweep
from farm.analysis.history import HistoryKey, HistoryPoint, analyze_histories, series_from_sweeps
from farm.analysis.summary import patched_bases, summarize_sweep
from farm.analysis.verdicts import CheckConfig
from farm.errors import FarmError
from farm.notify.candidates import alert_candidates_from_history, alert_candidates_from_report
from farm.notify.github import DEFAULT_API_URL, GitHubClient, parse_pr_ref
from farm.notify.registry import notifiers_from_env, send_all
from farm.records import SweepRecord
from farm.report.html import render_html
from farm.report.markdown import compare_sweeps, render_comparison, render_markdown
from farm.store.alerts import (
    acknowledge,
    list_alerts,
    mark_notified,
    pending_notifications,
    raise_alerts,
    resolve,
)

__all__ = [
    "ReportFormat",
    "alerts_app",
    "compare",
    "export",
    "render_report",
    "report_files",
]

ReportFormat = Literal["md", "html"]

alerts_app = typer.Typer(
    help="Regression alerts: raise them from a sweep, list, acknowledge, resolve.",
    no_args_is_help=True,
)
console = Console()
err_console = Console(stderr=True)

# Same option as farm.cli.main.DbOption (not imported: main imports this module).
DbOption = Annotated[
    str | None,
    typer.Option("--db", envvar="FARM_DB_URL", help="SQLAlchemy URL; default: SQLite in FARM_HOME"),
]


class StateChoice(StrEnum):
    """The states `farm alerts list --state` accepts."""

    open = "open"
    acknowledged = "acknowledged"
    resolved = "resolved"


def _fail(exc: FarmError) -> typer.Exit:
    err_console.print(Text(f"error: {exc}", style="red"))
    return typer.Exit(2)


@contextmanager
def _session(db: str | None) -> Iterator[Session]:
    engine = store.open_store(db or store.default_db_url())
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def _sweep_id(session: Session, sweep: str | int) -> int:
    if sweep == "latest":
        found = store.latest_sweep_id(session)
        if found is None:
            raise FarmError("the store holds no sweep yet; run `farm run JOB.yaml`")
        return found
    try:
        return int(sweep)
    except ValueError:
        raise FarmError(f"sweep {sweep!r}: expected a sweep id or 'latest'") from None


def _pairs(values: Sequence[str] | None, option: str) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise typer.BadParameter(f"{option} {item!r}: expected A=B")
        out[key] = value
    return out


def _history_sweeps(session: Session, record: SweepRecord, count: int) -> list[SweepRecord]:
    """Up to ``count`` sweeps of the same job ending with ``record``, oldest first."""
    if count <= 1:
        return [record]
    ids = [
        s.id
        for s in store.list_sweeps(session, limit=max(200, 10 * count))
        if s.job == record.job and s.id < record.sweep_id
    ][: count - 1]
    return [*(store.load_sweep(session, i) for i in sorted(ids)), record]


def _history(
    session: Session, record: SweepRecord, count: int
) -> dict[HistoryKey, tuple[HistoryPoint, ...]] | None:
    if count <= 1:
        return None
    return series_from_sweeps(_history_sweeps(session, record, count))


def render_report(
    sweep: str | int, db: str | None, fmt: ReportFormat, history: int = 10
) -> tuple[int, str]:
    """Render stored sweep ``sweep`` (id or ``'latest'``) as Markdown or HTML.

    Runs the within-sweep checks (patched engines against their base builds, see
    :func:`farm.analysis.summary.patched_bases`) and, with ``history`` > 1, draws AL
    trends over the last ``history`` sweeps of the same job. Returns (sweep id, text).
    Raises FarmError.
    """
    with _session(db) as session:
        sweep_id = _sweep_id(session, sweep)
        record = store.load_sweep(session, sweep_id)
        trends = _history(session, record, history)
    report = check_sweep(record, patched_bases(record.builds))
    summaries = summarize_sweep(record)
    if fmt == "html":
        return sweep_id, render_html(record, summaries, report, trends)
    return sweep_id, render_markdown(record, summaries, report, trends)


def report_files(
    sweep_id: str | int,
    db: str | None,
    out_dir: Path,
    formats: Sequence[ReportFormat] = ("md", "html"),
    history: int = 10,
) -> list[Path]:
    """Write ``sweep-<id>.md`` / ``sweep-<id>.html`` into ``out_dir`` (created if
    needed); return the paths written. Raises FarmError."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in dict.fromkeys(formats):
        resolved, text = render_report(sweep_id, db, fmt, history)
        path = out_dir / f"sweep-{resolved}.{fmt}"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


@alerts_app.command("list")
def list_command(
    state: Annotated[StateChoice | None, typer.Option(help="only alerts in this state")] = None,
    limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 50,
    db: DbOption = None,
) -> None:
    """List alerts, most recently updated first."""
    try:
        with _session(db) as session:
            alerts = list_alerts(session, state.value if state else None, limit)
    except FarmError as exc:
        raise _fail(exc) from None
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
    try:
        with _session(db) as session:
            record = acknowledge(session, alert_id, by or getpass.getuser(), note)
    except FarmError as exc:
        raise _fail(exc) from None
    console.print(Text(f"alert {record.id} acknowledged by {record.acknowledged_by}"))


@alerts_app.command("resolve")
def resolve_command(
    alert_id: Annotated[int, typer.Argument(help="alert id (`farm alerts list`)")],
    note: Annotated[str | None, typer.Option(help="what fixed it (PR, build)")] = None,
    db: DbOption = None,
) -> None:
    """Resolve an alert; a newer sweep that shows the same regression re-opens it."""
    try:
        with _session(db) as session:
            record = resolve(session, alert_id, note)
    except FarmError as exc:
        raise _fail(exc) from None
    console.print(Text(f"alert {record.id} resolved"))


@alerts_app.command("check")
def check_command(
    sweep: Annotated[str, typer.Argument(help="sweep id or 'latest'")] = "latest",
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
    try:
        with _session(db) as session:
            sweep_id = _sweep_id(session, sweep)
            record = store.load_sweep(session, sweep_id)
            mapping = _pairs(base_of, "--base-of") or patched_bases(record.builds)
            report = check_sweep(record, mapping, CheckConfig())
            candidates = alert_candidates_from_report(report, record)
            if history > 1:
                series = series_from_sweeps(_history_sweeps(session, record, history))
                candidates += alert_candidates_from_history(analyze_histories(series), sweep_id)
            alerts = raise_alerts(session, sweep_id, candidates)
            fresh = [a for a in alerts if a.needs_notification]
            channels = notifiers_from_env() if notify else []
            pending = pending_notifications(session) if channels else []
            errors = send_all(channels, pending)
            if pending and not errors:
                # A failed channel leaves every alert pending: the next check sends
                # again, a duplicate in the channels that worked rather than silence.
                mark_notified(session, [a.id for a in pending])
    except FarmError as exc:
        raise _fail(exc) from None
    console.print(
        Text(
            f"sweep {sweep_id}: {len(report.verdicts)} comparisons, {len(report.findings)} "
            f"finding(s); {len(alerts)} alert(s) raised, {len(fresh)} not yet notified"
        )
    )
    for a in fresh:
        console.print(Text(f"  #{a.id} {a.severity} {a.summary}"))
    if pending:
        names = ", ".join(n.name for n in channels)
        console.print(Text(f"sent {len(pending)} alert(s) to {names}"))
    for err in errors:
        err_console.print(Text(f"notification failed: {err}", style="red"))
    if errors:
        err_console.print(Text("alerts are stored; the next `farm alerts check` sends them again"))
        raise typer.Exit(1)


def compare(
    baseline: Annotated[int, typer.Argument(help="baseline sweep id")],
    candidate: Annotated[int, typer.Argument(help="candidate sweep id")],
    map_engine: Annotated[
        list[str] | None,
        typer.Option(help="CANDIDATE_ENGINE=BASELINE_ENGINE when the names differ; repeatable"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="also write the Markdown here")] = None,
    post_github: Annotated[
        str | None,
        typer.Option(help="OWNER/REPO#PR: post as a comment (needs GITHUB_TOKEN)"),
    ] = None,
    fail_on_regression: Annotated[
        bool, typer.Option(help="exit 1 when a variant regressed (for CI)")
    ] = False,
    db: DbOption = None,
) -> None:
    """Compare two sweeps cell by cell: pass / regress / improve, AL difference with its
    interval, as Markdown ready for a pull request."""
    try:
        ref = parse_pr_ref(post_github) if post_github else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--post-github") from None
    try:
        with _session(db) as session:
            base = store.load_sweep(session, baseline)
            cand = store.load_sweep(session, candidate)
        comparison = compare_sweeps(base, cand, engine_map=_pairs(map_engine, "--map-engine"))
        text = render_comparison(comparison)
        typer.echo(text)
        if out is not None:
            out.write_text(text, encoding="utf-8")
        if ref is not None:
            token = os.environ.get("GITHUB_TOKEN")
            if not token:
                err_console.print(
                    Text(f"GITHUB_TOKEN is not set; not posting to {ref}", style="yellow")
                )
            else:
                api = os.environ.get("FARM_GITHUB_API") or DEFAULT_API_URL
                url = GitHubClient(token=token, api_url=api).post_issue_comment(ref, text)
                err_console.print(Text(f"posted to {ref}: {url}"))
    except FarmError as exc:
        raise _fail(exc) from None
    if fail_on_regression and comparison.count("regress"):
        raise typer.Exit(1)


def export(
    sweep: Annotated[str, typer.Argument(help="sweep id or 'latest'")] = "latest",
    out: Annotated[Path | None, typer.Option(help="write here instead of standard output")] = None,
    db: DbOption = None,
) -> None:
    """Write a stored sweep (cells, builds, every request's counters) as JSON, the
    input of `bench/detection.py --recorded` and of analyses away from the store."""
    try:
        with _session(db) as session:
            record = store.load_sweep(session, _sweep_id(session, sweep))
    except FarmError as exc:
        raise _fail(exc) from None
    text = record.model_dump_json(indent=1)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n", encoding="utf-8")
        err_console.print(Text(f"sweep {record.sweep_id} -> {out}"))

"""`farm report` (a stored sweep as a matrix, or a Markdown/HTML report file) and
`farm compare` (two sweeps, for a pull request).

Commands only call into the stages: the store for sweeps, the analysis for checks and
history, ``farm.report`` to render, ``farm.notify.github`` to post.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

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
    parse_pairs,
    resolve_sweep,
    say,
    write_output,
)
from farm.cli.inputs import STORE_ID
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.records import SweepRecord

__all__ = [
    "ReportFormat",
    "post_to_github",
    "render_report",
    "report_files",
    "reports_app",
    "show_sweep",
]

ReportFormat = Literal["md", "html"]

reports_app = typer.Typer(rich_markup_mode="markdown")


def show_sweep(record: SweepRecord, title: str) -> None:
    """Print ``record`` as a matrix, then the within-sweep checks' findings."""
    from farm.analysis.judgement import judge_within
    from farm.analysis.summary import summarize_sweep
    from farm.report.categories import render_category_table
    from farm.report.findings import render_findings
    from farm.report.table import render_matrix

    summaries = summarize_sweep(record)
    console.print(render_matrix(title, summaries))
    by_category = render_category_table(summaries)
    if by_category is not None:
        console.print(by_category)
    checks = judge_within(record)
    if checks.regressions:
        console.print(render_findings(checks))
    else:
        console.print(f"within-sweep checks: no finding in {len(checks.verdicts)} comparisons")


def render_report(
    sweep: str | int, db: str | None, fmt: ReportFormat, history: int = 10
) -> tuple[int, str]:
    """Render stored sweep ``sweep`` (id or ``'latest'``) as Markdown or HTML.

    Shows the within-sweep part of the sweep's judgement
    (:func:`farm.analysis.judgement.judge_within`) and, with ``history`` > 1, draws AL
    trends over the last ``history`` sweeps of the same job. The HTML page opens with
    the sweep's stored verdict (a nightly's, else a PR run's) when it has one, as the
    published page does. Returns (sweep id, text). Raises FarmError.
    """
    from farm.analysis.judgement import judge_within
    from farm.analysis.summary import summarize_sweep
    from farm.report.html import render_html
    from farm.report.markdown import render_markdown
    from farm.store.cells import load_sweep
    from farm.store.history import history_series
    from farm.store.summaries import sweep_cost
    from farm.store.verdicts import list_verdicts

    with open_session(db) as session:
        sweep_id = resolve_sweep(session, sweep)
        record = load_sweep(session, sweep_id)
        check_sweep_statuses(record.status)
        # From the per-variant summaries: trends read no request of earlier sweeps.
        trends = history_series(session, record, history) if history > 1 else None
        stored = list_verdicts(session, [sweep_id]).get(sweep_id, [])
        cost = sweep_cost(session, sweep_id).describe()
    report = judge_within(record)
    summaries = summarize_sweep(record)
    if fmt == "html":
        verdict = stored[0] if stored else None
        return sweep_id, render_html(record, summaries, report, trends, verdict=verdict, cost=cost)
    return sweep_id, render_markdown(record, summaries, report, trends, cost=cost)


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


@reports_app.command()
def report(
    sweep: SweepArg = "latest",
    db: DbOption = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="md or html: write a report file")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="default: `sweep-<id>.<format>`")
    ] = None,
    bisection: Annotated[
        int | None,
        typer.Option(help="show this stored `farm bisect` search instead", parser=STORE_ID),
    ] = None,
) -> None:
    """Show a stored sweep as a matrix: acceptance, AL, per position, greedy agreement.

    With --format md|html, write a report with the checks' verdicts, a heatmap of the
    change in AL across the matrix, per-position bars and trends instead. With
    --bisection ID, show (or write) a bisection: its answer and every step's figures.
    """
    if bisection is not None:
        _report_bisection(bisection, db, fmt, out)
        return
    if fmt is not None:
        if fmt not in ("md", "html"):
            raise typer.BadParameter("expected md or html", param_hint="--format")
        try:
            if out is not None:
                check_output(out, db)  # before the store is read: nothing half-done
            written, text = render_report(sweep, db, "html" if fmt == "html" else "md")
            path = check_output(out or Path(f"sweep-{written}.{fmt}"), db)
            write_output(path, text)
        except FarmError as exc:
            raise fail(exc) from None
        say(f"wrote {path}")
        return
    from farm.store.cells import load_sweep

    try:
        with open_session(db) as session:
            record = load_sweep(session, resolve_sweep(session, sweep))
            check_sweep_statuses(record.status)
    except FarmError as exc:
        raise fail(exc) from None
    started = f"{record.started_at:%Y-%m-%d %H:%M}"
    title = f"sweep {record.sweep_id} ({record.job}, {record.status}, started {started})"
    show_sweep(record, title)
    for e in record.excluded:
        say(f"excluded {e.label}: {e.reason}")


def _report_bisection(bisection_id: int, db: str | None, fmt: str | None, out: Path | None) -> None:
    """`farm report --bisection ID`: the steps as a table, or a Markdown/HTML file."""
    from farm.inert import terminal
    from farm.report.markdown import BISECTION_HEAD, bisection_rows, render_bisection
    from farm.store.bisections import get_bisection

    if fmt is not None and fmt not in ("md", "html"):
        raise typer.BadParameter("expected md or html", param_hint="--format")
    try:
        if out is not None:
            check_output(out, db)
        with open_session(db) as session:
            b = get_bisection(session, bisection_id)
        if fmt is None:
            from rich.table import Table

            say(f"bisection {b.id} ({b.job}, {b.engine}, {b.status}): {b.headline()}")
            table = Table(*BISECTION_HEAD)
            for row in bisection_rows(b):  # subjects come from the repository: inert
                table.add_row(*(terminal(c) for c in row))
            console.print(table)
            say(
                f"{len(b.steps)} step(s), {b.builds_run} build(s), {b.cells_run} cell(s), "
                f"{b.wall_s:.0f} s wall"
            )
            return
        if fmt == "html":
            from farm.report.html import render_bisection_html

            text = render_bisection_html(b)
        else:
            text = render_bisection(b)
        path = check_output(out or Path(f"bisection-{b.id}.{fmt}"), db)
        write_output(path, text)
    except FarmError as exc:
        raise fail(exc) from None
    say(f"wrote {path}")


def post_to_github(ref_text: str, text: str) -> None:
    """Post ``text`` as a comment on pull request ``ref_text``. FarmError without a
    token (checked by `farm compare` before it compares) or when GitHub refuses."""
    from farm.workflows.common import post_pr_comment

    _posted(*post_pr_comment(ref_text, text))


def _posted(ref: object, link: str) -> None:
    err_console.print(Text(f"posted to {ref}: {link}"))


@reports_app.command()
def compare(
    baseline: Annotated[int, typer.Argument(help="baseline sweep id", parser=STORE_ID)],
    candidate: Annotated[int, typer.Argument(help="candidate sweep id", parser=STORE_ID)],
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
    from farm.analysis.gate import same_sweep
    from farm.notify.github import parse_pr_ref
    from farm.settings import get_settings
    from farm.workflows.common import store_session
    from farm.workflows.compare.run import CompareDeps, CompareRequest, run_compare

    if problem := same_sweep(baseline, candidate):
        raise typer.BadParameter(problem, param_hint="CANDIDATE")
    if post_github is not None:
        try:
            parse_pr_ref(post_github)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--post-github") from None
    engine_map = parse_pairs(map_engine, "--map-engine")
    try:
        if post_github is not None and get_settings().github.token is None:
            raise FarmError(f"--post-github {post_github}: GITHUB_TOKEN is not set")
        if out is not None:
            check_output(out, db)
        request = CompareRequest(
            baseline=baseline,
            candidate=candidate,
            url=db_url(db),
            engine_map=engine_map,
            out=out,
            post_github=post_github,
        )
        deps = CompareDeps(
            open_session=store_session,
            shown=typer.echo,
            write_output=write_output,
            posted=_posted,
        )
        outcome = run_compare(request, deps)
    except FarmError as exc:
        raise fail(exc) from None
    if fail_on_regression and outcome.comparison.count("regress"):
        raise typer.Exit(1)

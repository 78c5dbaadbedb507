"""``bench/store_scale.py`` at a reduced size: 3 nights, 4 requests per variant.

Runs the bench as a user would (a subprocess, output piped) into a fresh PostgreSQL
database, then checks its table (every query, command, ingestion and table row, with
sane values; no timing limits: CI machines vary) and the history it built (the nightly
matrix every night, a PR sweep, a night with failures and one with a drop, every table
of the schema filled for every copied night). PostgreSQL must be reachable as for
``test_store.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from farm.dashboards import alert_rules, all_dashboards
from farm.orchestrate.driver import plan_job
from farm.spec import load_job

REPO = Path(__file__).resolve().parents[2]
NIGHTS = 3
REQUESTS = 4
NAME_WIDTH = 44  # bench/store_scale.py's name column
COMMANDS = {
    "farm --help",
    "farm sweeps",
    "farm report latest",
    "farm report latest --format html",
    "farm alerts check latest --history 14",
    "farm alerts check latest --history 30",
}


@dataclass(frozen=True)
class Bench:
    url: str
    out: str
    sections: dict[str, dict[str, tuple[float | None, float | None]]]


def _number(text: str) -> float | None:
    return float(text) if text else None


def _sections(out: str) -> dict[str, dict[str, tuple[float | None, float | None]]]:
    """The bench's tables by title: row name -> its two figures."""
    sections: dict[str, dict[str, tuple[float | None, float | None]]] = {}
    for block in out.split("\n\n")[1:]:
        title, *rows = block.strip("\n").splitlines()
        parsed = {}
        for row in rows:
            assert not row.startswith("  !"), f"the bench flagged a row: {row}"
            figures = row[NAME_WIDTH:].split()
            parsed[row[:NAME_WIDTH].rstrip()] = (
                _number(figures[0]) if figures else None,
                _number(figures[1]) if len(figures) > 1 else None,
            )
        sections[title[:NAME_WIDTH].rstrip()] = parsed
    return sections


@pytest.fixture(scope="module")
def bench(pg_admin_url: str) -> Iterator[Bench]:
    import uuid

    import psycopg
    from psycopg import sql

    name = f"farm_scale_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = sa.make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        done = subprocess.run(
            [
                sys.executable,
                str(REPO / "bench" / "store_scale.py"),
                "--nights",
                str(NIGHTS),
                "--requests",
                str(REQUESTS),
                "--db",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        yield Bench(url=url, out=done.stdout, sections=_sections(done.stdout))
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def test_the_table_fits_80_columns_and_has_every_section(bench: Bench) -> None:
    assert all(len(line) <= 80 for line in bench.out.splitlines()), bench.out
    assert "\x1b[" not in bench.out  # piped: plain text
    assert bench.out.startswith(f"store_scale: {NIGHTS} nights, {NIGHTS} nightly and 1 PR sweeps")
    assert set(bench.sections) == {
        "query (ms, median of 3)",
        "command",
        "ingestion",
        "store (before the ingestion)",
    }


def test_every_dashboard_query_is_timed_at_both_ranges(bench: Bench) -> None:
    texts = {v.sql for d in all_dashboards() for v in d.variables}
    texts |= {p.sql for d in all_dashboards() for row in d.rows for p in row}
    texts |= {r.sql for r in alert_rules()}
    queries = bench.sections["query (ms, median of 3)"]
    assert len(queries) == len(texts)
    kinds = {name.split(" ", 1)[0] for name in queries}
    assert kinds == {"variable", "panel", "alert"}
    assert "panel LATEST_SWEEP_CELLS" in queries and "variable VARIABLE_THINKING" in queries
    for name, (month, year) in queries.items():
        assert month is not None and year is not None, name
        assert 0 < month < 60_000 and 0 < year < 60_000, name


def test_every_command_ran_and_has_a_wall_time_and_peak_rss(bench: Bench) -> None:
    commands = bench.sections["command"]
    assert set(commands) == COMMANDS
    for name, (wall, rss) in commands.items():
        assert wall is not None and 0 < wall < 900, name
        # A Python process that imported the farm: tens of MiB at least, not gigabytes.
        assert rss is not None and 20 < rss < 4096, name


def test_ingestion_and_store_sizes(bench: Bench) -> None:
    ((name, (ms, _)),) = bench.sections["ingestion"].items()
    assert name.startswith("save_cell_result (1 cell, ") and ms is not None and ms > 0
    store = bench.sections["store (before the ingestion)"]
    tables = set(sa.inspect(sa.create_engine(bench.url)).get_table_names())
    assert set(store) == tables | {"total"}
    total, per_night = store["total"]
    assert total is not None and per_night is not None
    assert total == pytest.approx(sum(s[0] or 0 for n, s in store.items() if n != "total"), 0.01)
    assert per_night == pytest.approx(total / NIGHTS, rel=0.01)
    assert (store["request_numbers"][0] or 0) > (store["sweep"][0] or 0)


def _rows(url: str, text: str) -> list[sa.Row[tuple[object, ...]]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(text)))
    finally:
        engine.dispose()


def test_the_history_has_the_nightly_matrix_every_night_and_a_pr_sweep(bench: Bench) -> None:
    sweeps = _rows(
        bench.url,
        "SELECT s.id, s.job, s.status, s.started_at, count(c.id), "
        "count(c.id) FILTER (WHERE c.status = 'failed'), "
        "count(c.id) FILTER (WHERE c.status = 'build_failed') "
        "FROM sweep s JOIN cell c ON c.sweep_id = s.id GROUP BY s.id ORDER BY s.id",
    )
    *history, ingested = sweeps
    assert ingested.status == "interrupted"  # the ingestion's sweep, saved last
    assert [s.started_at for s in history] == sorted(s.started_at for s in history)
    nightly = [s for s in history if s.job == "nightly-ascend"]
    pr = [s for s in history if s.job != "nightly-ascend"]
    assert len(nightly) == NIGHTS and len(pr) == 1
    cells = len(plan_job(load_job(REPO / "jobs" / "nightly-ascend.yaml")).cells)
    assert [s[4] for s in nightly] == [cells] * NIGHTS  # jobs/nightly-ascend.yaml's cells
    days = [(s.started_at - nightly[0].started_at).days for s in nightly]
    assert days == list(range(NIGHTS))
    # Night 1 is the failures template: a failed cell and a failed build's cells.
    assert [(s[5] > 0, s[6] > 0) for s in nightly] == [(False, False), (True, True), (False, False)]
    assert [s.status for s in nightly] == ["ok", "failed", "ok"]


def test_every_variant_has_its_requests_and_every_table_is_filled(bench: Bench) -> None:
    runs = _rows(
        bench.url,
        "SELECT v.id, json_array_length(r.prompt_ids) FROM variant_run v "
        "LEFT JOIN request_numbers r ON r.variant_run_id = v.id",
    )
    assert runs and {n for _, n in runs} == {REQUESTS}
    # Whatever hangs off variant_run (metric, request_numbers, tables later migrations
    # add): rows for every variant run, copied nights included.
    engine = sa.create_engine(bench.url)
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine)
    finally:
        engine.dispose()
    children = [
        t.name for t in metadata.sorted_tables if "variant_run_id" in t.c and t.name != "alert"
    ]
    assert {"metric", "request_numbers", "variant_summary"} <= set(children)
    for table in children:
        ((covered,),) = _rows(bench.url, f"SELECT count(DISTINCT variant_run_id) FROM {table}")
        assert covered == len(runs), table


def test_the_drop_night_drops_al_where_the_seed_regression_bites(bench: Bench) -> None:
    al = _rows(
        bench.url,
        "SELECT s.started_at, c.cell_id, "
        "1 + sum(m.value) FILTER (WHERE m.name = 'accepted')::float8 "
        "  / sum(m.value) FILTER (WHERE m.name = 'drafts') AS al "
        "FROM sweep s JOIN cell c ON c.sweep_id = s.id "
        "JOIN variant_run v ON v.cell_row_id = c.id JOIN metric m ON m.variant_run_id = v.id "
        "WHERE s.job = 'nightly-ascend' AND c.status = 'ok' AND m.position IS NULL "
        "GROUP BY s.started_at, c.cell_id ORDER BY s.started_at",
    )
    by_cell: dict[str, list[float]] = {}
    for _, cell, value in al:
        by_cell.setdefault(cell, []).append(value)
    bitten = "vllm-ascend-pr8210.step-3.5-flash.full_decode_only.mtp3.swa-on"
    first, *_, last = by_cell[bitten]
    assert last < first * 0.9  # night 2 is a drop night
    fixed = by_cell["vllm-ascend-pr8210-fix.step-3.5-flash.full_decode_only.mtp3.swa-on"]
    assert abs(fixed[-1] - fixed[0]) < fixed[0] * 0.05

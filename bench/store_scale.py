"""The farm on a year of nightlies: dashboard queries, CLI commands, ingestion, store size.

    python bench/store_scale.py [--nights 365] [--requests 200] [--db URL] [--keep]

Builds a synthetic history in a PostgreSQL store with the farm's own schema (the
Alembic migrations, run by ``farm.store.open_store``):

- each *template* sweep is written through the farm's real write path
  (``create_sweep``, ``record_build``, ``save_cell_result``, ``finish_sweep``) from
  synthetic ``CellResult``s: the matrix of jobs/nightly-ascend.yaml as ``farm.plan``
  expands it, ``--requests`` requests per variant with ~1.4 KB of output text. The
  templates: two clean nights (different noise), a night with a failed cell and a
  failed build, two nights with a real AL drop (the two seed bugs' regressions:
  vllm-ascend full graph + SWA + MTP 3; sglang padded verify batches), and
  a PR sweep (the patched vllm-ascend engine only);
- each day of the history is a copy of one template, made with ``INSERT ... SELECT``
  statements generated from the *reflected* schema (``sa.MetaData().reflect``): for
  every table that hangs off ``sweep`` by foreign keys, in foreign-key order, rows are
  copied with integer keys shifted by a per-day block and every timestamp moved to the
  day. Tables added by later migrations are copied the same way, so whatever the
  write path fills is filled at every night. The templates are deleted afterwards,
  so sweep ids follow time. A PR sweep runs every third day, in the afternoon before
  that day's nightly.

Then it times every dashboard, variable and alert-rule query (``farm.dashboards``,
interpolated as Grafana sends them, at a 30-day and a one-year range; median of 3
runs after a warm-up), the CLI (``farm --help``, ``farm sweeps``, ``farm report
latest`` as text and HTML, ``farm alerts check latest --history 14|30``, each a
subprocess: wall time and peak RSS), the ingestion of one cell into the full store,
and the store's size per table (``pg_total_relation_size``) and per night.

Without ``--db`` the bench creates a fresh database next to ``--admin-url`` and drops
it at the end (unless ``--keep``). A ``--db`` store must be empty.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.rows import dict_row

from farm.dashboards import alert_rules, all_dashboards, health
from farm.dashboards import queries as q
from farm.dashboards.macros import TimeRange, interpolate
from farm.orchestrate.driver import plan_job
from farm.plan import Plan, ServerCell
from farm.records import (
    BuildInfo,
    CellResult,
    EffectiveConfig,
    RequestRecord,
    SpecCounters,
    VariantResult,
)
from farm.spec import JobSpec, load_job
from farm.store import (
    Session,
    create_sweep,
    finish_sweep,
    open_store,
    record_build,
    save_cell_result,
)

REPO = Path(__file__).resolve().parents[1]
NIGHTLY_JOB = REPO / "jobs" / "nightly-ascend.yaml"
ADMIN_URL_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
PR_JOB = "pr-vllm-ascend-8210"
PR_ENGINE = "vllm-ascend-pr8210-fix"
NODES = ("a3-node-01", "a3-node-02", "a3-node-03", "a3-node-04")
# Absolute acceptance rate per draft position (accepted_per_pos[i] / drafts), per
# model family, in the range the Ascend MTP heads reach.
BASE_RATES = {"vllm-ascend": (0.82, 0.62, 0.46), "sglang": (0.78, 0.57, 0.41)}
DROP_FACTOR = 0.5  # positions >= 1 of a dropped cell keep half their rate: AL -19%
CLI_TIMEOUT_S = 1800.0
QUERY_RUNS = 3
NAME_WIDTH = 44

# --- synthetic results -----------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """One night (or PR sweep) written through the write path, copied to ``days``."""

    name: str
    seed: int
    job: str | None = None  # None: the nightly job's own name
    drops: Callable[[ServerCell], bool] = lambda cell: False
    failures: bool = False


def _vllm_drop(cell: ServerCell) -> bool:
    """(a): full-graph path, SWA on, MTP >= 2 on the unpatched vllm-ascend build."""
    return (
        cell.engine == "vllm-ascend-pr8210"
        and cell.planned_graph_mode == "full_decode_only"
        and cell.sliding_window == "on"
        and cell.mtp_depth >= 2
    )


def _sglang_drop(cell: ServerCell) -> bool:
    """(b): padded verify batches on the unpatched sglang build, graph on."""
    return cell.engine == "sglang-0.5.12.post1" and cell.planned_graph_mode != "eager"


TEMPLATES = {
    t.name: t
    for t in (
        Template("pr", seed=11, job=PR_JOB),
        Template("clean-a", seed=1),
        Template("clean-b", seed=2),
        Template("failures", seed=3, failures=True),
        Template("drop-vllm", seed=4, drops=_vllm_drop),
        Template("drop-sglang", seed=5, drops=_sglang_drop),
    )
}


def schedule(nights: int) -> dict[str, list[int]]:
    """Days (0 = oldest) of each template: a nightly every day, a PR sweep every third
    day, failures every tenth, a week of the vllm drop from 55% of the history and
    four days of the sglang drop from 80%."""
    vllm_from = max(2, int(nights * 0.55))
    sglang_from = max(vllm_from + 7, int(nights * 0.8))
    days: dict[str, list[int]] = {name: [] for name in TEMPLATES}
    for day in range(nights):
        if vllm_from <= day < vllm_from + 7:
            name = "drop-vllm"
        elif sglang_from <= day < sglang_from + 4:
            name = "drop-sglang"
        elif day % 10 == 1:
            name = "failures"
        else:
            name = "clean-a" if day % 2 == 0 else "clean-b"
        days[name].append(day)
        if day % 3 == 2:
            days["pr"].append(day)
    return {name: d for name, d in days.items() if d}


_WORDS = [
    "so",
    "the",
    "sum",
    "of",
    "the",
    "roots",
    "is",
    "therefore",
    "we",
    "get",
    "let",
    "x",
    "be",
    "the",
    "answer",
    "modulo",
    "consider",
    "the",
    "case",
    "where",
    "then",
    "by",
    "symmetry",
    "hence",
    "it",
    "follows",
    "that",
    "wait",
    "check",
    "again",
    "the",
    "value",
    "of",
    "equals",
]
# Share of requests whose text differs from the same prompt's in other cells (greedy
# decoding mostly repeats itself: the store keeps each distinct text once).
TEXT_VARIES = 0.3


def _texts(rng: random.Random) -> list[str]:
    """Output texts of ~1.4 KB: long-form reasoning as far as the store is concerned."""
    out = []
    for _ in range(64):
        text: list[str] = []
        while sum(len(w) + 1 for w in text) < rng.randint(1200, 1600):
            text.append(rng.choice(_WORDS))
        out.append(" ".join(text))
    return out


def _requests(
    rng: random.Random, texts: list[str], cell: ServerCell, workload: str, count: int
) -> tuple[RequestRecord, ...]:
    long_form = workload.startswith("aime")
    rows = []
    for i in range(count):
        tokens = int(rng.lognormvariate(9.0 if long_form else 6.5, 0.5))
        failed = rng.random() < 0.005
        text = texts[(i * 7 + len(workload)) % len(texts)]
        if rng.random() < TEXT_VARIES:
            text = f"{text} [{cell.cell_id} {rng.getrandbits(32):08x}]"
        rows.append(
            RequestRecord(
                prompt_id=f"{workload}/{i}",
                output_text="" if failed else text,
                completion_tokens=0 if failed else tokens,
                finish_reason=None if failed else rng.choice(("stop", "stop", "stop", "length")),
                latency_s=round(tokens / rng.uniform(20.0, 40.0), 3),
                correct=None if failed else rng.random() < (0.55 if long_form else 0.8),
                error="request timed out after 3600 s" if failed else None,
            )
        )
    return tuple(rows)


def _counters(
    rng: random.Random, cell: ServerCell, requests: Sequence[RequestRecord], dropped: bool
) -> SpecCounters:
    depth = cell.mtp_depth
    rates = [r * rng.gauss(1.0, 0.01) for r in BASE_RATES[cell.family][:depth]]
    if dropped:
        rates = [r if i == 0 else r * DROP_FACTOR for i, r in enumerate(rates)]
    tokens = sum(r.completion_tokens for r in requests)
    drafts = int(tokens / (1 + sum(rates)))
    per_pos = tuple(int(drafts * r) for r in rates)
    return SpecCounters(
        drafts=drafts, draft_tokens=drafts * depth, accepted=sum(per_pos), accepted_per_pos=per_pos
    )


def _argv(cell: ServerCell) -> tuple[str, ...]:
    return (
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server" if cell.family != "sglang" else "sglang.launch_server",
        "--model",
        f"/mnt/models/{cell.model}",
        "--served-model-name",
        cell.model,
        "--port",
        "8000",
        "--max-model-len",
        "65536",
        "--speculative-config",
        f'{{"method": "mtp", "num_speculative_tokens": {cell.mtp_depth}}}',
        "--tensor-parallel-size",
        "16",
        "--trust-remote-code",
    )


def cell_result(
    template: Template,
    cell: ServerCell,
    index: int,
    at: datetime,
    requests: int,
    rng: random.Random,
    texts: list[str],
) -> CellResult:
    """The synthetic outcome of ``cell``: ok with every planned variant, or (in the
    failures template) a failed server or a failed build."""
    node = NODES[index % len(NODES)]
    if template.failures and cell.engine == "sglang-0.5.12.post1-pr27202":
        return CellResult(
            cell_id=cell.cell_id,
            status="build_failed",
            started_at=at,
            finished_at=at,
            error="patch npu-hybrid-mtp-verify hunk 2 does not apply to sglang 0.5.12.post1",
        )
    startup = rng.uniform(300.0, 900.0)
    if template.failures and index == 5:
        return CellResult(
            cell_id=cell.cell_id,
            status="failed",
            started_at=at,
            finished_at=at + timedelta(seconds=startup),
            node=node,
            argv=_argv(cell),
            startup_s=startup,
            error="engine server exited with code 1 before becoming ready",
            log_tail="\n".join(
                f"[rank{i}] RuntimeError: ACL stream sync failed" for i in range(40)
            ),
            log_path=f"/var/log/mtp-farm/{cell.cell_id}.log",
        )
    variants = []
    for v in cell.variants:
        reqs = _requests(rng, texts, cell, v.workload, requests)
        variants.append(
            VariantResult(
                axes=v.axes,
                counters=_counters(rng, cell, reqs, template.drops(cell)),
                requests=reqs,
                elapsed_s=rng.uniform(600.0, 3000.0),
                concurrency=4,
            )
        )
    generation = sum(v.elapsed_s for v in variants)
    return CellResult(
        cell_id=cell.cell_id,
        status="ok",
        started_at=at,
        finished_at=at + timedelta(seconds=startup + generation),
        node=node,
        argv=_argv(cell),
        effective=EffectiveConfig(
            engine_version="0.17.0rc2.dev307" if cell.family != "sglang" else "0.5.12.post1",
            graph_mode=cell.planned_graph_mode,
            speculative_method="mtp",
            num_speculative_tokens=cell.mtp_depth,
            max_model_len=65536,
        ),
        variants=tuple(variants),
        startup_s=startup,
        generation_s=generation,
        log_path=f"/var/log/mtp-farm/{cell.cell_id}.log",
    )


def _builds(job: JobSpec, failed_engine: str | None) -> list[BuildInfo]:
    return [
        BuildInfo(
            build_id=f"{e.name}-{hashlib.sha256(e.name.encode()).hexdigest()[:12]}",
            engine=e.name,
            family=e.family,
            package=e.package,
            version=e.version,
            pins=tuple(e.pins),
            patches=tuple(e.patches),
            python=f"/var/cache/mtp-farm/envs/{e.name}/bin/python",
            env_dir=f"/var/cache/mtp-farm/envs/{e.name}",
            node=NODES[0],
        )
        for e in job.engines
        if e.name != failed_engine
    ]


def write_template(
    engine: sa.Engine, template: Template, plan: Plan, job: JobSpec, requests: int
) -> int:
    """Write ``template`` through the farm's write path; return its sweep id."""
    rng = random.Random(template.seed)
    texts = _texts(rng)
    plan = plan.model_copy(update={"job": template.job}) if template.job else plan
    failed_engine = "sglang-0.5.12.post1-pr27202" if template.failures else None
    with Session(engine) as session:
        sweep_id = create_sweep(session, plan, f"name: {plan.job}\n", "a3-ctl-01")
        for build in _builds(job, failed_engine):
            record_build(session, sweep_id, build)
        at = datetime.now(UTC)
        for i, cell in enumerate(plan.cells):
            result = cell_result(template, cell, i, at, requests, rng, texts)
            save_cell_result(session, sweep_id, result)
            at = result.finished_at
        finish_sweep(session, sweep_id, "failed" if template.failures else "ok")
    return sweep_id


# --- replication from the reflected schema ---------------------------------------------


@dataclass(frozen=True)
class _Owned:
    """A table whose rows belong to one sweep, and how to find and shift them."""

    table: sa.Table
    # The foreign key that leads towards ``sweep`` (None for ``sweep`` itself).
    path: sa.ForeignKey | None
    # The table's own integer key, shifted by the table's block span.
    own_key: sa.Column[int] | None


def owned_tables(metadata: sa.MetaData) -> list[_Owned]:
    """Tables reachable from ``sweep`` through foreign keys, parents first."""
    owned: dict[str, _Owned] = {}
    for table in metadata.sorted_tables:
        path = next((fk for fk in table.foreign_keys if fk.column.table.name in owned), None)
        if table.name != "sweep" and path is None:
            continue
        pk = list(table.primary_key.columns)
        own_key = (
            pk[0]
            if len(pk) == 1 and isinstance(pk[0].type, sa.Integer) and not pk[0].foreign_keys
            else None
        )
        owned[table.name] = _Owned(table, path, own_key)
    if "sweep" not in owned:
        raise SystemExit("store_scale: the store has no sweep table; is it a farm store?")
    return list(owned.values())


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _belongs(owned: Mapping[str, _Owned], table: str, alias: str) -> str:
    """SQL condition: row ``alias`` of ``table`` belongs to sweep ``:sweep``."""
    entry = owned[table]
    if entry.path is None:
        return f"{alias}.{_quote('id')} = :sweep"
    parent = entry.path.column.table.name
    inner = f"p_{parent}"
    return (
        f"{alias}.{_quote(entry.path.parent.name)} IN ("
        f"SELECT {inner}.{_quote(entry.path.column.name)} FROM {_quote(parent)} {inner} "
        f"WHERE {_belongs(owned, parent, inner)})"
    )


def _spans(conn: sa.Connection, tables: Sequence[_Owned]) -> dict[str, int]:
    """Per table with its own integer key: the key range of all rows (the templates)."""
    spans = {}
    for t in tables:
        if t.own_key is None:
            continue
        key = _quote(t.own_key.name)
        low, high = conn.execute(
            sa.text(f"SELECT min({key}), max({key}) FROM {_quote(t.table.name)}")
        ).one()
        spans[t.table.name] = 1 if low is None else high - low + 1
    return spans


def _copy_sql(entry: _Owned, owned: Mapping[str, _Owned], spans: Mapping[str, int]) -> str:
    columns, values = [], []
    for col in entry.table.columns:
        name = f"t.{_quote(col.name)}"
        parents = [fk.column.table.name for fk in col.foreign_keys if fk.column.table.name in owned]
        if parents:
            parent = owned[parents[0]]
            if parent.own_key is None:
                raise SystemExit(
                    f"store_scale: {entry.table.name}.{col.name} refers to {parents[0]}, which "
                    "has no integer key to shift; teach owned_tables about it"
                )
            values.append(f"{name} + x.block * {spans[parents[0]]}")
        elif entry.own_key is not None and col.name == entry.own_key.name:
            values.append(f"{name} + x.block * {spans[entry.table.name]}")
        elif isinstance(col.type, sa.DateTime):
            values.append(f"{name} + x.shift * interval '1 second'")
        else:
            values.append(name)
        columns.append(_quote(col.name))
    return (
        f"INSERT INTO {_quote(entry.table.name)} ({', '.join(columns)})\n"
        f"SELECT {', '.join(values)}\nFROM {_quote(entry.table.name)} t\n"
        "CROSS JOIN unnest(CAST(:blocks AS bigint[]), CAST(:shifts AS float8[]))"
        " AS x(block, shift)\n"
        f"WHERE {_belongs(owned, entry.table.name, 't')}"
    )


def replicate(
    engine: sa.Engine,
    templates: Mapping[int, list[tuple[int, datetime]]],
) -> None:
    """Copy each template sweep (by id) to each ``(day, start)``; delete the templates.

    Day ``d``'s copies take key block ``d + 1`` (block 0 holds the templates), so ids
    grow with time; every timestamp moves by the copy's start minus the template's.
    """
    metadata = sa.MetaData()
    metadata.reflect(engine)
    tables = owned_tables(metadata)
    owned = {t.table.name: t for t in tables}
    with engine.begin() as conn:
        spans = _spans(conn, tables)
        statements = {t.table.name: _copy_sql(t, owned, spans) for t in tables}
        for sweep_id, copies in templates.items():
            started = conn.execute(
                sa.text("SELECT started_at FROM sweep WHERE id = :sweep"), {"sweep": sweep_id}
            ).scalar_one()
            params = {
                "sweep": sweep_id,
                "blocks": [day + 1 for day, _ in copies],
                "shifts": [(start - started).total_seconds() for _, start in copies],
            }
            for t in tables:
                conn.execute(sa.text(statements[t.table.name]), params)
        for sweep_id in templates:
            for t in reversed(tables):
                conn.execute(
                    sa.text(
                        f"DELETE FROM {_quote(t.table.name)} t "
                        f"WHERE {_belongs(owned, t.table.name, 't')}"
                    ),
                    {"sweep": sweep_id},
                )
        for t in tables:
            if t.own_key is not None:
                name, key = t.table.name, t.own_key.name
                conn.execute(
                    sa.text(
                        f"SELECT setval(pg_get_serial_sequence(:table, :key), "
                        f"(SELECT max({_quote(key)}) FROM {_quote(name)}))"
                    ),
                    {"table": name, "key": key},
                )


# --- timing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    a: float | None
    b: float | None
    note: str = ""


def _run(conn: psycopg.Connection[dict[str, object]], text: str) -> list[dict[str, object]]:
    return list(conn.execute(text.encode()))  # bytes: no %-placeholder parsing


def _query_names() -> dict[str, str]:
    """Every exported SQL constant of the dashboard modules by its text."""
    modules = (q, health)
    return {
        getattr(m, name): name
        for m in modules
        for name in m.__all__
        if name.isupper() and isinstance(getattr(m, name), str)
    }


def dashboard_queries() -> list[tuple[str, str, str]]:
    """``(kind name, dashboard uid, sql)`` of every variable, panel and alert rule, each
    SQL text once (the first dashboard that uses it resolves its variables)."""
    names = _query_names()
    seen: dict[str, tuple[str, str, str]] = {}
    for dashboard in all_dashboards():
        for var in dashboard.variables:
            seen.setdefault(
                var.sql, (f"variable {names.get(var.sql, var.name)}", dashboard.uid, var.sql)
            )
        for row in dashboard.rows:
            for panel in row:
                seen.setdefault(
                    panel.sql,
                    (f"panel {names.get(panel.sql, panel.title)}", dashboard.uid, panel.sql),
                )
    for rule in alert_rules():
        seen.setdefault(rule.sql, (f"alert {names.get(rule.sql, rule.uid)}", "", rule.sql))
    return list(seen.values())


def _variables(
    conn: psycopg.Connection[dict[str, object]], uid: str, time_range: TimeRange
) -> dict[str, list[str]]:
    """The dashboard's variable values as Grafana resolves them by default: "All" for
    multi-valued variables, the first value for single-valued ones."""
    (dashboard,) = [d for d in all_dashboards() if d.uid == uid]
    values: dict[str, list[str]] = {}
    for var in dashboard.variables:
        options = [
            str(next(iter(r.values())))
            for r in _run(conn, interpolate(var.sql, time_range, values))
        ]
        values[var.name] = options if var.multi else options[:1]
    return values


def time_queries(url: str, now: datetime) -> list[Row]:
    """Median milliseconds of every dashboard query at a 30-day and a one-year range."""
    ranges = {
        "30 days": (now - timedelta(days=30), now + timedelta(hours=1)),
        "1 year": (now - timedelta(days=365), now + timedelta(hours=1)),
    }
    rows = []
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        conn.execute(b"SET statement_timeout = '300s'")
        queries = dashboard_queries()
        variables = {
            (uid, label): _variables(conn, uid, time_range)
            for _, uid, _ in queries
            if uid
            for label, time_range in ranges.items()
        }
        for name, uid, text in queries:
            ms = []
            for label, time_range in ranges.items():
                rendered = interpolate(text, time_range, variables.get((uid, label), {}))
                _run(conn, rendered)
                runs = []
                for _ in range(QUERY_RUNS):
                    t0 = time.perf_counter()
                    _run(conn, rendered)
                    runs.append((time.perf_counter() - t0) * 1000)
                ms.append(statistics.median(runs))
            rows.append(Row(name, ms[0], ms[1]))
    return rows


def _farm_command() -> list[str]:
    script = Path(sys.executable).with_name("farm")
    if not script.exists():
        raise SystemExit(f"store_scale: no farm command next to {sys.executable}; install the farm")
    return [str(script)]


def time_command(name: str, argv: Sequence[str], env: Mapping[str, str], work: Path) -> Row:
    """Wall seconds and peak RSS (MiB) of one ``farm`` subprocess, its output kept in
    ``work``. The RSS comes from ``/usr/bin/time``: a child forked from this process
    would report this process's own peak as well."""
    log, rss = work / f"{name.replace(' ', '_')}.log", work / f"{name.replace(' ', '_')}.rss"
    timer = ["/usr/bin/time", "-f", "%M", "-o", str(rss)] if Path("/usr/bin/time").exists() else []
    with log.open("wb") as out:
        t0 = time.perf_counter()
        try:
            code = subprocess.run(
                [*timer, *_farm_command(), *argv],
                stdout=out,
                stderr=out,
                env={**env},
                timeout=CLI_TIMEOUT_S,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = -1
        wall = time.perf_counter() - t0
    kib = rss.read_text().split()[-1] if timer and rss.exists() else ""
    peak = int(kib) / 1024 if kib.isdigit() else None
    note = "" if code == 0 else f"exit {code}: see {log}"
    return Row(name, wall, peak, note)


def time_cli(url: str, work: Path) -> list[Row]:
    env = {**os.environ, "FARM_DB_URL": url, "FARM_HOME": str(work / "home")}
    html = str(work / "report.html")
    commands = {
        "farm --help": ["--help"],
        "farm sweeps": ["sweeps"],
        "farm report latest": ["report", "latest"],
        "farm report latest --format html": ["report", "latest", "--format", "html", "--out", html],
        "farm alerts check latest --history 14": ["alerts", "check", "latest", "--history", "14"],
        "farm alerts check latest --history 30": ["alerts", "check", "latest", "--history", "30"],
    }
    return [
        # --no-notify: the bench must not reach any channel the environment configures.
        time_command(name, [*argv, "--no-notify"] if "alerts" in argv else argv, env, work)
        for name, argv in commands.items()
    ]


def time_ingestion(engine: sa.Engine, plan: Plan, requests: int) -> Row:
    """Milliseconds to save the largest cell of a new nightly sweep into the full store."""
    index, cell = max(enumerate(plan.cells), key=lambda ic: len(ic[1].variants))
    rng = random.Random(99)
    result = cell_result(
        TEMPLATES["clean-a"], cell, index, datetime.now(UTC), requests, rng, _texts(rng)
    )
    with Session(engine) as session:
        sweep_id = create_sweep(session, plan, f"name: {plan.job}\n", "a3-ctl-01")
        t0 = time.perf_counter()
        save_cell_result(session, sweep_id, result)
        ms = (time.perf_counter() - t0) * 1000
        finish_sweep(session, sweep_id, "interrupted")
    count = len(cell.variants) * requests
    return Row(f"save_cell_result (1 cell, {count} requests)", ms, None)


def store_sizes(engine: sa.Engine, nights: int) -> list[Row]:
    """MB per table and per night (``pg_total_relation_size``: heap, TOAST, indexes)."""
    metadata = sa.MetaData()
    metadata.reflect(engine)
    rows = []
    with engine.connect() as conn:
        for name in sorted(metadata.tables):
            size = conn.execute(
                sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": _quote(name)}
            ).scalar_one()
            rows.append(Row(name, size / 1e6, size / 1e6 / nights))
    total = sum(r.a or 0.0 for r in rows)
    return [*rows, Row("total", total, total / nights)]


# --- the store ---------------------------------------------------------------------------


@contextmanager
def _database(db: str | None, admin_url: str, keep: bool) -> Iterator[str]:
    """The store's URL: ``db``, or a fresh database next to ``admin_url``."""
    if db is not None:
        yield db
        return
    name = f"farm_store_scale_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        if keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def _libpq(url: str) -> str:
    """``url`` as psycopg takes it (without SQLAlchemy's driver suffix)."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(frozen=True)
class Built:
    sweeps: dict[str, int]
    write_s: float
    copy_s: float
    vacuum_s: float
    templates: int


def build(engine: sa.Engine, url: str, nights: int, requests: int) -> Built:
    """Write the templates, copy them over ``nights`` days, delete them, VACUUM ANALYZE."""
    with engine.connect() as conn:
        present = conn.execute(sa.text("SELECT count(*) FROM sweep")).scalar_one()
    if present:
        raise SystemExit(
            f"store_scale: the store already holds {present} sweep(s); give an empty one"
        )
    job = load_job(NIGHTLY_JOB)
    nightly = plan_job(job)
    pr = plan_job(job, {"engine": PR_ENGINE})
    days = schedule(nights)
    today = datetime.now(UTC).replace(hour=1, minute=0, second=0, microsecond=0)
    first = today - timedelta(days=nights)
    t0 = time.perf_counter()
    copies: dict[int, list[tuple[int, datetime]]] = {}
    for name, template in TEMPLATES.items():
        if name not in days:
            continue
        plan = pr if template.job == PR_JOB else nightly
        sweep_id = write_template(engine, template, plan, job, requests)
        # A PR sweep runs the afternoon before the day's nightly.
        hour = timedelta(hours=-11) if template.job == PR_JOB else timedelta()
        copies[sweep_id] = [(d, first + timedelta(days=d) + hour) for d in days[name]]
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    replicate(engine, copies)
    copy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(b"VACUUM ANALYZE")
    vacuum_s = time.perf_counter() - t0
    sweeps = {"nightly": nights, "PR": len(days.get("pr", []))}
    return Built(sweeps, write_s, copy_s, vacuum_s, len(copies))


# --- output ------------------------------------------------------------------------------


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def table(title: str, a: str, b: str, rows: Sequence[Row]) -> list[str]:
    """Plain rows that fit 80 columns: the name, two figures, a note on the next line."""
    lines = [f"{title:<{NAME_WIDTH}}  {a:>9}  {b:>9}"]
    for r in rows:
        lines.append(f"{r.name:<{NAME_WIDTH}}  {_cell(r.a):>9}  {_cell(r.b):>9}".rstrip())
        if r.note:
            lines.append(f"  ! {r.note}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nights", type=int, default=365, help="days of history (default 365)")
    parser.add_argument("--requests", type=int, default=200, help="requests per variant")
    parser.add_argument("--db", help="an empty PostgreSQL store to fill (kept afterwards)")
    parser.add_argument(
        "--admin-url",
        default=ADMIN_URL_DEFAULT,
        help=f"where to create the throw-away database (default {ADMIN_URL_DEFAULT})",
    )
    parser.add_argument("--keep", action="store_true", help="keep the throw-away database")
    args = parser.parse_args(argv)
    if args.nights < 1 or args.requests < 1:
        parser.error("--nights and --requests must be at least 1")
    with _database(args.db, args.admin_url, args.keep) as url, tempfile.TemporaryDirectory() as tmp:
        if sa.make_url(url).get_backend_name() != "postgresql":
            raise SystemExit(
                f"store_scale: --db must be a PostgreSQL URL, not {sa.make_url(url)!r}"
            )
        engine = open_store(url)
        try:
            built = build(engine, url, args.nights, args.requests)
            now = datetime.now(UTC)
            queries = time_queries(_libpq(url), now)
            commands = time_cli(url, Path(tmp))
            sizes = store_sizes(engine, args.nights)
            nightly = plan_job(load_job(NIGHTLY_JOB))
            ingest = time_ingestion(engine, nightly, args.requests)
        finally:
            engine.dispose()
    write_per = built.write_s / max(built.templates, 1)
    lines = [
        f"store_scale: {args.nights} nights, {built.sweeps['nightly']} nightly and "
        f"{built.sweeps['PR']} PR sweeps, {args.requests} requests per variant",
        f"built in {built.write_s + built.copy_s + built.vacuum_s:.1f} s: "
        f"{built.templates} templates written ({write_per:.1f} s each),",
        f"  copied {built.copy_s:.1f} s, VACUUM ANALYZE {built.vacuum_s:.1f} s",
        "",
        *table("query (ms, median of 3)", "30 days", "1 year", queries),
        "",
        *table("command", "wall s", "peak MiB", commands),
        "",
        *table("ingestion", "ms", "", [ingest]),
        "",
        *table("store (before the ingestion)", "MB", "MB/night", sizes),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

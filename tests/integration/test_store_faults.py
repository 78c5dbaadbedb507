"""Store faults beyond a refusing store: a full spool disk, two flushes at once, two
saves of one cell at once, duplicate variant runs stored before migration 0007 made
them unique; and the sweep lease on both kinds of store.

Real PostgreSQL (a fresh database per test, behind the FAKE TCP proxy of
tests/fakes/tcp_proxy.py where the store must fail) and SQLite; the sweeps run the FAKE
runner and FAKE builder (no engine) on a real local Ray. The full disk is a tmpfs of 4 KiB
mounted over the spool folder (the tests run as root here); where mounting is not
allowed, the spool folder is a file instead, which refuses every write as well (the
test says which it used).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command

from farm import store
from farm.orchestrate.driver import SweepEvents, SweepOptions, run_sweep
from farm.plan import Plan, ServerCell
from farm.records import CellResult, SweepRecord
from farm.spec import parse_job
from farm.store import SweepInUseError
from farm.store.db import _alembic_config
from farm.store.spool import spool_dir, spool_result, spooled
from farm.store.urls import normalize_url
from tests.fakes.cell_runner import fake_build, fake_run_cell
from tests.fakes.simulate import simulate_sweep
from tests.fakes.tcp_proxy import TcpProxy
from tests.support.jobs import SPOOL_JOB

# --- store and spool both failing ------------------------------------------------------


@pytest.fixture
def full_spool(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """FARM_HOME whose spool folder takes no file: a full 4 KiB tmpfs, or a file."""
    home = tmp_path / "home"
    folder = spool_dir(home)
    folder.mkdir(parents=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(folder)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        if mounted:
            filler = folder / "filler"
            try:
                with filler.open("wb") as f:
                    while True:
                        f.write(b"x" * 512)
                        f.flush()
            except OSError:
                pass
            kind = "tmpfs of 4 KiB, full"
        else:
            folder.rmdir()
            folder.write_text("not a folder\n")
            kind = "a file where the spool folder goes"
        print(f"spool disk: {kind}")
        yield home, kind
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)


class _Notices(SweepEvents):
    """Stops the proxy after the first result; keeps what the sweep says."""

    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy
        self.done = 0
        self.notices: list[str] = []

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def cell_done(self, cell: ServerCell, result: CellResult) -> None:
        self.done += 1
        if self.done == 1:
            self.proxy.stop()


def test_store_and_spool_both_failing_keep_the_results_and_the_sweep_resumable(
    proxied_url: tuple[str, TcpProxy],
    full_spool: tuple[Path, str],
    tmp_path: Path,
    ray_local: None,
) -> None:
    # Before: the spool's OSError escaped the result handler: the sweep stopped with a
    # traceback, the result was lost and a .json.partial stayed in the spool folder.
    url, proxy = proxied_url
    home, _ = full_spool
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    job = parse_job(SPOOL_JOB, base_dir=str(tmp_path))
    events = _Notices(proxy)
    options = SweepOptions(db_url=url, home=home, runner=fake_run_cell, builder=fake_build)
    outcome = run_sweep(job, SPOOL_JOB, options, events)
    assert len(outcome.ok) == 6 and not outcome.failed  # every cell ran
    assert len(outcome.unsaved) == 5 and outcome.spooled == ()
    assert not list(home.rglob("*.partial"))
    end = events.notices[-1]
    assert f"5 result(s) of sweep {outcome.sweep_id} could be neither stored nor spooled" in end
    assert f"`farm run JOB --resume {outcome.sweep_id}` runs those cells again" in end
    assert all(cell in end for cell in outcome.unsaved)

    proxy.start()  # the store is back; the disk is still full
    again = run_sweep(job, SPOOL_JOB, options.model_copy(update={"resume": outcome.sweep_id}))
    assert sorted(again.ok) == sorted(outcome.unsaved)
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, outcome.sweep_id)
    assert record.status == "ok"
    assert {c.result.status for c in record.cells if c.result} == {"ok"}
    assert all(c.result for c in record.cells)


# --- concurrent flushes ----------------------------------------------------------------

FLUSH = """
import sys
from farm.cli.main import app
sys.argv = ["farm", "spool", "flush", "--db", sys.argv[1]]
app()
"""


def _synthetic(url: str) -> tuple[int, SweepRecord]:
    sweep = simulate_sweep(
        rng=np.random.default_rng(5),
        graph_modes=("eager", "piecewise"),
        depths=(0, 1, 2, 3),
        sliding_windows=("on", "off"),
        thinking=("off",),
        prompts=8,
    )
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
            sweep_id = store.create_sweep(session, plan, "job: synthetic\n", "test-host")
    finally:
        engine.dispose()
    return sweep_id, sweep


def test_two_flushes_at_once_store_each_file_once(pg_url: str, tmp_path: Path) -> None:
    # Before: both flushes stored every file, and the slower one crashed on a file the
    # other had removed. Now each claims a file (a lock on it) before storing it.
    sweep_id, sweep = _synthetic(pg_url)
    home = tmp_path / "home"
    for c in sweep.cells:
        assert c.result is not None
        spool_result(home, pg_url, sweep_id, c.result)
    files = len(sweep.cells)
    env = {"FARM_HOME": str(home), "PATH": "/usr/bin:/bin", "COLUMNS": "300"}
    flushes = [
        subprocess.Popen(
            [sys.executable, "-c", FLUSH, pg_url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in flushes]
    for process, (out, err) in zip(flushes, outputs, strict=True):
        assert process.returncode == 0, out + err
        assert "Traceback" not in err, err
    stored = [line for out, _ in outputs for line in out.splitlines() if line.startswith("stored")]
    assert len(stored) == files and len(set(stored)) == files  # each file once, all of them
    assert spooled(home, pg_url) == [] and not list(home.rglob("*.json*"))
    with store.Session(store.open_store(pg_url)) as session:
        record = store.load_sweep(session, sweep_id)
    assert all(c.result is not None for c in record.cells)


# --- concurrent saves of one cell ------------------------------------------------------


def _rows(engine: sa.Engine, cell_row: int) -> tuple[int, int, int]:
    with engine.connect() as conn:
        runs = conn.execute(
            sa.text("SELECT count(*) FROM variant_run WHERE cell_row_id = :c"), {"c": cell_row}
        ).scalar_one()
        # Requests are packed one row per variant run: count their prompt ids.
        metrics, requests = (
            conn.execute(
                sa.text(
                    f"SELECT coalesce(sum({counted}), 0) FROM {table} t JOIN variant_run v "
                    "ON t.variant_run_id = v.id WHERE v.cell_row_id = :c"
                ),
                {"c": cell_row},
            ).scalar_one()
            for table, counted in (
                ("metric", "1"),
                ("request_numbers", "json_array_length(t.prompt_ids)"),
            )
        )
    return runs, metrics, requests


def test_concurrent_saves_of_one_cell_leave_one_set_of_rows(pg_url: str) -> None:
    # Before: no unique key on (cell, ordinal) and no lock: two saves that met each
    # inserted the cell's variant runs. Now the cell row is locked and the key unique.
    sweep_id, sweep = _synthetic(pg_url)
    result = sweep.cells[1].result
    assert result is not None and len(result.variants) >= 1
    engine = store.open_store(pg_url)
    with engine.connect() as conn:
        cell_row = conn.execute(
            sa.text("SELECT id FROM cell WHERE sweep_id = :s AND cell_id = :c"),
            {"s": sweep_id, "c": result.cell_id},
        ).scalar_one()
    errors: list[BaseException] = []
    savers = 4
    first_metrics: int | None = None
    try:
        for _ in range(5):
            start = threading.Barrier(savers)

            def save(start: threading.Barrier = start) -> None:
                try:
                    start.wait()
                    with store.Session(engine) as session:
                        store.save_cell_result(session, sweep_id, result)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=save) for _ in range(savers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not errors, errors
            runs, metrics, requests = _rows(engine, cell_row)
            assert runs == len(result.variants)
            assert requests == sum(len(v.requests) for v in result.variants)
            assert metrics == first_metrics if first_metrics is not None else metrics > 0
            first_metrics = metrics
        with store.Session(engine) as session:
            stored = store.load_sweep(session, sweep_id).cells[1].result
        assert stored is not None and stored.variants == result.variants
    finally:
        engine.dispose()


# --- duplicates stored before the fix ---------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'farm.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_the_migration_keeps_the_newest_set_of_duplicated_variant_runs(any_url: str) -> None:
    url = normalize_url(any_url)
    command.upgrade(_alembic_config(url), "0006")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            sweep_id = conn.execute(
                sa.text(
                    "INSERT INTO sweep (job, job_yaml, started_at, status, host, farm_version) "
                    "VALUES ('j', '', CURRENT_TIMESTAMP, 'running', 'h', 'x') RETURNING id"
                )
            ).scalar_one()
            cell = conn.execute(
                sa.text(
                    "INSERT INTO cell (sweep_id, ordinal, cell_id, engine, family, model, "
                    "graph_mode, planned_graph_mode, mtp_depth, sliding_window, remaps, "
                    "variants, fingerprint, status, argv) VALUES (:s, 0, 'c', 'e', 'vllm', "
                    "'m', 'eager', 'eager', 1, 'on', '[]', '[]', 'f', 'ok', '[]') RETURNING id"
                ),
                {"s": sweep_id},
            ).scalar_one()
            for copy in range(2):  # two saves that met: the same two variants, twice
                for ordinal in range(2):
                    run = conn.execute(
                        sa.text(
                            "INSERT INTO variant_run (cell_row_id, ordinal, thinking, workload, "
                            "concurrency, elapsed_s) VALUES (:c, :o, 'off', 'w', 1, :e) "
                            "RETURNING id"
                        ),
                        {"c": cell, "o": ordinal, "e": float(copy)},
                    ).scalar_one()
                    conn.execute(
                        sa.text(
                            "INSERT INTO metric (variant_run_id, name, position, value) "
                            "VALUES (:r, 'drafts', NULL, :v)"
                        ),
                        {"r": run, "v": copy},
                    )
        store.upgrade(url)
        with engine.connect() as conn:
            kept = conn.execute(
                sa.text(
                    "SELECT v.ordinal, v.elapsed_s, m.value FROM variant_run v "
                    "JOIN metric m ON m.variant_run_id = v.id ORDER BY v.ordinal"
                )
            ).all()
            assert [tuple(r) for r in kept] == [(0, 1.0, 1), (1, 1.0, 1)]  # the newer save
            assert conn.execute(sa.text("SELECT count(*) FROM metric")).scalar_one() == 2
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO variant_run (cell_row_id, ordinal, thinking, workload, "
                    "concurrency, elapsed_s) VALUES (:c, 0, 'off', 'w', 1, 0)"
                ),
                {"c": cell},
            )
    finally:
        engine.dispose()


# --- the sweep lease, on both stores ----------------------------------------------------


def test_the_lease_refuses_a_fresh_holder_and_passes_a_stale_one_on(any_url: str) -> None:
    sweep = simulate_sweep(
        rng=np.random.default_rng(1), depths=(1,), sliding_windows=("on",), thinking=("off",)
    )
    engine = store.open_store(any_url)
    try:
        with store.Session(engine) as session:
            plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
            sweep_id = store.create_sweep(session, plan, "job: x\n", "h", driver="h:1")
            with pytest.raises(SweepInUseError, match=r"running elsewhere: driver h:1, last "):
                store.claim_sweep(session, sweep_id, "h:2", stale_after_s=60)
            assert store.heartbeat(session, sweep_id, "h:1") is None  # still h:1's
            previous = store.claim_sweep(session, sweep_id, "h:2", stale_after_s=0)
            assert previous is not None and previous.driver == "h:1"
            lost = store.heartbeat(session, sweep_id, "h:1")
            assert lost is not None and lost.driver == "h:2"
            assert not store.finish_sweep(session, sweep_id, "interrupted", driver="h:1")
            assert store.finish_sweep(session, sweep_id, "ok", driver="h:2")
            assert store.load_sweep(session, sweep_id).status == "ok"
            # An ended sweep is claimed without a word about its last driver.
            assert store.claim_sweep(session, sweep_id, "h:3", stale_after_s=60) is None
    finally:
        engine.dispose()

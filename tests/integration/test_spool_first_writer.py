"""A stale spool file never overwrites a stored cell.

A flush stores a spooled result only into a cell that has no result yet (first writer
wins); a file for a cell another driver stored is reported and kept. Two drivers
flushing the same cell from two FARM_HOMEs into one PostgreSQL store at once: one
result lands, the other file is kept, the stored cell keeps its variant runs. A spool
file whose sweep id cannot be stored (past 2**63 - 1) is reported unreadable and does
not hide the other files. Real SQLite and real PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from farm.records import CellResult
from farm.store import Session, create_sweep, load_sweep, open_store, save_cell_result
from farm.store.spool import flush_spool, spool_result
from tests.support.cell_results import T0, ok_result, sample_plan


def _failed(cell_id: str) -> CellResult:
    return CellResult(
        cell_id=cell_id,
        status="failed",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=3),
        error="engine exited with code 1",
    )


def _runs(engine: sa.Engine, sweep_id: int, cell_id: str) -> tuple[str, int]:
    with Session(engine) as session:
        cell = next(c for c in load_sweep(session, sweep_id).cells if c.cell.cell_id == cell_id)
    assert cell.result is not None
    return cell.result.status, len(cell.result.variants)


def test_a_flush_never_replaces_a_cell_another_driver_stored(db_url: str, tmp_path: Path) -> None:
    engine = open_store(db_url)
    try:
        plan = sample_plan()
        with Session(engine) as session:
            sweep_id = create_sweep(session, plan, job_yaml="", host="a")
            cell = plan.cells[0]
            save_cell_result(session, sweep_id, ok_result(cell))  # host B's resume
        home = tmp_path / "home-a"
        stale = spool_result(home, db_url, sweep_id, _failed(cell.cell_id))  # host A's file
        fresh = spool_result(home, db_url, sweep_id, ok_result(plan.cells[1]))
        report = flush_spool(engine, home, db_url)
        assert report.stored == (f"sweep {sweep_id}: {plan.cells[1].cell_id}",)
        [kept] = report.kept
        assert str(stale) in kept and "already holds a result (ok)" in kept
        assert stale.exists() and not fresh.exists()
        assert _runs(engine, sweep_id, cell.cell_id) == ("ok", 2)  # its 2 variant runs stay
        # A second flush says the same, and still changes nothing.
        assert len(flush_spool(engine, home, db_url).kept) == 1
        assert _runs(engine, sweep_id, cell.cell_id) == ("ok", 2)
    finally:
        engine.dispose()


def test_two_drivers_flushing_one_cell_at_once_store_one_result(
    pg_url: str, tmp_path: Path
) -> None:
    setup = open_store(pg_url)
    plan = sample_plan()
    cell = plan.cells[0]
    with Session(setup) as session:
        sweep_id = create_sweep(session, plan, job_yaml="", host="a")
    setup.dispose()
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    spool_result(homes[0], pg_url, sweep_id, ok_result(cell))
    spool_result(homes[1], pg_url, sweep_id, _failed(cell.cell_id))
    start = threading.Barrier(2)
    reports: dict[int, object] = {}

    def driver(i: int) -> None:
        engine = open_store(pg_url)  # each driver its own engine and connections
        try:
            start.wait()
            reports[i] = flush_spool(engine, homes[i], pg_url)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=driver, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stored = [r for r in reports.values() if r.stored]  # type: ignore[attr-defined]
    kept = [r for r in reports.values() if r.kept]  # type: ignore[attr-defined]
    assert len(stored) == 1 and len(kept) == 1, reports
    engine = open_store(pg_url)
    try:
        status, runs = _runs(engine, sweep_id, cell.cell_id)
        # Whoever came first is stored whole; the other's file is still on disk.
        assert (status, runs) in (("ok", 2), ("failed", 0))
        left = [p for h in homes for p in h.glob("spool/sweep-*/*.json")]
        assert len(left) == 1
        assert json.loads(left[0].read_text())["result"]["status"] != status
    finally:
        engine.dispose()


def test_a_sweep_id_past_the_store_range_is_unreadable_and_hides_nothing(
    db_url: str, tmp_path: Path
) -> None:
    engine = open_store(db_url)
    try:
        plan = sample_plan()
        with Session(engine) as session:
            sweep_id = create_sweep(session, plan, job_yaml="", host="a")
        home = tmp_path / "home"
        good = spool_result(home, db_url, sweep_id, ok_result(plan.cells[0]))
        huge = spool_result(home, db_url, sweep_id, ok_result(plan.cells[1]))
        data = json.loads(huge.read_text())
        for bad_id in (2**63, 2**64 + 5, -1, 0):
            data["sweep_id"] = bad_id
            huge.write_text(json.dumps(data))
            report = flush_spool(engine, home, db_url)
            assert [u for u in report.unreadable if str(huge) in u], report
            assert huge.exists()
        assert not good.exists()  # stored on the first pass, despite its bad neighbour
    finally:
        engine.dispose()

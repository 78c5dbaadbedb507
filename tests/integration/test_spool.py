"""The store goes away mid-sweep and comes back: every result arrives.

PostgreSQL is real (a fresh database per test); the sweep reaches it through a TCP
proxy the test stops and restarts, so the store refuses connections exactly as a
stopped server does, or silences, so it answers nothing as behind a network
partition, without touching the machine's PostgreSQL under other users. The cells run
the FAKE runner and FAKE builder (no engine) on a real local Ray.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.orchestrate.driver import SweepEvents, SweepOptions, run_sweep
from farm.orchestrate.node_builds import LineSink
from farm.plan import Plan, ServerCell
from farm.records import BuildInfo, CellResult
from farm.spec import EngineSpec, parse_job
from farm.store.spool import SPOOL_FORMAT, scan_spool, spool_result, spooled
from tests.fakes.cell_runner import fake_build, fake_run_cell
from tests.fakes.simulate import simulate_sweep
from tests.fakes.tcp_proxy import TcpProxy
from tests.support.jobs import SPOOL_JOB


class _StoreGoesAway(SweepEvents):
    """Stops the proxy after the first result and restarts it after ``back_after``."""

    def __init__(self, proxy: TcpProxy, back_after: int | None) -> None:
        self.proxy = proxy
        self.back_after = back_after
        self.done = 0
        self.spooled_ids: list[str] = []

    def spooled(self, cell_id: str, where: str) -> None:
        self.spooled_ids.append(cell_id)

    def cell_done(self, cell: ServerCell, result: CellResult) -> None:
        self.done += 1
        if self.done == 1:
            self.proxy.stop()
        if self.back_after is not None and self.done == self.back_after:
            self.proxy.start()


def _sweep(tmp_path: Path, url: str, events: SweepEvents) -> tuple[int, tuple[str, ...]]:
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    job = parse_job(SPOOL_JOB, base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=url, home=tmp_path / "home", runner=fake_run_cell, builder=fake_build
    )
    outcome = run_sweep(job, SPOOL_JOB, options, events)
    assert len(outcome.ok) == 6 and not outcome.failed
    return outcome.sweep_id, outcome.spooled


def _stored(url: str, sweep_id: int) -> dict[str, str]:
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, sweep_id)
    return {c.cell.cell_id: c.result.status if c.result else "planned" for c in record.cells}


def test_results_refused_mid_sweep_reach_the_store_when_it_is_back(
    proxied_url: tuple[str, TcpProxy], tmp_path: Path, ray_local: None
) -> None:
    url, proxy = proxied_url
    # Down after the 1st result, back after the 4th: the 2nd..4th are spooled, then
    # flushed at the end of the sweep.
    events = _StoreGoesAway(proxy, back_after=4)
    sweep_id, still_spooled = _sweep(tmp_path, url, events)
    assert len(events.spooled_ids) >= 3
    assert still_spooled == ()
    assert set(_stored(url, sweep_id).values()) == {"ok"}
    assert spooled(tmp_path / "home", url) == []


def test_results_spooled_to_the_end_are_flushed_by_farm_spool_flush(
    proxied_url: tuple[str, TcpProxy], tmp_path: Path, ray_local: None
) -> None:
    url, proxy = proxied_url
    events = _StoreGoesAway(proxy, back_after=None)  # down from the 1st result on
    sweep_id, still_spooled = _sweep(tmp_path, url, events)
    assert len(still_spooled) == 5
    proxy.start()
    before = _stored(url, sweep_id)
    assert sorted(before.values()) == ["ok"] + ["planned"] * 5
    home = {"FARM_HOME": str(tmp_path / "home")}
    other = CliRunner().invoke(
        app, ["spool", "flush", "--db", f"sqlite:///{tmp_path}/x.db"], env=home
    )
    assert other.exit_code == 0 and "0 stored" in other.output  # not meant for that store
    result = CliRunner().invoke(app, ["spool", "flush", "--db", url], env=home)
    assert result.exit_code == 0, result.output
    assert "5 stored, 0 still spooled" in result.output
    assert set(_stored(url, sweep_id).values()) == {"ok"}
    assert not list((tmp_path / "home" / "spool").rglob("*.json"))


def test_resume_flushes_the_spool_first_and_reruns_nothing_it_held(
    proxied_url: tuple[str, TcpProxy], tmp_path: Path, ray_local: None
) -> None:
    url, proxy = proxied_url
    sweep_id, still_spooled = _sweep(tmp_path, url, _StoreGoesAway(proxy, back_after=None))
    assert len(still_spooled) == 5
    proxy.start()
    job = parse_job(SPOOL_JOB, base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=url,
        home=tmp_path / "home",
        resume=sweep_id,
        runner=fake_run_cell,
        builder=fake_build,
    )
    outcome = run_sweep(job, SPOOL_JOB, options)
    assert len(outcome.flushed) == 5
    assert outcome.ok == () and outcome.failed == ()  # every cell was already measured
    assert set(_stored(url, sweep_id).values()) == {"ok"}


class _BuildWhileDown(_StoreGoesAway):
    """Records how each build was placed; brings the store back after the 3rd result."""

    def __init__(self, proxy: TcpProxy) -> None:
        super().__init__(proxy, back_after=3)
        self.placed: list[str] = []

    def build_placed(self, engine: str, node: str, error: str | None) -> None:
        self.placed.append(node)

    def cell_done(self, cell: ServerCell, result: CellResult) -> None:
        self.done += 1
        if self.done == self.back_after:
            self.proxy.start()


def test_a_build_landing_while_the_store_is_down_does_not_stop_the_sweep(
    proxied_url: tuple[str, TcpProxy], tmp_path: Path, ray_local: None
) -> None:
    url, proxy = proxied_url
    events = _BuildWhileDown(proxy)

    def build_as_the_store_goes(engine: EngineSpec, cache: Path, say: LineSink) -> BuildInfo:
        proxy.stop()  # builds land while cells run; the store may be gone by then
        return fake_build(engine, cache, say)

    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    job = parse_job(SPOOL_JOB, base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=url,
        home=tmp_path / "home",
        runner=fake_run_cell,
        builder=build_as_the_store_goes,
    )
    outcome = run_sweep(job, SPOOL_JOB, options, events)
    assert len(outcome.ok) == 6 and not outcome.failed and outcome.spooled == ()
    (placed,) = events.placed
    assert "not recorded, the store refused it" in placed
    assert len(events.spooled_ids) >= 2  # the first results, while it was down
    assert set(_stored(url, outcome.sweep_id).values()) == {"ok"}


class _StoreGoesSilent(_StoreGoesAway):
    """Silences the proxy after the first result; records when."""

    def __init__(self, proxy: TcpProxy) -> None:
        super().__init__(proxy, back_after=None)
        self.silent_at: float | None = None

    def cell_done(self, cell: ServerCell, result: CellResult) -> None:
        self.done += 1
        if self.done == 1:
            self.proxy.silence()
            self.silent_at = time.monotonic()


def test_a_store_that_goes_silent_costs_the_sweep_seconds_and_loses_nothing(
    proxied_url: tuple[str, TcpProxy],
    tmp_path: Path,
    ray_local: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: a partitioned PostgreSQL blocked the driver for good (only a connect
    # timeout; no statement deadline, no keepalive). Now each store call has a deadline
    # (statement + connect timeout, here 2 + 2 s) after which the result is spooled.
    monkeypatch.setenv("FARM_DB_CONNECT_TIMEOUT_S", "2")
    monkeypatch.setenv("FARM_DB_STATEMENT_TIMEOUT_S", "2")
    monkeypatch.setenv("FARM_SWEEP_HEARTBEAT_S", "1")
    url, proxy = proxied_url
    events = _StoreGoesSilent(proxy)
    outcome: list[tuple[int, tuple[str, ...]]] = []
    driver = threading.Thread(target=lambda: outcome.append(_sweep(tmp_path, url, events)))
    driver.start()
    driver.join(timeout=300)
    if driver.is_alive():
        proxy.resume()  # let it end, then fail: it was blocked
        driver.join(timeout=120)
        pytest.fail("the sweep was still blocked on the silent store after 300 s")
    assert outcome, "the sweep raised (see the thread's traceback above)"
    assert events.silent_at is not None
    blocked_s = time.monotonic() - events.silent_at
    # Five results, the sweep's end and a flush attempt, each bounded by about 4 s; the
    # heartbeat's failure makes the later results skip the store.
    assert blocked_s < 90, f"{blocked_s:.0f} s from the store going silent to the sweep's end"
    sweep_id, still_spooled = outcome[0]
    assert len(still_spooled) == 5
    assert sorted(events.spooled_ids) == sorted(p.rsplit("/", 1)[1][:-5] for p in still_spooled)
    proxy.resume()
    result = CliRunner().invoke(
        app, ["spool", "flush", "--db", url], env={"FARM_HOME": str(tmp_path / "home")}
    )
    assert result.exit_code == 0, result.output
    assert "5 stored, 0 still spooled" in result.output
    assert set(_stored(url, sweep_id).values()) == {"ok"}


# --- versioned spool files ---------------------------------------------------------------


def _stored_sweep_with_spool(tmp_path: Path, url: str) -> tuple[int, list[Path]]:
    """A stored sweep (SQLite) whose three results are spooled, the last one in the
    format from before spool files carried a version."""
    sweep = simulate_sweep(
        rng=np.random.default_rng(3), depths=(1, 2, 3), sliding_windows=("on",), thinking=("off",)
    )
    with store.Session(store.open_store(url)) as session:
        plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
        sweep_id = store.create_sweep(session, plan, "job: synthetic\n", "test-host")
    home = tmp_path / "home"
    paths = []
    for stored in sweep.cells[:3]:
        assert stored.result is not None
        paths.append(spool_result(home, url, sweep_id, stored.result))
    old = json.loads(paths[2].read_text())
    assert old.pop("format_version") == SPOOL_FORMAT
    paths[2].write_text(json.dumps(old))
    return sweep_id, paths


def test_unreadable_spool_files_are_reported_and_left_in_place(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    sweep_id, good = _stored_sweep_with_spool(tmp_path, url)
    folder = good[0].parent
    truncated = folder / "cut.json"
    truncated.write_text(good[0].read_text()[:100])
    newer = folder / "newer.json"
    newer_version = SPOOL_FORMAT + 1
    newer.write_text(
        json.dumps({**json.loads(good[1].read_text()), "format_version": newer_version})
    )
    invalid = folder / "invalid.json"
    invalid.write_text(json.dumps({**json.loads(good[1].read_text()), "sweep_id": "one"}))
    elsewhere = folder / "other-store.json"  # readable to nobody, but says whose it is
    elsewhere.write_text(json.dumps({"format_version": 9, "store": "postgresql://x@y/z"}))

    scan = scan_spool(tmp_path / "home", url)
    assert scan.files == tuple(sorted(good))
    assert len(scan.unreadable) == 3
    reasons = "\n".join(scan.unreadable)
    assert f"{truncated}: unreadable spooled result: not valid JSON" in reasons
    assert f"{newer}: unreadable spooled result: format version {newer_version} is newer" in reasons
    assert f"{invalid}: unreadable spooled result: does not validate" in reasons
    assert str(elsewhere) not in reasons

    env = {"FARM_HOME": str(tmp_path / "home"), "COLUMNS": "300"}
    listed = CliRunner().invoke(app, ["spool", "list", "--db", url], env=env)
    assert listed.exit_code == 0, listed.output
    assert f"unreadable {truncated}: unreadable spooled result" in listed.output
    assert "3 spooled result(s) for sqlite:///" in listed.output
    assert listed.output.rstrip().endswith("3 unreadable")

    flushed = CliRunner().invoke(app, ["spool", "flush", "--db", url], env=env)
    assert flushed.exit_code == 1, flushed.output  # the unreadable files still need a look
    assert "3 stored, 0 still spooled, 3 unreadable" in flushed.output
    assert f"unreadable {invalid}" in flushed.output
    assert all(p.exists() for p in (truncated, newer, invalid, elsewhere))
    assert not any(p.exists() for p in good)
    assert set(_stored(url, sweep_id).values()) == {"ok", "planned"}

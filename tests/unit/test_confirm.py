"""The run-level decision of a confirmation against simulated runs of known shifts."""

from __future__ import annotations

import numpy as np
import pytest

from farm.analysis.compare import compare_sweeps
from farm.analysis.confirm import ConfirmRule, decide, settled, suspicious, t_quantile
from farm.analysis.confirm_plan import plan_confirmations
from farm.analysis.noise import KeyNoise, NoiseRule
from farm.records import BuildInfo, CellResult, ConfirmationRun
from tests.fakes.simulate import simulate_sweep

AL, SD = 2.9, 0.0172 * 2.9  # tiny-step's level and run-level spread (recorded nights)
FLOOR = max(0.02 * AL, 0.05)


def _runs(rng: np.random.Generator, n: int, drop: float) -> list[float]:
    return list(AL * (1 - drop) + rng.normal(0, SD, n))


def _decide(candidate: list[float], reference: list[float]):  # type: ignore[no-untyped-def]
    return decide(candidate, reference, history_sd=SD, history_nights=14, floor=FLOOR, level=0.95)


def test_t_quantile_matches_the_tables() -> None:
    for df, exact in ((4, 2.776), (8, 2.306), (20, 2.086), (1000, 1.962)):
        assert t_quantile(0.975, df) == pytest.approx(exact, abs=0.01)


def test_a_clear_drop_over_runs_is_confirmed_with_its_interval() -> None:
    c = _decide([2.70, 2.72, 2.69, 2.71, 2.70], [2.90, 2.88, 2.91, 2.89])
    assert c.outcome == "regress"
    assert c.relative.high < 0 and c.relative.estimate == pytest.approx(-0.066, abs=0.001)
    assert c.describe().startswith("confirmed over 5+4 runs: -6.6% [")


def test_a_first_run_that_drew_low_is_cleared_by_the_reruns() -> None:
    # The first run 5% low, the reruns of both sides alike.
    c = _decide([2.75, 2.91, 2.89, 2.90], [2.90, 2.89, 2.91])
    assert c.outcome == "pass"
    assert c.describe().startswith("cleared over 4+3 runs: ")


def test_a_significant_drop_under_the_floor_is_no_regression() -> None:
    # 1% lower on every run: real, but under max(2% of AL, 0.05).
    c = decide(
        [2.871] * 5, [2.90] * 4, history_sd=0.001, history_nights=14, floor=FLOOR, level=0.95
    )
    assert c.difference.high < 0 and c.outcome == "pass"


def test_without_history_the_runs_alone_give_the_variance() -> None:
    c = decide(
        [2.70, 2.72, 2.69], [2.90, 2.88], history_sd=0.0, history_nights=0, floor=FLOOR, level=0.95
    )
    assert c.df == 3 and c.outcome == "regress"
    with pytest.raises(ValueError):
        decide([2.7], [], history_sd=SD, history_nights=14, floor=FLOOR, level=0.95)


@pytest.mark.parametrize(("drop", "low", "high"), [(0.0, 0.0, 0.03), (0.06, 0.85, 1.0)])
def test_calls_over_simulated_nights(drop: float, low: float, high: float) -> None:
    """Clean cells are rarely called (the level's 2.5% at most, one-sided), a 6% drop
    nearly always, with R = 4 and early stops."""
    rng = np.random.default_rng(7)
    rule = ConfirmRule(runs=4)
    called = 0
    for _ in range(400):
        candidate: list[float] = []
        reference: list[float] = []
        outcome = None
        for _ in range(rule.runs):
            candidate += _runs(rng, 1, drop)
            reference += _runs(rng, 1, 0.0)
            early = settled(
                candidate, reference, history_sd=SD, history_nights=14, floor=FLOOR, rule=rule
            )
            if early is not None:
                outcome = early.outcome
                break
        if outcome is None:
            outcome = _decide(candidate, reference).outcome
        called += outcome == "regress"
    assert low <= called / 400 <= high


def test_only_a_pass_stops_early_and_never_before_two_pairs() -> None:
    rule = ConfirmRule(runs=4)
    args = {"history_sd": SD, "history_nights": 14, "floor": FLOOR, "rule": rule}
    assert settled([2.9, 2.9], [2.9], **args) is None  # one pair: too early
    early = settled([2.9, 2.9, 2.91], [2.9, 2.89], **args)
    assert early is not None and early.outcome == "pass" and early.early
    assert "stopped early" in early.describe()
    # A loud drop is not called early: the last look calls it.
    assert settled([2.5, 2.5, 2.5], [2.9, 2.9], **args) is None
    # At the last pair the caller decides.
    assert settled([2.9] * 5, [2.9] * 4, **args) is None


def test_what_is_suspicious() -> None:
    args = {"calibrated": True, "run_sd": SD, "floor_rel": 0.02}
    assert suspicious("pass", -0.025, **args)
    assert suspicious("regress", -0.01, **args)
    assert not suspicious("pass", -0.015, **args)
    # A deterministic engine, or a key without calibrated history: as before.
    assert not suspicious("regress", -0.1, calibrated=True, run_sd=0.0, floor_rel=0.02)
    assert not suspicious("regress", -0.1, calibrated=False, run_sd=SD, floor_rel=0.02)


# --- which cells a night confirms -----------------------------------------------------


def _comparison_night(drops: dict[float, float], device_s: float = 100.0):  # type: ignore[no-untyped-def]
    """A night of one cell per depth-like label, each ``drop`` below its reference,
    judged against the reference with a calibrated noisy history."""

    def night(seed: int, drop: dict[int, float]):  # type: ignore[no-untyped-def]
        return simulate_sweep(
            rng=np.random.default_rng(seed),
            graph_modes=("eager",),
            depths=tuple(drop),
            sliding_windows=("on",),
            thinking=("off",),
            prompts=60,
            concentration=80.0,
            effect=lambda cell, v: 1 - drop[cell.mtp_depth],
        )

    depths = {i + 1: d for i, d in enumerate(drops.values())}
    build = BuildInfo(
        build_id="b",
        engine="base",
        family="vllm",
        package="p",
        version="1",
        python="x",
        env_dir="y",
    )
    base = night(1, dict.fromkeys(depths, 0.0)).model_copy(update={"builds": (build,)})
    cand = night(1, depths).model_copy(update={"sweep_id": 2, "builds": (build,)})
    cells = []
    for c in cand.cells:
        assert c.result is not None
        result: CellResult = c.result.model_copy(update={"startup_s": device_s, "node": "n1"})
        cells.append(c.model_copy(update={"result": result}))
    cand = cand.model_copy(update={"cells": tuple(cells)})
    keys = {row.key for row in compare_sweeps(base, cand).rows}
    noise = {k: KeyNoise(nights=10, al_sd=0.04, centre=None) for k in keys}
    comparison = compare_sweeps(base, cand, noise=noise, noise_rule=NoiseRule())
    return cand, base, comparison


def test_the_most_suspicious_cells_are_confirmed_first_within_the_budget() -> None:
    night, base, comparison = _comparison_night({1: 0.0, 2: 0.04, 3: 0.08})
    plans, notes = plan_confirmations(night, base, comparison, ConfirmRule(runs=4, budget_s=1e6))
    assert [p.cell.mtp_depth for p in plans] == [3, 2]  # the clean cell is not suspicious
    assert all(p.runs == 4 and p.first_run == 1 and p.node == "n1" for p in plans)
    # 1000 device-s: the first cell's 4 pairs (800), one pair of the next (200).
    plans, notes = plan_confirmations(night, base, comparison, ConfirmRule(runs=4, budget_s=1000))
    assert [(p.cell.mtp_depth, p.runs) for p in plans] == [(3, 4), (2, 1)]
    plans, notes = plan_confirmations(night, base, comparison, ConfirmRule(runs=4, budget_s=900))
    assert [(p.cell.mtp_depth, p.runs) for p in plans] == [(3, 4)]
    (note,) = notes
    assert "mtp2" in note and "budget (900 device-s) is spent" in note


def test_no_confirmation_without_a_baseline_or_runs() -> None:
    night, base, comparison = _comparison_night({1: 0.08})
    assert plan_confirmations(night, None, comparison, ConfirmRule()) == ((), ())
    assert plan_confirmations(night, base, comparison, ConfirmRule(runs=0)) == ((), ())
    no_build = base.model_copy(update={"builds": ()})
    plans, (note,) = plan_confirmations(night, no_build, comparison, ConfirmRule())
    assert plans == () and "sweep 1 (last good night) has no build of base" in note


def test_reruns_decide_only_the_variants_that_were_suspicious() -> None:
    """Reruns stored for a cell whose variant was not suspicious (another variant of it
    was, or a replay) never replace that variant's verdict."""
    night, base, _ = _comparison_night({1: 0.0, 2: 0.08})
    by_depth = {c.cell.mtp_depth: c for c in night.cells}
    low, _, _ = _comparison_night({1: 0.2, 2: 0.2})  # runs 20% lower everywhere
    reruns = tuple(
        ConfirmationRun(
            cell_id=by_depth[depth].cell.cell_id,
            side=side,
            run=k,
            build_id="b",
            result=(low if side == "candidate" else base).cells[depth - 1].result,
        )
        for depth in (1, 2)
        for k in (1, 2, 3)
        for side in ("candidate", "reference")
    )
    keys = {row.key for row in compare_sweeps(base, night).rows}
    noise = {k: KeyNoise(nights=10, al_sd=0.04, centre=None) for k in keys}
    rows = {
        r.key.value("mtp_depth"): r
        for r in compare_sweeps(
            base,
            night.model_copy(update={"confirmations": reruns}),
            noise=noise,
            noise_rule=NoiseRule(),
        ).rows
    }
    assert rows[1].outcome == "pass" and rows[1].confirmation is None
    assert rows[2].confirmation is not None and rows[2].outcome == "regress"

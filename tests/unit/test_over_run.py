"""Acceptance over the course of one cell's run (farm.analysis.over_run, through judge):
simulated runs of known shape, the false-alarm rate on clean cells, the cost's shape,
the finding, its alert and its chart."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from farm.analysis import over_run
from farm.analysis.alert_rules import alert_candidates
from farm.analysis.check_rules import CheckConfig
from farm.analysis.judgement import judge
from farm.analysis.over_run import (
    COLLAPSE_CHECK,
    CollapseRule,
    acceptance_over_run,
    change_point,
    conversation_round,
    run_profile,
)
from farm.analysis.rules import bisect_rules, night_rules, pr_rules
from farm.analysis.summary import summarize_sweep
from farm.records import RequestRecord, StoredCell, SweepRecord, summed_counters
from farm.report.charts import over_run_svg
from farm.report.html import render_html
from tests.fakes.simulate import (
    expected_al,
    factor_for_drop,
    prompt_acceptance,
    simulate_requests,
    simulate_sweep,
)

MEAN, CONC, DEPTH = 0.8, 8.0, 3
CHECK = CheckConfig(resamples=400)
RULES = night_rules(check=CHECK)


def _p(n: int, seed: int, concentration: float = CONC) -> np.ndarray:
    return prompt_acceptance(
        n, mean=MEAN, concentration=concentration, rng=np.random.default_rng(seed)
    )


def _collapsing(n: int, seed: int, start: float = 2 / 3, factor: float = 0.3) -> np.ndarray:
    p = _p(n, seed)
    p[int(n * start) :] *= factor
    return p


def _requests(p: np.ndarray, seed: int, **kw: object) -> tuple[RequestRecord, ...]:
    return simulate_requests(p, depth=DEPTH, rng=np.random.default_rng(seed + 1000), **kw)  # type: ignore[arg-type]


def _night(
    requests: Sequence[RequestRecord], sweep_id: int = 2, engine: str = "base"
) -> SweepRecord:
    """A one-cell sweep (eager, MTP 3) whose one variant served ``requests``."""
    sweep = simulate_sweep(
        rng=np.random.default_rng(7),
        engines=(engine,),
        graph_modes=("eager",),
        depths=(DEPTH,),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=4,
        sweep_id=sweep_id,
    )
    [stored] = sweep.cells
    assert stored.result is not None
    [variant] = stored.result.variants
    counters = summed_counters([r.counters for r in requests if r.counters is not None])
    variant = variant.model_copy(update={"requests": tuple(requests), "counters": counters})
    result = stored.result.model_copy(update={"variants": (variant,)})
    return sweep.model_copy(update={"cells": (StoredCell(cell=stored.cell, result=result),)})


def test_a_collapse_in_the_last_third_is_caught_while_the_mean_passes() -> None:
    n = 900
    p = _collapsing(n, seed=1)
    # A last good night with the same mean AL, spread evenly over its run.
    run_al = (2 * expected_al(MEAN, CONC, DEPTH) + expected_al(MEAN, CONC, DEPTH, 0.3)) / 3
    drop = 1 - run_al / expected_al(MEAN, CONC, DEPTH)
    even = _p(n, seed=1) * factor_for_drop(MEAN, CONC, DEPTH, drop)
    night, last_good = _night(_requests(p, 1)), _night(_requests(even, 2), sweep_id=1)
    judged = judge(night, last_good, None, RULES)
    assert not [f for f in judged.findings if f.source == "baseline"]  # the mean passes
    [found] = [f for f in judged.findings if f.check == COLLAPSE_CHECK]
    print(found.summary)
    assert found.source == "over_run" and found.is_regression
    assert found.cells == (night.cells[0].cell.cell_id,)
    assert "over the first 6" in found.summary and "from request 6" in found.summary
    fig = found.figures[0]
    assert fig.over == "request" and fig.begins_at is not None
    assert abs(fig.begins_at - 600) <= 30  # where it began, near the truth
    assert fig.reference_value.estimate and fig.reference_value.estimate > 2.7
    assert fig.candidate_value.estimate and fig.candidate_value.estimate < 1.6
    assert (COLLAPSE_CHECK, found.label) in judged.checked
    [alert] = [a for a in alert_candidates(judged) if a.kind == COLLAPSE_CHECK]
    assert alert.severity == "critical" and alert.summary.startswith(COLLAPSE_CHECK)


def test_a_steady_cell_and_a_slow_noisy_one_are_not_flagged() -> None:
    steady = acceptance_over_run(_requests(_p(600, 3), 3), rng=np.random.default_rng(0))
    assert steady.change is None or not steady.change.collapsed
    # Noisy (few verify steps, widely spread prompts) and drifting 15% down the run.
    p = _p(600, 4, concentration=3.0) * np.linspace(1.0, 0.85, 600)
    slow = acceptance_over_run(
        _requests(p, 4, verify_steps=8.0), rng=np.random.default_rng(0), resamples=400
    )
    assert slow.change is not None and not slow.change.collapsed
    assert slow.collapses == ()


def test_false_alarms_over_500_clean_cells() -> None:
    rule, alarms = CollapseRule(), 0
    for seed in range(500):
        rng = np.random.default_rng(seed)
        p = prompt_acceptance(240, mean=MEAN, concentration=CONC, rng=rng)
        run = acceptance_over_run(
            simulate_requests(p, depth=DEPTH, rng=rng, verify_steps=20.0),
            rule,
            rng=rng,
            resamples=400,
        )
        alarms += bool(run.collapses)
    print(f"collapse_over_run false alarms: {alarms} of 500 clean cells")
    assert alarms / 500 <= 0.01


def test_a_collapse_over_conversation_rounds_names_the_round() -> None:
    rng = np.random.default_rng(5)
    p = prompt_acceptance(60, mean=MEAN, concentration=CONC, rng=rng)
    requests: list[RequestRecord] = []
    for k, pk in enumerate(p):
        turns = simulate_requests(
            np.array([pk, pk, pk * 0.2, pk * 0.1]), depth=DEPTH, rng=rng, prefix="x"
        )
        ids = [f"q{k}", f"q{k}#2", f"q{k}#3", f"q{k}#4"]
        requests += [t.model_copy(update={"prompt_id": i}) for t, i in zip(turns, ids, strict=True)]
    run = acceptance_over_run(requests, rng=np.random.default_rng(0), resamples=400)
    assert [r.round for r in run.rounds] == [1, 2, 3, 4]
    assert run.round_change is not None and run.round_change.collapsed
    assert run.round_change.at == 4 and run.round_change.began == 3
    judged = judge(_night(requests), None, None, RULES)
    found = [f for f in judged.findings if f.check == COLLAPSE_CHECK and "round" in f.summary]
    assert found and "the fall begins at round 3" in found[0].summary
    night = _night(requests)
    assert judged.within is not None
    page = render_html(
        night, summarize_sweep(night), judged.within, verdict=judged.verdict("nightly")
    )
    assert "Acceptance over the run" in page and "conversation round" in page


def test_conversation_rounds_are_read_from_request_ids() -> None:
    assert conversation_round("q7#3") == ("q7", 3)
    assert conversation_round("q7") == ("q7", 1)
    assert conversation_round("a#b") == ("a#b", 1)
    assert conversation_round("#2") == ("#2", 1)


class _Counting(Sequence[RequestRecord]):
    """The requests, counting every time one of them is handed out."""

    def __init__(self, items: Sequence[RequestRecord]) -> None:
        self.items, self.touched = tuple(items), 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self.touched += 1
        return self.items[i]

    def __iter__(self) -> Iterator[RequestRecord]:
        for r in self.items:
            self.touched += 1
            yield r


def test_the_cost_follows_the_requests_not_their_square(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[tuple[int, int]] = []
    real = over_run._draws

    def counted_draws(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
        draws.append((k, n))
        return real(rng, n, k)

    monkeypatch.setattr(over_run, "_draws", counted_draws)
    monkeypatch.setattr(over_run, "_CHUNK_CELLS", 50_000)
    for n in (300, 3000):
        requests = _Counting(_requests(_collapsing(n, seed=n), n))
        draws.clear()
        run = acceptance_over_run(requests, rng=np.random.default_rng(0), resamples=200)
        assert run.change is not None and run.change.collapsed
        assert requests.touched == n  # each request read once
        # The bootstrap: each side's requests drawn 200 times, in chunks, never n x n.
        assert sum(k * m for k, m in draws) == 200 * n
        assert all(k * m <= max(50_000, m) for k, m in draws)


def test_the_change_point_scan_agrees_with_every_split_tried() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(10, 60))
        acc = rng.integers(0, 30, size=n).astype(float)
        drafts = rng.integers(1, 12, size=n).astype(float)
        best, best_k = 0.0, None
        for k in range(3, n - 3 + 1):  # the quadratic reference
            dl, dr = drafts[:k].sum(), drafts[k:].sum()
            s = (acc[:k].sum() / dl - acc[k:].sum() / dr) * np.sqrt(dl * dr / drafts.sum())
            if s > best:
                best, best_k = s, k
        assert change_point(acc, drafts, 3) == best_k


def test_short_runs_are_a_note_and_bisection_does_not_look() -> None:
    judged = judge(_night(_requests(_p(30, 9), 9)), None, None, RULES)
    assert not [f for f in judged.findings if f.check == COLLAPSE_CHECK]
    assert any("fewer than 40 requests" in n for n in judged.notes)
    collapsed = _night(_requests(_collapsing(300, 10), 10))
    assert bisect_rules().over_run is None
    assert not [
        f
        for f in judge(collapsed, None, None, bisect_rules()).findings
        if f.check == COLLAPSE_CHECK
    ]


def test_a_pr_whose_base_collapses_too_is_not_failed_for_it() -> None:
    cand = _night(_requests(_collapsing(300, 11), 11), engine="cand")
    base = _night(_requests(_collapsing(300, 12), 12), sweep_id=3)
    rules = pr_rules(candidate="cand", base="base", check=CHECK)
    judged = judge(cand, base, None, rules)
    assert not [f for f in judged.findings if f.check == COLLAPSE_CHECK]
    assert any("the base collapses too" in n for n in judged.notes)
    steady = _night(_requests(_p(300, 12), 12), sweep_id=3)
    assert [f for f in judge(cand, steady, None, rules).findings if f.check == COLLAPSE_CHECK]


def test_the_chart_marks_the_split_and_fits_two_to_a_1280_px_row() -> None:
    requests = _requests(_collapsing(600, 13), 13)
    bins = run_profile(requests)
    assert 1 <= len(bins) <= 60 and bins[0].start == 0 and bins[-1].end == 600
    svg = over_run_svg("cell[think-off]", bins, split_at=400, before_al=2.9, after_al=1.2)
    assert 'width="620"' in svg and 'class="split"' in svg and "AL 1.20 after" in svg
    assert "request 401" in svg and svg.count("<circle") == len(bins)
    assert "no acceptance counted" in over_run_svg("x", ())

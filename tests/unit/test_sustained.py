"""Sustained drops over a key's nights: a step named with its first night and builds, a
spike never, clean noisy series rarely, a key without spread or history not at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
import pytest

from farm.analysis.history import HistoryPoint, series_from_sweeps
from farm.analysis.noise import night_to_night_sd, night_to_night_sds
from farm.analysis.sustained import (
    SUSTAINED_CHECK,
    SustainedRule,
    step_scores,
    step_threshold,
    sustained_drop,
    sustained_drops,
    sustained_findings,
    sustained_notes,
    window_score,
)
from farm.records import BuildInfo
from tests.fakes.simulate import simulate_sweep

DAY0 = datetime(2026, 1, 1, tzinfo=UTC)
RULE = SustainedRule()


def _points(values: npt.NDArray[np.float64], change: int | None = None) -> list[HistoryPoint]:
    """Sweeps 100.. one a day; build ``old`` before night ``change``, ``new`` from it."""
    return [
        HistoryPoint(
            sweep_id=100 + i,
            timestamp=DAY0 + timedelta(days=i),
            value=float(v),
            builds=("new",) if change is not None and i >= change else ("old",),
        )
        for i, v in enumerate(values)
    ]


def _nights(n: int, seed: int, sd: float, level: float = 2.7) -> npt.NDArray[np.float64]:
    """``n`` nights of AL ``level`` with a run-level relative sd ``sd``."""
    return level * (1.0 + sd * np.random.default_rng(seed).standard_normal(n))


@pytest.mark.parametrize(("drop", "after"), [(0.02, 6), (0.03, 4)])
def test_a_sustained_step_is_named_with_its_first_night_and_builds(drop: float, after: int) -> None:
    values = _nights(31 + after, seed=3, sd=0.004)
    values[31:] *= 1.0 - drop
    result = sustained_drop(_points(values, change=31))
    d = result.drop
    assert result.status == "checked" and d is not None
    assert (d.start_sweep_id, d.before_sweep_id, d.nights) == (131, 130, after)
    assert (d.builds_before, d.builds_after) == (("old",), ("new",))
    assert d.relative_low < -drop < d.relative_high
    assert d.score >= d.threshold == result.threshold
    text = result.describe()
    assert f"over {after} nights since sweep 131 (build old -> new)" in text
    assert text.startswith(f"sustained drop of {d.relative:+.1%} [")


def test_one_bad_night_is_never_a_step_wherever_it_falls() -> None:
    values = _nights(35, seed=4, sd=0.004)
    for at in range(28, 35):
        spiked = values.copy()
        spiked[at] *= 0.5  # a night that lost half its AL, alone
        assert sustained_drop(_points(spiked)).drop is None, at


def test_two_low_nights_are_the_least_a_step_is() -> None:
    values = _nights(37, seed=5, sd=0.004)
    values[35:] *= 0.96
    d = sustained_drop(_points(values)).drop
    assert d is not None and (d.start_sweep_id, d.nights) == (135, 2)
    assert d.builds_text() == "build old on both nights"


def test_an_old_step_leaves_the_window() -> None:
    values = _nights(40, seed=6, sd=0.004)
    values[20:] *= 0.95  # 20 nights ago: the new level is the reference now
    assert sustained_drop(_points(values)).drop is None


def test_clean_noisy_nights_rarely_fire() -> None:
    """Run-level sd 1.72% (the recorded nights'): over 100 keys x 10 nights judged, the
    expected count at alpha = 0.135% is 1.4 key-nights."""
    fired = 0
    for seed in range(100):
        points = _points(_nights(45, seed=1000 + seed, sd=0.0172))
        fired += sum(sustained_drop(points[:n]).drop is not None for n in range(36, 46))
    assert fired <= 5


@pytest.mark.parametrize("nights", [RULE.min_nights, 14, RULE.max_nights])
def test_the_threshold_holds_the_per_night_false_alarm_rate(nights: int) -> None:
    """Fresh noise (another seed than the threshold's), any level and scale: the share
    of series whose largest score reaches the threshold is about alpha."""
    h = step_threshold(nights, RULE)
    rng = np.random.default_rng(99)
    values = 2.7 + 0.05 * rng.standard_normal((100_000, nights))
    rate = float(np.mean(window_score(step_scores(values, RULE), nights, RULE) >= h))
    assert RULE.alpha / 2 < rate < 2 * RULE.alpha
    assert step_threshold(nights, RULE) == h  # deterministic


def test_no_spread_or_too_few_nights_tests_nothing() -> None:
    flat = np.full(20, 2.7)
    flat[15:] = 2.5  # a deterministic engine's drop: the change-point check's
    result = sustained_drop(_points(flat))
    assert (result.status, result.drop) == ("no_spread", None)
    short = sustained_drop(_points(_nights(RULE.min_nights - 1, seed=7, sd=0.02)))
    assert (short.status, short.drop) == ("insufficient_history", None)
    assert short.describe() == f"insufficient history: 6 of {RULE.min_nights} nights"
    assert sustained_drop([]).status == "insufficient_history"
    assert sustained_notes([result]) == [] and sustained_notes([]) == []
    [note] = sustained_notes([result, short])
    assert note.endswith("1 with insufficient history (fewer than 7 nights)")


def test_the_vectorised_spread_is_the_calibrations() -> None:
    rows = np.random.default_rng(8).normal(2.7, 0.05, (5, 12))
    assert np.allclose(night_to_night_sds(rows), [night_to_night_sd(list(r)) for r in rows])


def _build(build_id: str, engine: str) -> BuildInfo:
    return BuildInfo(
        build_id=build_id,
        engine=engine,
        family="vllm",
        package="vllm",
        version="0.1",
        python="/bin/python",
        env_dir="/env",
    )


def test_findings_name_the_key_cells_and_builds_of_the_judged_sweep() -> None:
    sweep = simulate_sweep(
        rng=np.random.default_rng(9),
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("on",),
        prompts=8,
        sweep_id=135,
    )
    [stored] = sweep.cells
    key = stored.cell.variant_key(stored.cell.variants[0].axes)
    values = _nights(36, seed=10, sd=0.004)
    values[31:] *= 0.97
    other = key.model_copy(update={"engine": "other"})
    results = sustained_drops(
        {key: _points(values, change=31), other: _points(values, change=31)[:-1]}
    )
    [finding] = sustained_findings(results, sweep)  # the other key was not measured
    assert (finding.source, finding.check, finding.key) == ("history", SUSTAINED_CHECK, key)
    assert finding.cells == (stored.cell.cell_id,)
    assert "since sweep 131 (build old -> new)" in finding.summary
    assert finding.relative is not None and finding.relative < -0.02
    [figure] = finding.figures
    assert figure.difference.low is not None and figure.difference.low < 0
    assert sustained_notes(results) == [
        "sustained drops over the last 7 nights: 2 key(s) tested, 0 without "
        "night-to-night spread, 0 with insufficient history (fewer than 7 nights)"
    ]


def test_series_points_carry_their_engines_builds() -> None:
    sweep = simulate_sweep(
        rng=np.random.default_rng(11),
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("on",),
        prompts=8,
    )
    sweep = sweep.model_copy(update={"builds": (_build("abc", "base"), _build("xyz", "other"))})
    [points] = series_from_sweeps([sweep], resamples=10).values()
    assert [p.builds for p in points] == [("abc",)]

"""Change points over nightly AL series: step changes, dips, minimum effect, keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
import pytest

from farm.analysis.history import (
    EDivisive,
    HistoryConfig,
    HistoryPoint,
    WindowedTTest,
    analyze_histories,
    analyze_history,
    series_from_sweeps,
    welch_pvalue,
)
from tests.fakes.simulate import simulate_sweep

DAY0 = datetime(2026, 1, 1, tzinfo=UTC)


def _series(values: npt.NDArray[np.float64]) -> list[HistoryPoint]:
    return [
        HistoryPoint(sweep_id=100 + i, timestamp=DAY0 + timedelta(days=i), value=float(v))
        for i, v in enumerate(values)
    ]


def _noise(n: int, seed: int, level: float = 3.0, sd: float = 0.015) -> npt.NDArray[np.float64]:
    return np.random.default_rng(seed).normal(level, sd, n)


def test_step_change_is_an_alert_at_the_first_bad_sweep() -> None:
    values = _noise(20, 1)
    values[14:] -= 0.15  # 5% drop from sweep 114 on
    result = analyze_history(_series(values))
    [alert] = result.alerts
    assert alert.index == 14 and alert.sweep_id == 114
    assert alert.before_mean == pytest.approx(3.0, abs=0.02)
    assert alert.after_mean == pytest.approx(2.85, abs=0.02)
    assert alert.relative_change == pytest.approx(-0.05, abs=0.01)
    assert alert.pvalue < 1e-6 and alert.detection_pvalue <= 0.05
    assert alert.confirmed and alert.meets_min_effect


def test_windowed_t_test_strategy_finds_the_same_step() -> None:
    values = _noise(20, 2)
    values[12:] -= 0.15
    [alert] = analyze_history(_series(values), test=WindowedTTest()).alerts
    assert alert.index == 12


def test_single_point_dip_is_not_an_alert() -> None:
    for seed in range(5):
        values = _noise(20, seed)
        values[10] -= 0.3
        result = analyze_history(_series(values))
        assert result.alerts == (), result.change_points


def test_a_drop_seen_on_the_last_sweep_only_waits_for_confirmation() -> None:
    values = _noise(20, 3)
    values[-1] -= 0.3
    assert analyze_history(_series(values)).alerts == ()
    values[-2] -= 0.3
    [alert] = analyze_history(_series(values)).alerts
    assert alert.index == 18 and alert.after_n == 2


def test_drop_below_the_minimum_effect_is_not_an_alert() -> None:
    values = _noise(30, 4, sd=0.003)
    values[15:] -= 0.03  # 1%: clearly a change, too small to alert on
    result = analyze_history(_series(values))
    assert [c.index for c in result.change_points] == [15]
    assert not result.change_points[0].meets_min_effect and result.alerts == ()
    looser = analyze_history(_series(values), config=HistoryConfig(min_relative_drop=0.005))
    assert len(looser.alerts) == 1


def test_increase_and_flat_series_give_no_alert() -> None:
    up = _noise(20, 5)
    up[10:] += 0.2
    result = analyze_history(_series(up))
    assert [c.index for c in result.change_points] == [10] and result.alerts == ()
    for seed in range(5):
        assert analyze_history(_series(_noise(25, 10 + seed))).alerts == ()


def test_detection_is_reproducible_and_order_independent() -> None:
    values = _noise(20, 6)
    values[14:] -= 0.1
    points = _series(values)
    a = analyze_history(points, rng=np.random.default_rng(1))
    b = analyze_history(list(reversed(points)), rng=np.random.default_rng(1))
    assert a == b


def test_edivisive_needs_a_real_difference() -> None:
    assert EDivisive().find(np.full(10, 3.0), np.random.default_rng(0)) == []
    assert EDivisive().find(np.array([3.0]), np.random.default_rng(0)) == []


def test_welch_pvalue_matches_scipy() -> None:
    x = np.array([3.0, 3.1, 2.9, 3.05])
    y = np.array([2.7, 2.8, 2.75])
    # scipy.stats.ttest_ind(x, y, equal_var=False).pvalue
    assert welch_pvalue(x, y) == pytest.approx(0.004133685977573204, rel=1e-9)
    assert np.isnan(welch_pvalue(x[:1], y[:1]))
    assert welch_pvalue(np.full(3, 1.0), np.full(3, 1.0)) == 1.0


def test_series_from_sweeps_keys_ignore_the_sweep() -> None:
    sweeps = [
        simulate_sweep(
            rng=np.random.default_rng(s),
            graph_modes=("eager",),
            depths=(0, 2),
            sliding_windows=("on",),
            thinking=("off",),
            prompts=20,
            sweep_id=s,
        ).model_copy(update={"started_at": DAY0 + timedelta(days=s)})
        for s in (3, 1, 2)
    ]
    series = series_from_sweeps(sweeps, resamples=100)
    [(key, points)] = series.items()
    assert key.value("mtp_depth") == 2 and key.value("graph_mode") == "eager"
    assert key.engine == "base"
    assert [p.sweep_id for p in points] == [1, 2, 3]
    assert all(
        p.low is not None and p.high is not None and p.low <= p.value <= p.high for p in points
    )
    [analysis] = analyze_histories(series)
    assert analysis.key == key and analysis.points == 3

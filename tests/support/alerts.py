"""Alerts the tests share: a simulated sweep to raise them from, its candidates, a stored
alert record to notify, the secrets of the chat channels, and the CLI's environment."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from farm.analysis.alert_rules import alert_candidates
from farm.analysis.check_rules import CheckConfig
from farm.analysis.judgement import JudgeRules, judge
from farm.comparable import ComparableKey
from farm.notify import AlertCandidate, AlertDetails, AlertFigure, AlertRecord, FigureInterval
from farm.records import SweepRecord
from tests.fakes.simulate import simulate_sweep
from tests.support.nights import fdo_bug

__all__ = [
    "FEISHU_SECRET",
    "SLACK_TOKEN",
    "alert_record",
    "candidates_of",
    "cli_env",
    "synthetic_sweep",
]

SLACK_TOKEN = "XoXbSeCrEt0123456789abcdef"
FEISHU_SECRET = "fs-secret-9f8e7d6c5b4a"


def alert_record(
    id: int = 7, severity: str = "critical", summary: str = "AL fell <sharply> & fast"
) -> AlertRecord:
    """A stored alert (AL of a full-decode-only cell against eager) to notify."""
    cell = ComparableKey(
        family="vllm-ascend",
        engine="ascend-main",
        model="step3p5-flash",
        graph_mode="full_decode_only",
        mtp_depth=3,
        sliding_window="on",
        thinking="off",
        workload="aime25",
    )
    figure = AlertFigure(
        metric="mean_acceptance_length",
        candidate="ascend-main.step3p5-flash.full_decode_only.mtp3.swa-on[think-off.aime25]",
        reference="ascend-main.step3p5-flash.eager.mtp3.swa-on[think-off.aime25]",
        candidate_value=FigureInterval.of(2.51, 2.40, 2.60, 0.95),
        reference_value=FigureInterval.of(2.90, 2.76, 3.03, 0.95),
        difference=FigureInterval.of(-0.40, -0.47, -0.33, 0.95),
        relative=-0.137,
        paired=True,
        pairs=200,
        min_effect=0.058,
    )
    now = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    return AlertRecord.model_validate(
        {
            "id": id,
            "key": f"graph_vs_eager:mean_acceptance_length:{cell}",
            "kind": "graph_vs_eager",
            "metric": "mean_acceptance_length",
            "state": "untriaged",
            "severity": severity,
            "summary": summary,
            "details": AlertDetails(
                cell=cell,
                sweep_id=12,
                figures=(figure,),
                attribution="graph_mode=full_decode_only AND mtp_depth>=2 AND sliding_window=on",
            ),
            "first_sweep_id": 12,
            "last_sweep_id": 12,
            "opened_sweep_id": 12,
            "occurrences": 1,
            "created_at": now,
            "updated_at": now,
        }
    )


def synthetic_sweep(seed: int, regressed: bool = True) -> SweepRecord:
    """A simulated sweep of four cells (eager and full decode only, MTP 1 and 3), 40
    prompts, with :func:`~tests.support.nights.fdo_bug` if ``regressed``."""
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "full_decode_only"),
        depths=(1, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=40,
        effect=fdo_bug if regressed else None,
    )


def candidates_of(sweep: SweepRecord) -> list[AlertCandidate]:
    """The alert candidates of ``sweep`` judged alone (no history), depth invariance on."""
    rules = JudgeRules(check=CheckConfig(resamples=300), depth_invariance=True)
    return alert_candidates(judge(sweep, rules=rules))


def cli_env(url: str, **extra: str | None) -> dict[str, str | None]:
    """A CLI run's environment: the store at ``url``, no GitHub and no notifier but
    ``extra``."""
    env: dict[str, str | None] = {
        "FARM_DB_URL": url,
        "COLUMNS": "250",
        "GITHUB_TOKEN": None,
        "FARM_GITHUB_API": None,
    }
    for name in (
        "WEBHOOK_URL",
        "WEBHOOK_SECRET",
        "SLACK_URL",
        "FEISHU_URL",
        "FEISHU_SECRET",
        "FEISHU_FORMAT",
        "WECOM_URL",
    ):
        env[f"FARM_NOTIFY_{name}"] = None
    env.update(extra)
    return env

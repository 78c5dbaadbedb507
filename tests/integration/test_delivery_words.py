"""Say what happened. "sent N alert(s) to X" is printed only for
the channels that took them; a failed channel is named, and the alerts are said to
stay pending, in `farm alerts check` and `farm nightly` alike (farm.notify.delivery),
and both exit 4 for it (before: `farm nightly` exited with the verdict's 1 or 3, `farm
alerts check` 1, for the same failure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.notify.delivery import EXIT_UNDELIVERED, delivery_lines
from tests.fakes.receiver import Receiver
from tests.support.alerts import cli_env, synthetic_sweep
from tests.support.nights import nightly_resume, synthetic_night
from tests.support.stores import save_sweep, store_sweep

runner = CliRunner()


def test_the_words_follow_what_each_channel_did() -> None:
    assert delivery_lines(2, ["webhook"], []) == [("sent 2 alert(s) to webhook", True)]
    failed = delivery_lines(1, [], ["slack POST https://hooks.slack.com/***: HTTP 500"])
    assert not any("sent 1" in line for line, _ in failed)
    assert all(not good for _, good in failed) and "stay pending" in failed[-1][0]
    mixed = delivery_lines(1, ["webhook"], ["slack ...: refused"])
    assert mixed[0] == ("sent 1 alert(s) to webhook", True) and len(mixed) == 3
    assert delivery_lines(0, [], []) == []


def test_a_failed_channel_is_not_reported_as_sent(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    sweep = save_sweep(url, synthetic_sweep(7))
    receiver.answer((500, "down"))
    env = cli_env(url, FARM_NOTIFY_SLACK_URL=receiver.url("/slack"))
    result = runner.invoke(app, ["alerts", "check", str(sweep.sweep_id)], env=env)
    assert result.exit_code == EXIT_UNDELIVERED == 4, result.output
    assert "sent 1 alert(s)" not in result.output
    assert "notification failed: slack" in result.output and "stay pending" in result.output


def test_nightly_and_alerts_check_give_one_exit_status_for_a_failed_channel(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store_sweep(url, synthetic_night(1, regressed=False))
    bad = store_sweep(url, synthetic_night(2, regressed=True))
    receiver.answer(*[(500, "down")] * 4)  # the night's two causes, then the check's
    monkeypatch.setenv("FARM_NOTIFY_SLACK_URL", receiver.url("/slack"))
    outcome = nightly_resume(url, bad, notify=True)
    assert outcome.check.verdict.outcome == "regression" and outcome.check.errors
    assert outcome.exit_status == EXIT_UNDELIVERED  # not the regression's 1
    env = cli_env(url, FARM_NOTIFY_SLACK_URL=receiver.url("/slack"))
    checked = runner.invoke(app, ["alerts", "check", str(bad)], env=env)
    assert checked.exit_code == EXIT_UNDELIVERED, checked.output

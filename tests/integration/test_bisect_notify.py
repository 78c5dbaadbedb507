"""`farm bisect --notify`: the answer goes to the chat channels set in FARM_NOTIFY_*.

Through the CLI around the FAKE sweep runner of tests/fakes/bisect_sweeps.py (real git, store,
search and statistics; simulated acceptance per commit), with a FAKE receiver
(tests/fakes/receiver.py) standing in for Slack and WeCom.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.notify.registry import ENV_VARS
from tests.fakes.bisect_sweeps import FakeSweepRunner
from tests.fakes.receiver import receiving
from tests.support.bisection import plugin_history

TOKEN = "XoXbSeCrEtSlackToken0123456789"


def test_bisect_notify_names_the_guilty_commit_in_the_channels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = plugin_history(tmp_path, 9)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fake = FakeSweepRunner(url, h.commits, guilty=6)
    monkeypatch.setattr("farm.cli.bisect._runner", lambda url, only, ray: fake)
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    argv = ["bisect", str(h.job_file), "--engine", "vllm-cpu", "--db", url, "--notify"]
    argv += ["--good", h.commits[0], "--bad", h.commits[-1]]
    env = {
        "FARM_HOME": str(tmp_path / "home"),
        "COLUMNS": "200",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    guilty = f"first bad commit: {h.commits[6][:12]} change 6 (#106)"

    with receiving() as slack:
        slack_url = slack.url(f"/services/T0/B0/{TOKEN}")
        result = CliRunner().invoke(app, argv, env={**env, "FARM_NOTIFY_SLACK_URL": slack_url})
    print(result.output)
    assert result.exit_code == 0, result.output
    assert "sent to slack" in result.stdout
    [post] = slack.requests
    blocks = post.json()["blocks"]
    assert blocks[0]["text"]["text"].endswith(f"first bad commit {h.commits[6][:12]} (PR #106)")
    assert blocks[1]["text"]["text"].startswith(guilty)
    measured = len(fake.sweeps)

    # No channel configured: a warning naming the variables; the exit status is the answer's.
    result = CliRunner().invoke(app, argv, env=env)
    assert result.exit_code == 0, result.output
    [warning] = [line for line in result.stderr.splitlines() if "--notify" in line]
    assert "no notification channel is configured" in warning
    assert "FARM_NOTIFY_SLACK_URL" in warning and "FARM_NOTIFY_WEBHOOK_URL" in warning

    # Slack refuses: WeCom still gets the answer, the exit status is 4, no secret shown.
    with receiving() as channels:
        channels.answer((404, "no_service"), (200, '{"errcode":0,"errmsg":"ok"}'))
        result = CliRunner().invoke(
            app,
            argv,
            env={
                **env,
                "FARM_NOTIFY_SLACK_URL": channels.url(f"/services/T0/B0/{TOKEN}"),
                "FARM_NOTIFY_WECOM_URL": channels.url("/wecom?key=wecom-key-0123456789"),
            },
        )
    print(result.output)
    assert result.exit_code == 4, result.output
    assert "notification failed: slack POST http://127.0.0.1:" in result.stderr
    assert TOKEN not in result.output and "wecom-key-0123456789" not in result.output
    assert guilty in channels.requests[1].json()["markdown"]["content"]
    assert len(fake.sweeps) == measured  # the reruns measured nothing

"""Check before running, not after. A publish folder that cannot be
one, a bad notifier setting, a missing GitHub token, a missing job file or a bad
--only are refused before any sweep is created (or any PR fetched, or the cluster
asked); a night judged before whose page was never written gets its page on the next
run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from tests.support.stores import fill_store

REPO = Path(__file__).resolve().parents[2]
JOB = str(REPO / "jobs" / "local.yaml")
ONLY = ["--only", "graph_mode=eager", "--only", "mtp_depth=1"]
runner = CliRunner()


def _env(tmp_path: Path, **extra: str | None) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        "FARM_HOME": str(tmp_path / "home"),
        "FARM_DB_URL": None,
        "GITHUB_TOKEN": None,
        "GITHUB_REPOSITORY": None,
        "COLUMNS": "250",
        **{f"FARM_NOTIFY_{n}": None for n in ("WEBHOOK_URL", "SLACK_URL", "WECOM_URL")},
        "FARM_NOTIFY_FEISHU_URL": None,
    }
    env.update(extra)
    return env


def _bad_folders(tmp_path: Path) -> list[Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return [a_file / "child", a_file, Path("/dev/null"), Path("/proc/farm-x"), Path("/dev/full")]


def test_nightly_refuses_an_unwritable_publish_folder_before_the_sweep(tmp_path: Path) -> None:
    for folder in _bad_folders(tmp_path):
        result = runner.invoke(
            app, ["nightly", JOB, *ONLY, "--publish", str(folder)], env=_env(tmp_path)
        )
        assert result.exit_code == 2, result.output
        assert f"--publish {folder}" in result.output
        assert not (tmp_path / "home" / "farm.db").exists()  # no sweep, no store


def test_a_bad_notifier_setting_is_refused_before_the_sweep(tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        FARM_NOTIFY_FEISHU_URL="http://127.0.0.1:1/hook",
        FARM_NOTIFY_FEISHU_FORMAT="cards",
    )
    result = runner.invoke(app, ["nightly", JOB, *ONLY], env=env)
    assert result.exit_code == 2 and "FARM_NOTIFY_FEISHU_FORMAT" in result.output
    assert not (tmp_path / "home" / "farm.db").exists()


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--publish", "/dev/null"], "--publish /dev/null"),
        ([], "GITHUB_TOKEN is not set"),
        (["--repo", "not a repo"], "--repo"),
    ],
)
def test_pr_refuses_before_fetching_the_pr(tmp_path: Path, extra: list[str], fragment: str) -> None:
    env = _env(tmp_path, GITHUB_TOKEN="ghp_x" if "--repo" in extra else None)
    argv = ["pr", JOB, "--engine", "vllm-cpu", "--pr", "7", *extra]
    result = runner.invoke(app, argv, env=env)
    assert result.exit_code == 2, result.output
    assert fragment in result.output, result.output
    assert "fetch" not in result.output.lower()


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["submit", "jobs/nope.yaml"], "no such job file"),
        (["submit", "jobs/local.yaml", "--only", "nosuch=1"], "unknown axis"),
    ],
)
def test_submit_checks_the_job_before_asking_the_cluster(
    argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    result = runner.invoke(app, [*argv, "--address", "http://127.0.0.1:1"], env=_env(tmp_path))
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert "cannot reach" not in result.output


def test_a_judged_night_without_its_page_gets_it_on_the_next_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    sweep_id = fill_store(url)
    env = _env(tmp_path, FARM_DB_URL=url)
    night = ["nightly", JOB, "--only", "graph_mode=eager", "--only", "sliding_window=on"]
    first = runner.invoke(app, [*night, "--resume", str(sweep_id), "--no-notify"], env=env)
    assert first.exit_code in (0, 1, 3), first.output  # judged, no folder
    folder = tmp_path / "site"
    again = runner.invoke(
        app,
        [*night, "--resume", str(sweep_id), "--no-notify", "--publish", str(folder)],
        env=env,
    )
    assert again.exit_code == first.exit_code, again.output
    assert "judged before" in again.output
    assert (folder / f"sweep-{sweep_id}.html").exists() and (folder / "index.html").exists()

"""`farm logs gc`: old engine logs and Ray sessions go; those of a live run stay.

Before it existed, FARM_HOME/logs and the farm's Ray temp folders grew with every sweep
and nothing pruned them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.orchestrate.driver import plan_job
from farm.orchestrate.log_retention import find_old_logs, ray_temp_dirs, remove_logs
from farm.paths import ray_temp_dir
from farm.spec import load_job

REPO = Path(__file__).resolve().parents[2]
DAY = 86400.0
runner = CliRunner()


def _folder(path: Path, age_s: float, size: int = 1000) -> Path:
    """A folder with a log file of ``size`` bytes, everything last written ``age_s`` ago."""
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "server.log").write_bytes(b"x" * size)
    then = time.time() - age_s
    for p in (path / "sub" / "server.log", path / "sub", path):
        os.utime(p, (then, then))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def _session(pid: int) -> str:
    return f"session_2026-01-02_03-04-05_123456_{pid}"


def test_old_logs_go_and_those_of_live_runs_stay(tmp_path: Path) -> None:
    home, temp = tmp_path / "home", tmp_path / f"mtpfarm-ray-{os.getuid()}"
    logs = home / "logs"
    old = _folder(logs / "sweep-1-20260101-000000", 30 * DAY, size=5000)
    running = _folder(logs / "sweep-2-20260101-000000", 30 * DAY)
    young = _folder(logs / "sweep-3-20260301-000000", 2 * DAY)
    dead = _folder(temp / _session(_dead_pid()), 30 * DAY, size=7000)
    live = _folder(temp / _session(os.getpid()), 30 * DAY)
    (temp / "session_latest").symlink_to(live)

    scan = find_old_logs(home, 7, running_sweeps={2}, ray_dirs=[temp])
    assert [f.path for f in scan.old] == [str(old), str(dead)]
    assert scan.old_bytes >= 12000
    kept = {Path(f.path).name: f.kept_because for f in scan.kept}
    assert kept == {
        running.name: "sweep 2 is running",
        live.name: f"its cluster's starting process {os.getpid()} is alive (the latest session)",
    }
    assert young.name not in kept  # not old: not even listed

    assert remove_logs(scan.old) == []
    assert not old.exists() and not dead.exists()
    assert running.exists() and young.exists() and live.exists()
    assert (temp / "session_latest").is_symlink()


def test_a_folder_written_in_the_last_hour_stays_whatever_the_age_asked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fresh = _folder(home / "logs" / "sweep-9-20260101-000000", 600)
    # The folder itself is old; one file in it was just written (a live engine's log).
    _folder(home / "logs" / "sweep-8-20260101-000000", 30 * DAY)
    (home / "logs" / "sweep-8-20260101-000000" / "sub" / "server.log").write_text("now")
    scan = find_old_logs(home, 0, ray_dirs=[])
    assert {Path(f.path).name: f.kept_because for f in scan.kept} == {
        fresh.name: "written in the last hour",
        "sweep-8-20260101-000000": "written in the last hour",
    }
    assert scan.old == ()


def test_ray_temp_dirs_are_this_homes_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    uid = os.getuid()
    own = ray_temp_dir(tmp_path / "home")
    for name in (f"mtpfarm-ray-{uid}", f"mtpfarm-ray-{uid}-abc123", own.name, "ray"):
        (tmp_path / name).mkdir()
    assert ray_temp_dirs(tmp_path / "home") == [own]
    assert ray_temp_dirs(tmp_path / "other-home") == []


def test_cli_gc_dry_run_then_removes_and_says_how_much(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the Ray folders of this test
    temp = ray_temp_dir(home)
    # Another FARM_HOME's old Ray session: not this home's to remove.
    foreign = _folder(
        tmp_path / f"mtpfarm-ray-{os.getuid()}-0123456789" / _session(_dead_pid()), 20 * DAY
    )
    db = f"sqlite:///{tmp_path / 'farm.db'}"
    engine = store.open_store(db)
    with store.Session(engine) as session:
        plan = plan_job(load_job(REPO / "jobs" / "local.yaml"), {})
        live_sweep = store.create_sweep(session, plan, "x", "host")  # status running
    engine.dispose()
    old = _folder(home / "logs" / "sweep-99-20260101-000000", 20 * DAY, size=3 * 2**20)
    live = _folder(home / "logs" / f"sweep-{live_sweep}-20260101-000000", 20 * DAY)
    session_dir = _folder(temp / _session(_dead_pid()), 20 * DAY, size=2**20)
    env = {"FARM_HOME": str(home), "FARM_DB_URL": db, "COLUMNS": "250"}

    dry = runner.invoke(app, ["logs", "gc", "--older-than-days", "7", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert f"would remove engine logs {old}" in dry.output
    assert f"would remove ray session {session_dir}" in dry.output
    assert f"kept engine logs {live}" in dry.output
    assert f"sweep {live_sweep} is running" in dry.output
    assert "would remove 2 log folder(s), 4.0 MiB" in dry.output
    assert old.exists() and session_dir.exists()

    done = runner.invoke(app, ["logs", "gc", "--older-than-days", "7"], env=env)
    assert done.exit_code == 0, done.output
    assert "removed 2 log folder(s), 4.0 MiB" in done.output
    assert not old.exists() and not session_dir.exists() and live.exists()
    assert foreign.exists() and str(foreign) not in dry.output


def test_cli_gc_removes_nothing_when_it_cannot_read_the_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = _folder(home / "logs" / "sweep-1-20260101-000000", 30 * DAY)
    env = {"FARM_HOME": str(home), "FARM_DB_URL": "postgresql://nobody@127.0.0.1:1/none"}
    result = runner.invoke(app, ["logs", "gc", "--older-than-days", "1"], env=env)
    assert result.exit_code == 2
    assert "cannot tell which sweeps are running, so nothing was removed" in result.output
    assert old.exists()

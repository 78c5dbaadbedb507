"""Outputs that crash. No command ends in a traceback because of
where it writes: --out naming a file or a kernel file system, standard output on a
full device, FARM_HOME naming a file, a bench report of a bisection with no wall time,
a --source that is no ref."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
FARM = "import sys; from farm.cli.main import main; sys.argv[0] = 'farm'; main()"


def _farm(*argv: str, stdout: object = subprocess.PIPE, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", FARM, *argv],
        stdout=stdout,  # type: ignore[arg-type]
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", **env},
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("argv", [["--help"], ["sweeps", "--help"]])
def test_standard_output_on_a_full_device_is_one_error_line(argv: list[str]) -> None:
    with open("/dev/full", "w") as full:
        done = _farm(*argv, stdout=full)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot write the output: No space left on device" in done.stderr


@pytest.mark.parametrize("argv", [["builds", "list"], ["spool", "list"]])
def test_farm_home_naming_a_file_is_one_error_line(argv: list[str], tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    done = _farm(*argv, FARM_HOME=str(a_file), FARM_DB_URL="")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "FARM_HOME" in done.stderr


def test_dashboards_refuse_an_out_that_is_no_folder(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for argv, fragment in (
        (["dashboards", "build", "--out", str(a_file)], "a file is in the way"),
        (["dashboards", "build", "--out", str(a_file / "sub")], "--out"),
        (["dashboards", "build", "--out", "/proc/farm-x"], "kernel"),
        (["dashboards", "check", "--out", str(tmp_path / "none")], "no such folder"),
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert (fragment in result.output and result.exception is None) or isinstance(
            result.exception, SystemExit
        )
        assert "out of date" not in result.output

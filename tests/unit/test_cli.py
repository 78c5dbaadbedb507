"""The CLI through typer's CliRunner: bad input is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from farm.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_plan_of_the_local_job_lists_cells_and_remaps() -> None:
    result = runner.invoke(app, ["plan", str(REPO / "jobs" / "local.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "local: 16 server cells, 32 variants" in result.output
    assert "vllm-cpu.tiny-mtp.compiled.mtp3.swa-off" in result.output
    assert "drafter runs eager" in result.output


def test_malformed_job_is_refused_with_location_and_writes_nothing(tmp_path: Path) -> None:
    text = (REPO / "jobs" / "local.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace("mtp_depth: [0, 1, 2, 3]", "mtp_depth: [0, 1, 2, three]").replace(
            "    count: 32", "    count: 32\n    colour: red"
        )
    )
    db = tmp_path / "farm.db"
    result = runner.invoke(
        app,
        ["run", str(bad), "--db", f"sqlite:///{db}"],
        env={"COLUMNS": "200", "FARM_HOME": str(tmp_path / "home")},
    )
    assert result.exit_code == 2
    lines = result.output.splitlines()
    source = bad.read_text().splitlines()
    depth_line = next(i for i, t in enumerate(source, 1) if "mtp_depth" in t)
    colour_line = next(i for i, t in enumerate(source, 1) if "colour" in t)
    assert any(f"{bad}:{depth_line}: axes.mtp_depth.3" in line for line in lines), result.output
    assert any(f"{bad}:{colour_line}: workloads.0.colour: Extra inputs" in line for line in lines)
    assert len(lines) == 3, result.output  # the header and exactly the two errors
    assert not db.exists()
    assert not (tmp_path / "home").exists()


def test_only_needs_axis_equals_value() -> None:
    result = runner.invoke(app, ["plan", str(REPO / "jobs" / "local.yaml"), "--only", "mtp3"])
    assert result.exit_code != 0
    assert "expected AXIS=VALUE" in result.output

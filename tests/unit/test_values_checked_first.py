"""Values that pass the checks and fail later are refused by the
checks. NUL bytes anywhere a process argument or environment value comes from, names
ending in a newline, a yes/no where a number goes, empty or contradictory options,
ages that are no ages, adjacent bisection ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app

REPO = Path(__file__).resolve().parents[2]
ONLY = ["--only", "graph_mode=eager", "--only", "mtp_depth=1", "--only", "sliding_window=on"]
runner = CliRunner()


def _job(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO / "jobs" / "local.yaml").read_text().replace("../", f"{REPO}/")
    assert old in text
    path = tmp_path / "job.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


JOB_EDITS = {
    "engine-env-nul": ('VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "1\\0"', "env"),
    "engine-env-name-nul": ('VLLM_CPU_KVCACHE_SPACE: "1"', '"A\\0B": "1"', "env"),
    "engine-extra-args-nul": (
        'VLLM_CPU_KVCACHE_SPACE: "1"',
        'VLLM_CPU_KVCACHE_SPACE: "1"\n    extra_args: ["--x", "a\\0b"]',
        "extra_args",
    ),
    "model-served-name-nul": (
        "path: ../models/tiny-step".replace("../", f"{REPO}/"),
        'path: ../models/tiny-step\n    served_name: "m\\0"'.replace("../", f"{REPO}/"),
        "served_name",
    ),
    "job-name-newline": ("name: local", 'name: "local\\n"', "name"),
    "engine-name-newline": ("- name: vllm-cpu", '- name: "vllm-cpu\\n"', "name"),
    "workload-name-newline": ("- name: arith", '- name: "arith\\n"', "name"),
    "history-yes": ("resources:", "nightly: {history: true}\nresources:", "history"),
    "count-yes": ("count: 32", "count: true", "count"),
}


@pytest.mark.parametrize("old,new,fragment", JOB_EDITS.values(), ids=JOB_EDITS.keys())
@pytest.mark.parametrize("command", [["plan"], ["run", "--dry-run"]])
def test_a_job_value_no_process_can_take_is_refused_by_plan_and_dry_run(
    tmp_path: Path, old: str, new: str, fragment: str, command: list[str]
) -> None:
    job = _job(tmp_path, old, new)
    env = {"FARM_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    result = runner.invoke(app, [command[0], str(job), *ONLY, *command[1:]], env=env)
    assert result.exit_code == 2, result.output
    assert fragment in result.output


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["builds", "gc", "--older-than-days", "-1"], "not a number of days"),
        (["builds", "gc", "--older-than-days", "nan"], "not a number of days"),
        (["builds", "gc", "--older-than-days", "inf"], "not a number of days"),
        (["logs", "gc", "--older-than-days", "nan"], "not a number of days"),
        (["submit", "--address", "", "--status", "x"], "is empty"),
        (["submit", "--status", "a", "--stop", "b"], "give one of them"),
        (["submit", "jobs/local.yaml", "--status", "a"], "takes no JOB file"),
        (["pr", "jobs/local.yaml", "--engine", "vllm-cpu", "--pr", "7", "--source", ""], "empty"),
        (["alerts", "list", "--limit", "-1"], "is not a count"),
    ],
)
def test_an_option_that_would_do_the_wrong_thing_is_refused(
    argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    env = {"FARM_HOME": str(tmp_path / "home"), "COLUMNS": "250", "GITHUB_TOKEN": None}
    result = runner.invoke(app, [*argv, "--no-post"] if argv[0] == "pr" else argv, env=env)
    assert result.exit_code == 2, result.output
    assert fragment in result.output, result.output

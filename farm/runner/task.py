"""What a worker needs to run one cell: the runner's typed input."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from farm.plan import ServerCell
from farm.records import BuildInfo
from farm.spec import EngineSpec, ModelSpec, TimeoutSpec
from farm.workload.prompts import LoadedWorkload

__all__ = ["CellTask"]


class CellTask(BaseModel):
    """Everything a worker needs to run one cell, with no access to the job file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: ServerCell
    engine: EngineSpec
    model: ModelSpec
    model_path: str
    workloads: tuple[LoadedWorkload, ...]
    # The engine build on the node the cell runs on: the pool sets it at dispatch.
    build: BuildInfo | None = None
    timeouts: TimeoutSpec
    log_dir: str

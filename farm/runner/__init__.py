"""The runner stage: one cell on one node (engine server lifecycle, workload, metrics).

``run_cell`` takes a ``CellTask`` and returns a ``CellResult``; the modules behind
it are ``task`` (the input), ``lifecycle`` (start with a port retry, stop and device
release), ``variants`` (requests, harness runs, counters) and ``cell``.
"""

from farm.runner.cell import run_cell
from farm.runner.task import (
    CellTask,
    ReferenceRun,
    SequentialLooks,
    reference_runs,
    sequential_looks,
)

__all__ = [
    "CellTask",
    "ReferenceRun",
    "SequentialLooks",
    "reference_runs",
    "run_cell",
    "sequential_looks",
]

"""The runner stage: one cell on one node (engine server lifecycle, workload, metrics).

``run_cell`` takes a ``CellTask`` and returns a ``CellResult``; the modules behind
it are ``task`` (the input), ``lifecycle`` (start with a port retry, stop and device
release), ``variants`` (requests, harness runs, counters) and ``cell``.
"""

from farm.runner.cell import run_cell
from farm.runner.task import CellTask

__all__ = ["CellTask", "run_cell"]

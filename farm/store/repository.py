"""The store's repository functions under one name, for callers that want several
aggregates at once.

Each lives in the module of its aggregate: sweeps and leases (:mod:`farm.store.sweeps`),
cells and results (:mod:`farm.store.cells`), builds (:mod:`farm.store.builds`), sweep
summaries and cost (:mod:`farm.store.summaries`), history across sweeps
(:mod:`farm.store.history`), confirmation reruns (:mod:`farm.store.confirmations`);
what they share is :mod:`farm.store.base`. New code imports from those modules.
"""

from __future__ import annotations

from farm.records import SweepStatus
from farm.store.base import dialect_insert
from farm.store.builds import (
    BuildLocation,
    build_locations,
    record_build,
    record_build_location,
    sweep_builds,
)
from farm.store.cells import (
    CellAlreadyStoredError,
    completed_cell_ids,
    load_sweep,
    save_cell_result,
)
from farm.store.confirmations import confirmation_runs
from farm.store.history import (
    history_series,
    history_sweeps,
    job_history_series,
    median_cell_durations,
)
from farm.store.summaries import (
    SweepCost,
    SweepSummary,
    job_sweeps,
    list_sweeps,
    sweep_cost,
)
from farm.store.sweeps import (
    SweepInUseError,
    SweepLease,
    claim_sweep,
    create_sweep,
    finish_sweep,
    heartbeat,
    latest_sweep_id,
    reopen_sweep,
    sweep_job,
)

__all__ = [
    "BuildLocation",
    "CellAlreadyStoredError",
    "SweepCost",
    "SweepInUseError",
    "SweepLease",
    "SweepStatus",
    "SweepSummary",
    "build_locations",
    "claim_sweep",
    "completed_cell_ids",
    "confirmation_runs",
    "create_sweep",
    "dialect_insert",
    "finish_sweep",
    "heartbeat",
    "history_series",
    "history_sweeps",
    "job_history_series",
    "job_sweeps",
    "latest_sweep_id",
    "list_sweeps",
    "load_sweep",
    "median_cell_durations",
    "record_build",
    "record_build_location",
    "reopen_sweep",
    "save_cell_result",
    "sweep_builds",
    "sweep_cost",
    "sweep_job",
]

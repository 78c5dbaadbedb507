"""The SQL store: sweeps, builds, cells and per-request counters (SQLite or PostgreSQL).

Typed records (``farm.records``, ``farm.plan``) go in and come out; ORM rows stay
inside this package. ``open_store(url)`` migrates the database to the current schema
and returns an engine; the repository functions take a ``Session`` on it::

    engine = open_store(default_db_url())
    with Session(engine) as session:
        sweep_id = create_sweep(session, plan, job_yaml, host)
"""

from sqlmodel import Session

from farm.records import SweepStatus
from farm.store.alerts import (
    acknowledge,
    get_alert,
    list_alerts,
    mark_notified,
    pending_notifications,
    raise_alerts,
    resolve,
)
from farm.store.builds import BuildLocation, build_locations, record_build, record_build_location
from farm.store.cells import completed_cell_ids, load_sweep, save_cell_result
from farm.store.connection import answer_within, call_timeout_s, connect
from farm.store.db import open_store, upgrade
from farm.store.history import median_cell_durations
from farm.store.summaries import SweepSummary, job_sweeps, list_sweeps
from farm.store.sweeps import (
    SweepInUseError,
    SweepLease,
    claim_sweep,
    create_sweep,
    finish_sweep,
    heartbeat,
    latest_sweep_id,
    reopen_sweep,
)
from farm.store.urls import default_db_url, normalize_url

__all__ = [
    "BuildLocation",
    "Session",
    "SweepInUseError",
    "SweepLease",
    "SweepStatus",
    "SweepSummary",
    "acknowledge",
    "answer_within",
    "build_locations",
    "call_timeout_s",
    "claim_sweep",
    "completed_cell_ids",
    "connect",
    "create_sweep",
    "default_db_url",
    "finish_sweep",
    "get_alert",
    "heartbeat",
    "job_sweeps",
    "latest_sweep_id",
    "list_alerts",
    "list_sweeps",
    "load_sweep",
    "mark_notified",
    "median_cell_durations",
    "normalize_url",
    "open_store",
    "pending_notifications",
    "raise_alerts",
    "record_build",
    "record_build_location",
    "reopen_sweep",
    "resolve",
    "save_cell_result",
    "upgrade",
]

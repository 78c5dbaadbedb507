"""`farm alerts check` as one workflow: the sweep, how the nightly would judge it (its
job's history depth and goldens), the check, the alerts raised and sent.

The CLI parses the options into an :class:`AlertsRequest`, hands the store session and
what prints as :class:`AlertsDeps`, and prints the :class:`~farm.workflows.alerts.steps.
AlertCheck` :func:`run_alerts_check` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sqlmodel import Session

from farm.workflows.alerts.steps import AlertCheck, JudgedAs, check_alerts, judged_as_nightly
from farm.workflows.common import resolve_sweep

__all__ = ["AlertsDeps", "AlertsRequest", "run_alerts_check"]


@dataclass(frozen=True)
class AlertsRequest:
    """What `farm alerts check` was asked: the sweep (an id or ``latest``), the store,
    the baseline (a sweep id, ``last-good`` or None), patched engines' bases, the
    history depth (None: the job's), the job file (its goldens), whether to notify."""

    sweep: str | int
    url: str
    baseline: int | Literal["last-good"] | None = "last-good"
    base_of: dict[str, str] = field(default_factory=dict)
    history: int | None = None
    job_file: Path | None = None
    notify: bool = True


def _not_told(judged_as: JudgedAs) -> None:
    pass


@dataclass(frozen=True)
class AlertsDeps:
    """The I/O the check is handed: the store session, and who is told how the sweep
    will be judged before it is."""

    open_session: Callable[[str], AbstractContextManager[Session]]
    judged_as: Callable[[JudgedAs], None] = _not_told


def run_alerts_check(request: AlertsRequest, deps: AlertsDeps) -> AlertCheck:
    """Judge the sweep as `farm nightly` does, raise its alerts, send the pending ones
    (:func:`~farm.workflows.alerts.steps.check_alerts`); no verdict is stored. Raises
    FarmError (a job file of another job, no sweep), StoreError (store), NotifyError
    (invalid channel settings)."""
    with deps.open_session(request.url) as session:
        sweep_id = resolve_sweep(session, request.sweep)
        judged_as = judged_as_nightly(session, sweep_id, request.job_file, request.history)
        deps.judged_as(judged_as)
        return check_alerts(
            session,
            sweep_id,
            baseline=request.baseline,
            base_of=request.base_of or None,
            history=judged_as.history,
            notifiers=None if request.notify else (),
            goldens=judged_as.goldens,
        )

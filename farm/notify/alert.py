"""Alerts as typed data: what the checks hand to the store, and what the store hands back.

Pure: pydantic only. The store (:mod:`farm.store.alerts`) turns an
:class:`AlertCandidate` into a row and gives back an :class:`AlertRecord`; notifiers,
reports and the CLI read records and never see a row.

An alert is identified by its :attr:`AlertCandidate.key`: the cell's
:class:`farm.comparable.ComparableKey` (never the build or the sweep) plus the cause
(check kind and metric). The same regression seen by the next
nightly updates the open alert instead of raising a second one.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from farm.comparable import ComparableKey

__all__ = [
    "ALERT_STATES",
    "SEVERITIES",
    "AlertCandidate",
    "AlertDetails",
    "AlertFigure",
    "AlertKind",
    "AlertRecord",
    "AlertState",
    "FigureInterval",
    "Severity",
    "alert_key",
]

AlertState = Literal["open", "acknowledged", "resolved"]
Severity = Literal["critical", "warning"]
# The within-sweep check kinds of farm.analysis.verdicts, plus a cell that did not run,
# a confirmed change point over nightlies, and a drop against the job's last good night
# (farm.workflows.nightly).
AlertKind = Literal[
    "graph_vs_eager",
    "patch_vs_base",
    "depth_invariance",
    "cell_failed",
    "history_change",
    "nightly_vs_last_good",
]
ALERT_STATES: tuple[AlertState, ...] = ("open", "acknowledged", "resolved")
SEVERITIES: tuple[Severity, ...] = ("critical", "warning")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Stored(BaseModel):
    # Details are stored as JSON and read back by whichever farm version runs next:
    # fields an older or newer farm wrote and this one does not know are ignored.
    model_config = ConfigDict(frozen=True, extra="ignore")


class FigureInterval(_Stored):
    """An estimate with its interval; ``None`` where a bound is not finite.

    NaN and infinity have no JSON form (PostgreSQL's ``json`` refuses them), so they
    are stored as null.
    """

    estimate: float | None
    low: float | None = None
    high: float | None = None
    level: float | None = None

    @classmethod
    def of(
        cls,
        estimate: float,
        low: float | None = None,
        high: float | None = None,
        level: float | None = None,
    ) -> FigureInterval:
        """Build an interval, turning non-finite numbers into ``None``."""
        return cls(estimate=_finite(estimate), low=_finite(low), high=_finite(high), level=level)

    def __str__(self) -> str:
        def f(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        if self.low is None and self.high is None:
            return f(self.estimate)
        return f"{f(self.estimate)} [{f(self.low)}, {f(self.high)}]"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class AlertFigure(_Stored):
    """One comparison behind an alert: candidate vs reference, and the difference."""

    metric: str
    position: int | None = None
    candidate: str
    reference: str
    candidate_value: FigureInterval
    reference_value: FigureInterval
    difference: FigureInterval
    relative: float | None = None
    paired: bool | None = None
    pairs: int | None = None
    min_effect: float | None = None
    pvalue: float | None = None
    baseline: str | None = None

    @property
    def label(self) -> str:
        """``metric`` or ``metric[position]``."""
        return self.metric + (f"[{self.position}]" if self.position is not None else "")


class AlertDetails(_Stored):
    """Everything needed to judge an alert without opening the sweep.

    ``attribution`` is the smallest conjunction of axis values that explains the
    sweep's regressions (:mod:`farm.analysis.attribution`), when it covers this cell.
    """

    cell: ComparableKey
    sweep_id: int
    figures: tuple[AlertFigure, ...] = ()
    attribution: str | None = None
    error: str | None = None


class AlertCandidate(_Frozen):
    """An alert as the analysis proposes it, before the store deduplicates it."""

    key: str
    kind: AlertKind
    metric: str | None = None
    severity: Severity
    summary: str
    details: AlertDetails


class AlertRecord(_Frozen):
    """A stored alert.

    ``first_sweep_id``/``last_sweep_id``: the earliest and latest sweep that showed it;
    ``opened_sweep_id``: the sweep that opened it, or re-opened it after it was
    resolved; ``occurrences``: how many raising sweeps (re-analysing one sweep does not
    count twice); ``notified_at``: when it was last delivered to the notification
    channels (cleared when it re-opens).
    """

    id: int
    key: str
    kind: AlertKind
    metric: str | None
    state: AlertState
    severity: Severity
    summary: str
    details: AlertDetails
    first_sweep_id: int
    last_sweep_id: int
    opened_sweep_id: int
    occurrences: int
    created_at: datetime
    updated_at: datetime
    acknowledged_by: str | None = None
    note: str | None = None
    notified_at: datetime | None = None

    def opened_by(self, sweep_id: int) -> bool:
        """True when ``sweep_id`` opened or re-opened this alert and nobody has
        acknowledged it since."""
        return self.state == "open" and self.opened_sweep_id == sweep_id

    @property
    def needs_notification(self) -> bool:
        """Open and not yet delivered since it was (re-)opened."""
        return self.state == "open" and self.notified_at is None


def alert_key(cell: ComparableKey, kind: AlertKind, metric: str | None) -> str:
    """The deduplication key: cause (kind, metric) and the comparable key's label (the
    text alerts were keyed by before the key had a fingerprint), never build or sweep."""
    return f"{kind}:{metric or '-'}:{cell.label}"

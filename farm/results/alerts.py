"""Alerts as typed data: what the checks hand to the store, and what the store hands back.

Pure: pydantic only. The store (:mod:`farm.store.alerts`) turns an
:class:`AlertCandidate` into a row and gives back an :class:`AlertRecord`; notifiers,
reports and the CLI read records and never see a row.

An alert is identified by its :attr:`AlertCandidate.key`: the cell's
:class:`farm.comparable.ComparableKey` (never the build or the sweep) plus the cause
(check kind and metric). The same regression seen by the next
nightly updates the open alert instead of raising a second one.

Triage states (Perfherder's, less "reassigned"): ``untriaged`` (new, nobody has looked),
``acknowledged`` (someone is on it), ``downstream`` (caused by another alert or a
change elsewhere: linked, not worked on here); closed: ``invalid`` (a false alarm),
``fixed``, ``recovered`` (set by the farm: a later sweep compared the same cell
and found nothing) and ``withdrawn`` (set by the farm: an early alert, raised as a
night's cell landed, that the night's verdict did not confirm). A closed alert
re-opens as untriaged when a newer sweep raises it.
An open alert raised again with a new cause (another build, other draft positions, a
drop beyond the earlier evidence's interval) is news: it is notified again, saying what
changed (:func:`news_of`).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import ConfigDict

from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.inert import UntrustedText

__all__ = [
    "ALERT_STATES",
    "CLOSED_STATES",
    "COVERAGE",
    "METRIC_NAMES",
    "OPEN_STATES",
    "SEVERITIES",
    "TRIAGE_STATES",
    "AlertCandidate",
    "AlertDetails",
    "AlertFigure",
    "AlertKind",
    "AlertRecord",
    "AlertState",
    "FigureInterval",
    "Severity",
    "alert_key",
    "cause_of",
    "metric_name",
    "news_of",
]

AlertState = Literal[
    "untriaged", "acknowledged", "downstream", "invalid", "fixed", "recovered", "withdrawn"
]
Severity = Literal["critical", "warning"]
# The within-sweep check kinds of farm.analysis.check_rules, plus a cell that did not run,
# a confirmed change point over nightlies, a drop against the job's last good night
# (farm.workflows.nightly), a variant below a golden the team keeps (farm.spec.goldens),
# acceptance collapsing inside one run (farm.analysis.over_run), a prefix cache that
# MTP, or a new night, made hit less (farm.analysis.prefix_cache), a cell of a
# conjunction of axis values whose cells, pooled, fell (farm.analysis.pooling) and a
# small drop that persisted over a key's recent nights (farm.analysis.sustained).
AlertKind = Literal[
    "label_mismatch",
    "graph_vs_eager",
    "patch_vs_base",
    "depth_invariance",
    "cell_failed",
    "history_change",
    "nightly_vs_last_good",
    "golden",
    "collapse_over_run",
    "prefix_cache_hits",
    "pooled_drop",
    "sustained_drop",
]
ALERT_STATES: tuple[AlertState, ...] = (
    "untriaged",
    "acknowledged",
    "downstream",
    "invalid",
    "fixed",
    "recovered",
    "withdrawn",
)
OPEN_STATES: tuple[AlertState, ...] = ("untriaged", "acknowledged", "downstream")
CLOSED_STATES: tuple[AlertState, ...] = ("invalid", "fixed", "recovered", "withdrawn")
# What a person may set; "recovered" and "withdrawn" are the farm's words.
TRIAGE_STATES: tuple[AlertState, ...] = ("acknowledged", "downstream", "invalid", "fixed")
SEVERITIES: tuple[Severity, ...] = ("critical", "warning")


class _Stored(Frozen):
    # Details are stored as JSON and read back by whichever farm version runs next:
    # fields an older or newer farm wrote and this one does not know are ignored.
    model_config = ConfigDict(extra="ignore")


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
    # A change inside one run (farm.analysis.over_run): where the later part begins, the
    # 0-based request in the order served (over="request") or the round (over="round").
    begins_at: int | None = None
    over: Literal["request", "round"] | None = None

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
    error: UntrustedText | None = None  # a cell's: credentials masked
    build_id: str | None = None  # the candidate cell's build (None: stored before builds)

    @property
    def positions(self) -> frozenset[int]:
        """The draft positions whose acceptance the evidence shows dropping."""
        return frozenset(f.position for f in self.figures if f.position is not None)


class AlertCandidate(Frozen):
    """An alert as the analysis proposes it, before the store deduplicates it."""

    key: str
    kind: AlertKind
    metric: str | None = None
    severity: Severity
    summary: UntrustedText  # may quote a cell's error: credentials masked
    details: AlertDetails


class AlertRecord(Frozen):
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
    summary: UntrustedText  # may quote a cell's error: credentials masked
    details: AlertDetails
    first_sweep_id: int
    last_sweep_id: int
    opened_sweep_id: int
    occurrences: int
    created_at: datetime
    updated_at: datetime
    triaged_by: str | None = None
    triaged_at: datetime | None = None
    note: UntrustedText | None = None  # the triage's reason
    link: str | None = None  # the bug, PR or bisection it was triaged to
    notified_at: datetime | None = None
    news: UntrustedText | None = None  # what the latest raising changed, until it is notified
    recovered_sweep_id: int | None = None

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def opened_by(self, sweep_id: int) -> bool:
        """True when ``sweep_id`` opened or re-opened this alert and nobody has
        triaged it since."""
        return self.state == "untriaged" and self.opened_sweep_id == sweep_id

    @property
    def needs_notification(self) -> bool:
        """Not delivered since it was (re-)opened, recovered, withdrawn after it was told,
        or changed cause."""
        return self.notified_at is None and (
            self.state == "untriaged" or self.state == "recovered" or self.news is not None
        )

    @property
    def cause(self) -> str:
        """What the alert is grouped by in a night's notification (:func:`cause_of`)."""
        return cause_of(self)


# Between an attribution's conjunction and how many cells it covers, in its text
# (farm.analysis.attribution.Attribution): the coverage grows as a night's cells land.
COVERAGE = ": covers "


def cause_of(alert: AlertCandidate | AlertRecord) -> str:
    """One night's alerts of one cause share this: the attribution's conjunction of
    axis values when the analysis found one, else the check and metric."""
    if alert.details.attribution:
        return alert.details.attribution.split(COVERAGE, 1)[0]
    return f"{alert.kind} {metric_name(alert.metric)}".strip()


def news_of(before: AlertDetails, after: AlertDetails) -> str | None:
    """What a newer raising of an open alert changed (None: the same cause again):
    another build, other draft positions, or an AL drop beyond the earlier interval."""
    changes = []
    if before.build_id and after.build_id and before.build_id != after.build_id:
        changes.append(f"another build ({before.build_id} -> {after.build_id})")
    if after.positions - before.positions:
        shown = ", ".join(str(p) for p in sorted(after.positions - before.positions))
        changes.append(f"drops at draft position(s) {shown} too")
    grown, earlier = _al_figure(after), _al_figure(before)
    low = earlier.difference.low if earlier is not None else None
    estimate = grown.difference.estimate if grown is not None else None
    if estimate is not None and low is not None and estimate < low:
        changes.append(
            f"the AL drop grew beyond the earlier interval ({estimate:+.3f} < {low:+.3f})"
        )
    return "; ".join(changes) or None


def _al_figure(details: AlertDetails) -> AlertFigure | None:
    return next(
        (f for f in details.figures if f.metric == "mean_acceptance_length" and f.position is None),
        None,
    )


def alert_key(cell: ComparableKey, kind: AlertKind, metric: str | None) -> str:
    """The deduplication key: cause (kind, metric) and the comparable key's label (the
    text alerts were keyed by before the key had a fingerprint), never build or sweep."""
    return f"{kind}:{metric or '-'}:{cell.label}"


METRIC_NAMES = {
    "mean_acceptance_length": "AL",
    "acceptance_at_position": "acceptance at position",
    "greedy_divergence": "greedy divergence",
    "accuracy": "accuracy",
    "prefix_hit_rate": "prefix-cache hit rate",
}


def metric_name(metric: str | None, position: int | None = None) -> str:
    """Short human name of a metric: ``AL``, ``acceptance at position 1``, ..."""
    name = METRIC_NAMES.get(metric or "", metric or "failure")
    return f"{name} {position}" if position is not None else name

"""The verdict of a nightly or a PR run: what was found, against what, and the outcome.

Pure: pydantic only. :func:`farm.analysis.judgement.judge` produces it, :mod:`farm.store.verdicts`
keeps one per sweep and kind, ``farm sweeps``, the HTML report and the health dashboard
show it. A verdict is stored once: a stored verdict means the sweep was checked, its
alerts raised and sent, and a rerun of the same night changes nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import ConfigDict, model_validator

from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.results.alerts import AlertFigure

__all__ = [
    "EXIT_FALSE_ALARM",
    "EXIT_STATUS",
    "VERDICT_KINDS",
    "VERDICT_OUTCOMES",
    "Finding",
    "FindingSource",
    "PositionChange",
    "ReusedCell",
    "SweepVerdict",
    "VerdictKind",
    "VerdictOutcome",
    "outcome_of",
]

# aa: an A/A night (`farm nightly --aa`), a clean repeat of the last good night's
# builds; what it finds is by definition a false alarm of the rule.
VerdictKind = Literal["nightly", "pr", "aa"]
VerdictOutcome = Literal["clean", "regression", "failed_cells"]
VERDICT_KINDS: tuple[VerdictKind, ...] = get_args(VerdictKind)
VERDICT_OUTCOMES: tuple[VerdictOutcome, ...] = get_args(VerdictOutcome)
# What a scheduler acts on: 0 clean, 1 regression, 3 cells failed but no
# regression; 2 (bad input, store unreachable) never reaches a verdict.
EXIT_STATUS: dict[VerdictOutcome, int] = {"clean": 0, "regression": 1, "failed_cells": 3}
# An A/A night whose judgement found something: false alarms, not a regression (a
# scheduler acting on 1 would page someone for the rule's own noise).
EXIT_FALSE_ALARM = 5

# within_sweep: graph modes vs eager, patches vs base (farm.analysis.checks);
# baseline: each cell vs the same comparable cell of the baseline (the job's last
# good night, or a PR's base build); history: change points over the job's nightlies;
# cells: a cell that failed (no regression by itself); golden: a variant below a golden
# the team keeps (farm.spec.goldens: vllm-ascend's per-position spec-decode gates).
# "label": a cell that ran as another configuration than its label says; "over_run":
# acceptance collapsing inside one variant's run (farm.analysis.over_run);
# "prefix_cache": a prefix-cache hit rate MTP or a new night lowered
# (farm.analysis.prefix_cache); "pooled": a conjunction of axis values whose cells,
# pooled, fell against the baseline (farm.analysis.pooling).
FindingSource = Literal[
    "label",
    "within_sweep",
    "baseline",
    "history",
    "cells",
    "golden",
    "over_run",
    "prefix_cache",
    "pooled",
]


class _Stored(Frozen):
    # Read back by whichever farm version runs next: unknown fields are ignored.
    model_config = ConfigDict(extra="ignore")


class PositionChange(_Stored):
    """Acceptance at one draft position, baseline vs this sweep (per draft, 0..1)."""

    position: int
    baseline: float
    candidate: float
    difference: float
    low: float | None = None
    high: float | None = None
    fell: bool = False  # significant and at least the per-position minimum effect


class ReusedCell(_Stored):
    """A stored cell a PR run took as its baseline instead of running it again."""

    sweep_id: int
    cell_id: str
    build_id: str | None = None


class Finding(_Stored):
    """One reason for a verdict: what was found, on which comparable key, in which cells.

    The one finding type of every use (nightly, ``farm alerts check``, ``farm pr``,
    ``farm compare``, bisection steps): ``key`` is the variant's (or, for a failed
    cell, the server cell's) :class:`~farm.comparable.ComparableKey`; ``label`` its
    text. ``positions`` is the full per-position difference of a paired comparison;
    ``figures`` the comparisons behind the finding, as alerts show them; ``error`` the
    error of a failed cell. Alerts are views of findings
    (:func:`farm.analysis.alert_rules.alert_candidates`).
    """

    source: FindingSource
    check: str
    key: ComparableKey | None = None
    label: str = ""
    cells: tuple[str, ...]
    metric: str | None = None
    summary: str
    relative: float | None = None
    baseline_sweep_id: int | None = None
    positions: tuple[PositionChange, ...] = ()
    figures: tuple[AlertFigure, ...] = ()
    error: str | None = None
    # A pooled finding's keys (its conjunction's, in the order of ``figures``): it has no
    # one ``key``, and raises the alerts of those its cells' own findings do not.
    keys: tuple[ComparableKey, ...] = ()
    # The key's verdicts flip too often to be believed (farm.analysis.noise.quarantined):
    # measured and shown, never a regression of the verdict, never alerted.
    quarantined: bool = False

    @model_validator(mode="before")
    @classmethod
    def _label_only(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        key = data.get("key")
        if isinstance(key, str):
            # Verdicts stored before findings carried the typed key hold its label.
            data["label"] = data.pop("key")
        elif key is not None and not data.get("label"):
            data["label"] = ComparableKey.model_validate(key).label
        return data

    @property
    def is_regression(self) -> bool:
        return self.source != "cells" and not self.quarantined

    @property
    def shown_check(self) -> str:
        """The check's name as reports show it: ``(quarantined)`` after a flaky key's."""
        return self.check + (" (quarantined)" if self.quarantined else "")

    @property
    def fallen_positions(self) -> tuple[PositionChange, ...]:
        return tuple(p for p in self.positions if p.fell)


class SweepVerdict(_Stored):
    """The verdict on one sweep: ``kind`` nightly or pr, its outcome and findings.

    ``baseline_sweep_ids``: the sweeps its cells were compared with (a nightly: the
    job's last good night; a PR: the sweeps whose base cells were reused);
    ``reused_cells``: for a PR run, the baseline cells not run again. ``engine``,
    ``pr_number`` and ``head_sha`` say what a PR run validated.
    """

    sweep_id: int
    job: str
    kind: VerdictKind
    outcome: VerdictOutcome
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    comparisons: int = 0
    baseline_sweep_ids: tuple[int, ...] = ()
    reused_cells: tuple[ReusedCell, ...] = ()
    history: int = 0
    engine: str | None = None
    pr_number: int | None = None
    head_sha: str | None = None
    created_at: datetime | None = None

    @property
    def exit_status(self) -> int:
        """0 clean, 1 regression, 3 cells failed but no regression; an A/A night's
        findings are false alarms: 5 (:data:`EXIT_FALSE_ALARM`)."""
        if self.kind == "aa" and self.outcome == "regression":
            return EXIT_FALSE_ALARM
        return EXIT_STATUS[self.outcome]

    @property
    def false_alarms(self) -> tuple[Finding, ...]:
        """An A/A night's findings that would have been regressions (none otherwise)."""
        return self.regressions if self.kind == "aa" else ()

    @property
    def regressions(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_regression)

    def headline(self) -> str:
        """``nightly verdict on sweep 12 (job): regression, 2 finding(s) vs sweep 11``."""
        against = (
            " vs sweep " + ", ".join(map(str, self.baseline_sweep_ids))
            if self.baseline_sweep_ids
            else " (no earlier good night to compare with)"
            if self.kind in ("nightly", "aa")
            else ""
        )
        pr = f" PR #{self.pr_number}" if self.pr_number is not None else ""
        if self.kind == "aa":
            return (
                f"A/A night on sweep {self.sweep_id} ({self.job}): "
                f"{len(self.false_alarms)} false alarm(s) in {self.comparisons} "
                f"comparisons{against} (same builds)"
            )
        return (
            f"{self.kind}{pr} verdict on sweep {self.sweep_id} ({self.job}): {self.outcome}, "
            f"{len(self.findings)} finding(s) in {self.comparisons} comparisons{against}"
        )


def outcome_of(findings: tuple[Finding, ...]) -> VerdictOutcome:
    """``regression`` when any finding is one, else ``failed_cells`` when a cell
    failed, else ``clean``: the one rule every kind of run uses."""
    if any(f.is_regression for f in findings):
        return "regression"
    if any(not f.quarantined for f in findings):
        return "failed_cells"
    return "clean"

"""A PR sweep's order and its fail-fast stop (`farm pr --fail-fast`).

The cells likeliest to regress start first (:mod:`farm.analysis.risk`, from the job's
own past regressions: its nightly verdicts and this PR's earlier runs, and from the
files the PR changes); with
``--fail-fast`` the sweep starts no more cells once a candidate cell is confirmed
below its base, judged as the verdict judges it (:func:`farm.analysis.judgement.judge`
with the PR's rules, its sequential decisions and quarantined keys included). The
verdict then says what was not run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlmodel import Session

from farm.analysis.judgement import Judgement, JudgeRules, judge
from farm.analysis.noise import look_calibration
from farm.analysis.risk import regression_risk, risk_order, touched_risk
from farm.analysis.rules import pr_rules
from farm.comparable import ComparableKey
from farm.plan import ServerCell
from farm.records import CellResult, StoredCell, SweepRecord
from farm.results.verdict import Finding
from farm.runner import ReferenceRun
from farm.spec import JobSpec
from farm.store.verdicts import job_verdicts
from farm.workflows.pr.decide import pr_job_name

__all__ = [
    "FailFast",
    "PrProgress",
    "PrSweepPlan",
    "calibrated_references",
    "likely_first",
    "past_regressions",
]

# How many of the job's newest verdicts of each kind the order reads.
_VERDICTS = 50


@dataclass(frozen=True)
class PrSweepPlan:
    """What a PR's sweep is run with: its job, the stored runs its looks pair with,
    the cells to start first and, fail-fast, what stops it."""

    job: JobSpec
    references: Mapping[ComparableKey, ReferenceRun] = field(default_factory=dict)
    first: tuple[str, ...] = ()
    stop_after: Callable[[ServerCell, CellResult], str | None] | None = None


def past_regressions(session: Session, job: str, number: int) -> list[ComparableKey]:
    """The keys of every regression finding of ``job``'s newest nightly verdicts and
    of PR ``number``'s earlier runs (a key once per verdict that found it)."""
    verdicts = [
        *job_verdicts(session, job, "nightly", _VERDICTS),
        *job_verdicts(session, pr_job_name(job, number), "pr", _VERDICTS),
    ]
    return [
        key
        for v in verdicts
        for key in dict.fromkeys(f.key for f in v.findings if f.key is not None)
    ]


def likely_first(
    cells: Sequence[ServerCell],
    regressed: Sequence[ComparableKey],
    touched: Sequence[str] = (),
) -> tuple[str, ...]:
    """The cells' ids riskiest first, by the job's past regressions and the paths the
    PR changes (``touched``); empty when neither makes any cell riskier."""
    history = regression_risk(cells, regressed)
    change = touched_risk(cells, touched)
    risk = {c.cell_id: history[c.cell_id] + change[c.cell_id] for c in cells}
    if not any(risk.values()):
        return ()
    return tuple(c.cell_id for c in risk_order(cells, risk))


def calibrated_references(
    references: Mapping[ComparableKey, ReferenceRun], rules: JudgeRules, base: str
) -> dict[ComparableKey, ReferenceRun]:
    """``references`` (by the candidate's keys) with each noisy key's calibrated rule
    (:func:`farm.analysis.noise.look_calibration` of its noise in ``rules``, read under
    the ``base`` engine's key), so that its looks decide as the PR's verdict will judge
    it; unchanged without a noise rule (a deterministic engine)."""
    if rules.noise is None:
        return dict(references)
    out = {}
    for key, ref in references.items():
        noise = rules.calibration.get(key.model_copy(update={"engine": base}))
        out[key] = ref.model_copy(update={"calibration": look_calibration(noise, rules.noise)})
    return out


def _same_axes(cell: ServerCell) -> tuple[tuple[str, str], ...]:
    return tuple((k, str(v)) for k, v in cell.axes.items() if k != "engine")


@dataclass
class FailFast:
    """Told of each landed cell; the first candidate cell paired with a base (stored
    and reused, or landed in this sweep) in which the PR's verdict would find a
    regression stops the sweep (not one its confirmation reruns will decide first).
    ``rules``: the PR's (its verdict's; default :func:`farm.analysis.rules.pr_rules`
    of the two engines)."""

    base: str
    candidate: str
    reused: Iterable[StoredCell]
    rules: JudgeRules | None = None
    landed: dict[tuple[tuple[str, str], ...], dict[str, StoredCell]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rules is None:
            self.rules = pr_rules(candidate=self.candidate, base=self.base)
        for stored in self.reused:
            self.landed.setdefault(_same_axes(stored.cell), {})[self.base] = stored

    def __call__(self, cell: ServerCell, result: CellResult) -> str | None:
        pair = self.landed.setdefault(_same_axes(cell), {})
        pair[cell.engine] = StoredCell(cell=cell, result=result)
        if self.base not in pair or self.candidate not in pair:
            return None
        now = datetime.now(UTC)

        def one(stored: StoredCell, sweep_id: int) -> SweepRecord:
            return SweepRecord(
                sweep_id=sweep_id, job="", started_at=now, status="ok", cells=(stored,)
            )

        judgement = judge(one(pair[self.candidate], 1), one(pair[self.base], 0), None, self.rules)
        bad = _unconfirmable(judgement, self.rules)
        if not bad:
            return None
        first = bad[0]
        cell_id = first.cells[0] if first.cells else pair[self.candidate].cell.cell_id
        return f"{cell_id} regressed: {first.summary.split('; ')[0]}"


def _unconfirmable(judgement: Judgement, rules: JudgeRules | None) -> tuple[Finding, ...]:
    """The regressions of ``judgement`` that no confirmation reruns will decide: with
    confirmations on, a suspicious first run under the key's run-to-run noise is only
    suspicious until its reruns are made (:mod:`farm.workflows.pr.confirm`)."""
    noise = rules.noise if rules is not None else None
    if noise is None or noise.confirm.runs < 1 or judgement.comparison is None:
        return judgement.regressions
    rerun = {row.key for row in judgement.comparison.rows if row.suspicious}
    return tuple(f for f in judgement.regressions if f.key not in rerun)


@dataclass
class PrProgress:
    """Each landed cell of a PR's sweep, its pair judged as :class:`FailFast` judges it:
    what the PR's comment says while the sweep runs. Called as the sweep's
    ``stop_after``; returns the pair's regression (None: none yet)."""

    pairs: FailFast
    total: int
    finished: int = 0
    failed: int = 0
    regressed: list[str] = field(default_factory=list)  # FailFast's reasons, in order

    def __call__(self, cell: ServerCell, result: CellResult) -> str | None:
        self.finished += 1
        self.failed += result.status != "ok"
        reason = self.pairs(cell, result)
        if reason is not None:
            self.regressed.append(reason)
        return reason

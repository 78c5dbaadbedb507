"""Verdicts in SQL: one row per sweep and kind (nightly, pr, aa: an A/A night).

Typed records in and out (:class:`farm.results.verdict.SweepVerdict`);
``VerdictRow`` never leaves the store. A verdict is written once: the unique
(sweep, kind) constraint makes a second writer of the same night find the first's
verdict instead of storing another (:func:`record_verdict` returns it).
Every function takes an explicit ``Session`` and commits its own unit of work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from farm.bounds import StoredId
from farm.errors import StoreError
from farm.results.verdict import (
    VERDICT_KINDS,
    Finding,
    ReusedCell,
    SweepVerdict,
    VerdictKind,
    VerdictOutcome,
)
from farm.store.base import _require_sweep, _unit_of_work
from farm.store.columns import read_column
from farm.store.tables import SweepRow, VerdictRow

__all__ = [
    "get_verdict",
    "job_verdicts",
    "list_verdicts",
    "record_verdict",
    "verdict_outcomes",
]


def record_verdict(session: Session, verdict: SweepVerdict) -> tuple[SweepVerdict, bool]:
    """Store ``verdict`` unless its sweep already has one of its kind.

    Returns (the stored verdict, True when this call stored it). When another
    process stored one first, that one is returned with False: a sweep is judged
    once. Raises StoreError when there is no such sweep.
    """
    existing = get_verdict(session, verdict.sweep_id, verdict.kind)
    if existing is not None:
        return existing, False
    now = verdict.created_at or datetime.now(UTC)
    try:
        with _unit_of_work(session):
            _require_sweep(session, verdict.sweep_id)
            row = VerdictRow(
                sweep_id=verdict.sweep_id,
                kind=verdict.kind,
                outcome=verdict.outcome,
                findings=[f.model_dump(mode="json") for f in verdict.findings],
                notes=list(verdict.notes),
                comparisons=verdict.comparisons,
                baseline_sweep_ids=list(verdict.baseline_sweep_ids),
                reused_cells=[c.model_dump(mode="json") for c in verdict.reused_cells],
                history=verdict.history,
                engine=verdict.engine,
                pr_number=verdict.pr_number,
                head_sha=verdict.head_sha,
                created_at=now,
            )
            session.add(row)
    except IntegrityError:
        # Another writer stored this sweep's verdict between our read and our insert.
        stored = get_verdict(session, verdict.sweep_id, verdict.kind)
        if stored is None:
            raise StoreError(
                f"cannot record the {verdict.kind} verdict of sweep {verdict.sweep_id}"
            ) from None
        return stored, False
    return verdict.model_copy(update={"created_at": now}), True


def get_verdict(session: Session, sweep_id: int, kind: VerdictKind) -> SweepVerdict | None:
    """The ``kind`` verdict of sweep ``sweep_id``, or None when it has none yet."""
    if kind not in VERDICT_KINDS:
        raise ValueError(f"kind must be one of {VERDICT_KINDS}, not {kind!r}")
    query = (
        select(VerdictRow, SweepRow.job)
        .join(SweepRow, col(SweepRow.id) == col(VerdictRow.sweep_id))
        .where(VerdictRow.sweep_id == sweep_id, VerdictRow.kind == kind)
    )
    found = session.exec(query).first()
    return None if found is None else _record(*found)


def list_verdicts(session: Session, sweep_ids: Sequence[int]) -> dict[int, list[SweepVerdict]]:
    """Every verdict of these sweeps (nightly first, then pr), by sweep id."""
    out: dict[int, list[SweepVerdict]] = {}
    if not sweep_ids:
        return out
    query = (
        select(VerdictRow, SweepRow.job)
        .join(SweepRow, col(SweepRow.id) == col(VerdictRow.sweep_id))
        .where(col(VerdictRow.sweep_id).in_(list(sweep_ids)))
        .order_by(col(VerdictRow.sweep_id), col(VerdictRow.kind))
    )
    for row, job in session.exec(query):
        out.setdefault(row.sweep_id, []).append(_record(row, job))
    return out


def job_verdicts(
    session: Session, job: str, kind: VerdictKind, limit: int = 50
) -> list[SweepVerdict]:
    """The newest ``limit`` verdicts of ``kind`` on sweeps of ``job``, newest first."""
    query = (
        select(VerdictRow, SweepRow.job)
        .join(SweepRow, col(SweepRow.id) == col(VerdictRow.sweep_id))
        .where(SweepRow.job == job, VerdictRow.kind == kind)
        .order_by(col(VerdictRow.sweep_id).desc())
        .limit(limit)
    )
    return [_record(row, j) for row, j in session.exec(query)]


def verdict_outcomes(
    session: Session, job: str, kind: VerdictKind, before: int
) -> dict[int, VerdictOutcome]:
    """Sweep id -> outcome of the ``kind`` verdicts of ``job``'s sweeps before ``before``."""
    query = (
        select(VerdictRow.sweep_id, VerdictRow.outcome)
        .join(SweepRow, col(SweepRow.id) == col(VerdictRow.sweep_id))
        .where(SweepRow.job == job, VerdictRow.kind == kind, col(VerdictRow.sweep_id) < before)
    )
    out: dict[int, VerdictOutcome] = {}
    for sweep_id, outcome in session.exec(query):
        out[sweep_id] = _outcome(outcome)
    return out


def _kind(value: str) -> VerdictKind:
    for kind in VERDICT_KINDS:
        if value == kind:
            return kind
    raise ValueError(f"a verdict row holds an unknown kind {value!r}")


def _outcome(value: str) -> VerdictOutcome:
    if value == "clean":
        return "clean"
    if value == "regression":
        return "regression"
    if value == "failed_cells":
        return "failed_cells"
    raise ValueError(f"a verdict row holds an unknown outcome {value!r}")


def _record(row: VerdictRow, job: str) -> SweepVerdict:
    def at(column: str) -> dict[str, Any]:
        return {"table": "verdict", "row": row.id, "column": column}

    return SweepVerdict(
        sweep_id=row.sweep_id,
        job=job,
        kind=_kind(row.kind),
        outcome=_outcome(row.outcome),
        findings=read_column(tuple[Finding, ...], row.findings, **at("findings")),
        notes=read_column(tuple[str, ...], row.notes or (), **at("notes")),
        comparisons=row.comparisons,
        baseline_sweep_ids=read_column(
            tuple[StoredId, ...], row.baseline_sweep_ids or (), **at("baseline_sweep_ids")
        ),
        reused_cells=read_column(
            tuple[ReusedCell, ...], row.reused_cells or (), **at("reused_cells")
        ),
        history=row.history,
        engine=row.engine,
        pr_number=row.pr_number,
        head_sha=row.head_sha,
        created_at=row.created_at,
    )

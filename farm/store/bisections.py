"""Bisections in SQL: one row per search and one per finished step.

Typed records in and out (:class:`farm.workflows.bisect.Bisection`, ``BisectStep``);
the rows never leave the store. A bisection is found again by its key (job, engine,
both ends, the planned cells), so a second run of the same search reuses it; a step
is written the moment it finishes and is never written twice (unique per position).
Every function takes an explicit ``Session`` and commits its own unit of work.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ConfigDict
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from farm.errors import FarmError, StoreError
from farm.frozen import Frozen
from farm.inert import untrusted
from farm.results.bisection import (
    Bisection,
    BisectionStatus,
    BisectStep,
    Commit,
    Endpoint,
    SearchOutcome,
    StepVerdict,
    VariantJudgement,
)
from farm.store.base import _unit_of_work
from farm.store.columns import damaged, read_column, read_position
from farm.store.tables import BisectionRow, BisectStepRow

__all__ = [
    "add_counts",
    "create_bisection",
    "find_bisection",
    "finish_bisection",
    "get_bisection",
    "list_bisections",
    "record_step",
]


def create_bisection(session: Session, bisection: Bisection) -> tuple[Bisection, bool]:
    """Store ``bisection`` unless one with its key exists; (the stored one, created)."""
    existing = find_bisection(session, bisection.key)
    if existing is not None:
        return existing, False
    now = datetime.now(UTC)
    try:
        with _unit_of_work(session):
            row = BisectionRow(
                key=bisection.key,
                job=bisection.job,
                engine=bisection.engine,
                overlay=bisection.overlay,
                repo=untrusted(bisection.repo),  # never a source's password
                good_commit=bisection.good.commit,
                bad_commit=bisection.bad.commit,
                commits=[c.model_dump(mode="json") for c in bisection.commits],
                planned_cells=list(bisection.planned_cells),
                regressed=dict(bisection.regressed),
                endpoints={
                    "good": bisection.good.model_dump(mode="json"),
                    "bad": bisection.bad.model_dump(mode="json"),
                },
                status=bisection.status,
                reason=untrusted(bisection.reason),
                created_at=now,
            )
            session.add(row)
    except IntegrityError:
        stored = find_bisection(session, bisection.key)
        if stored is None:
            raise StoreError(f"cannot record bisection {bisection.key}") from None
        return stored, False
    stored = find_bisection(session, bisection.key)
    assert stored is not None
    return stored, True


def find_bisection(session: Session, key: str) -> Bisection | None:
    """The bisection with ``key``, with its steps; None when there is none."""
    row = session.exec(select(BisectionRow).where(BisectionRow.key == key)).first()
    return None if row is None else _record(session, row)


def get_bisection(session: Session, bisection_id: int, option: str = "--bisection") -> Bisection:
    """Bisection ``bisection_id`` with its steps. FarmError naming ``option`` (the
    command's own: ``--bisection``, ``--resume``) when there is none."""
    row = session.get(BisectionRow, bisection_id)
    if row is None:
        raise FarmError(f"{option} {bisection_id}: no such bisection in this store")
    return _record(session, row)


def list_bisections(session: Session, limit: int = 50) -> list[Bisection]:
    """The newest ``limit`` bisections, newest first (with their steps)."""
    rows = session.exec(
        select(BisectionRow).order_by(col(BisectionRow.id).desc()).limit(limit)
    ).all()
    return [_record(session, r) for r in rows]


def record_step(session: Session, bisection_id: int, step: BisectStep) -> tuple[BisectStep, bool]:
    """Store a finished step; when its position is stored already (another driver),
    return that one with False."""
    now = step.created_at or datetime.now(UTC)
    try:
        with _unit_of_work(session):
            session.add(
                BisectStepRow(
                    bisection_id=bisection_id,
                    position=step.position,
                    commit=step.commit,
                    build_id=step.build_id,
                    sweep_id=step.sweep_id,
                    verdict=step.verdict,
                    figures=[j.model_dump(mode="json") for j in step.judgements],
                    reason=untrusted(step.reason),
                    engine_s=step.engine_s,
                    created_at=now,
                )
            )
    except IntegrityError:
        found = session.exec(
            select(BisectStepRow).where(
                BisectStepRow.bisection_id == bisection_id,
                BisectStepRow.position == step.position,
            )
        ).first()
        if found is None:
            raise StoreError(
                f"cannot record step {step.position} of bisection {bisection_id}"
            ) from None
        return _step(found), False
    return step.model_copy(update={"created_at": now}), True


def add_counts(
    session: Session, bisection_id: int, *, builds: int, cells: int, wall_s: float
) -> None:
    """Add one run's builds, cells and wall time to the bisection's totals."""
    with _unit_of_work(session):
        row = session.get(BisectionRow, bisection_id)
        if row is None:
            raise StoreError(f"bisection {bisection_id} vanished")
        row.builds_run += builds
        row.cells_run += cells
        row.wall_s += wall_s
        session.add(row)


def finish_bisection(session: Session, bisection_id: int, outcome: SearchOutcome) -> None:
    """Record the answer (found or inconclusive) of bisection ``bisection_id``."""
    if outcome.status == "running":
        raise ValueError("a running search has no answer to record")
    with _unit_of_work(session):
        row = session.get(BisectionRow, bisection_id)
        if row is None:
            raise StoreError(f"bisection {bisection_id} vanished")
        row.status = outcome.status
        row.first_bad = outcome.first_bad
        row.last_good = outcome.last_good
        row.reason = untrusted(outcome.reason)
        row.finished_at = datetime.now(UTC)
        session.add(row)


def _status(value: str) -> BisectionStatus:
    if value in ("running", "found", "inconclusive"):
        return value  # type: ignore[return-value]
    raise ValueError(f"a bisection row holds an unknown status {value!r}")


def _verdict(value: str) -> StepVerdict:
    if value in ("good", "bad", "skip"):
        return value  # type: ignore[return-value]
    raise ValueError(f"a bisection step row holds an unknown verdict {value!r}")


def _step(row: BisectStepRow, count: int | None = None) -> BisectStep:
    """The step of ``row``; with ``count`` (the bisection's commits) its position is
    checked to be one of them."""
    at: dict[str, Any] = {"table": "bisect_step", "row": row.id}
    position = row.position
    if count is not None:
        position = read_position(row.position, count, **at, column="position") or 0
    return BisectStep(
        position=position,
        commit=row.commit,
        build_id=row.build_id,
        sweep_id=row.sweep_id,
        verdict=_verdict(row.verdict),
        judgements=read_column(tuple[VariantJudgement, ...], row.figures, **at, column="figures"),
        reason=row.reason,
        engine_s=row.engine_s,
        created_at=row.created_at,
    )


class _Endpoints(Frozen):
    """The shape of ``bisection.endpoints``."""

    # Read back by whichever farm version runs next: unknown fields are ignored.
    model_config = ConfigDict(extra="ignore")

    good: Endpoint
    bad: Endpoint


def _record(session: Session, row: BisectionRow) -> Bisection:
    steps = session.exec(
        select(BisectStepRow)
        .where(BisectStepRow.bisection_id == row.id)
        .order_by(col(BisectStepRow.id))
    ).all()
    at: dict[str, Any] = {"table": "bisection", "row": row.id}
    commits = read_column(tuple[Commit, ...], row.commits, **at, column="commits")
    if len(commits) < 2:
        raise damaged("bisection", row.id, "commits", f"{len(commits)} commit(s), not a range")
    ends = read_column(_Endpoints, row.endpoints, **at, column="endpoints")
    shas = {c.sha for c in commits}
    for name, end in (("good", ends.good), ("bad", ends.bad)):
        if end.commit not in shas:
            raise damaged("bisection", row.id, "endpoints", f"{name} {end.commit!r} is no commit")
    count = len(commits)
    return Bisection(
        id=row.id,
        key=row.key,
        job=row.job,
        engine=row.engine,
        overlay=row.overlay,
        repo=row.repo,
        commits=commits,
        planned_cells=read_column(tuple[str, ...], row.planned_cells, **at, column="planned_cells"),
        regressed=read_column(dict[str, str], row.regressed, **at, column="regressed"),
        good=ends.good,
        bad=ends.bad,
        status=_status(row.status),
        first_bad=read_position(row.first_bad, count, **at, column="first_bad"),
        last_good=read_position(row.last_good, count, **at, column="last_good"),
        reason=row.reason,
        builds_run=row.builds_run,
        cells_run=row.cells_run,
        wall_s=row.wall_s,
        steps=tuple(_step(s, count) for s in steps),
        created_at=row.created_at,
        finished_at=row.finished_at,
    )

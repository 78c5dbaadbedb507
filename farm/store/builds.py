"""Builds: the engine builds a sweep ran (:func:`record_build`, :func:`sweep_builds`)
and the nodes that hold each build (:class:`BuildLocation`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session, col, select

from farm.errors import StoreError
from farm.frozen import Frozen
from farm.records import BuildInfo
from farm.store.base import _require_sweep, _unit_of_work, dialect_insert
from farm.store.columns import read_column
from farm.store.tables import BuildLocationRow, BuildRow, SweepBuildRow

__all__ = [
    "BuildLocation",
    "build_locations",
    "record_build",
    "record_build_location",
    "sweep_build_infos",
    "sweep_builds",
]


def record_build(session: Session, sweep_id: int, build: BuildInfo) -> None:
    """Insert or update ``build`` (unique by build id) and link it to the sweep.

    Raises StoreError when there is no such sweep.
    """
    values = build.model_dump(mode="json")
    # Upsert so concurrent sweeps that share a build cannot race on its primary key.
    insert = dialect_insert(session)
    with _unit_of_work(session):
        _require_sweep(session, sweep_id)
        upsert = insert(BuildRow).values(values)
        session.exec(
            upsert.on_conflict_do_update(
                index_elements=["build_id"],
                set_={k: upsert.excluded[k] for k in values if k != "build_id"},
            )
        )
        link = insert(SweepBuildRow).values(sweep_id=sweep_id, build_id=build.build_id)
        session.exec(link.on_conflict_do_nothing())


def _sweep_build_rows(session: Session, sweep_id: int) -> Sequence[BuildRow]:
    return session.exec(
        select(BuildRow)
        .join(SweepBuildRow)
        .where(SweepBuildRow.sweep_id == sweep_id)
        .order_by(col(BuildRow.build_id))
    ).all()


def sweep_builds(session: Session, sweep_id: int) -> dict[str, str]:
    """Engine -> build id of the builds sweep ``sweep_id`` ran (its cells not read)."""
    return {row.engine: row.build_id for row in _sweep_build_rows(session, sweep_id)}


def sweep_build_infos(session: Session, sweep_id: int) -> tuple[BuildInfo, ...]:
    """The builds sweep ``sweep_id`` ran, whole (where each interpreter is), its cells
    not read: what a rerun of an earlier sweep's build is served by."""
    return tuple(_build(row) for row in _sweep_build_rows(session, sweep_id))


def _build(row: BuildRow) -> BuildInfo:
    at: dict[str, Any] = {"table": "build", "row": row.build_id}
    values = {
        **row.model_dump(),
        "pins": read_column(tuple[str, ...], row.pins, column="pins", **at),
        "patches": read_column(tuple[str, ...], row.patches, column="patches", **at),
    }
    return BuildInfo.model_validate(values)


class BuildLocation(Frozen):
    """A build as it exists on one node: the Ray node id, its host and the folder."""

    build_id: str
    node_id: str
    host: str
    env_dir: str


def record_build_location(session: Session, location: BuildLocation) -> None:
    """Record (or refresh) that ``location.node_id`` holds the build at ``env_dir``.

    Raises StoreError when the build itself was never recorded (``record_build``).
    """
    with _unit_of_work(session):
        if session.get(BuildRow, location.build_id) is None:
            raise StoreError(
                f"build {location.build_id} is not in the store; record_build it first"
            )
        row = session.get(BuildLocationRow, (location.build_id, location.node_id))
        if row is None:
            row = BuildLocationRow(**location.model_dump(), recorded_at=datetime.now(UTC))
        else:
            row.host = location.host
            row.env_dir = location.env_dir
            row.recorded_at = datetime.now(UTC)
        session.add(row)


def build_locations(session: Session, build_id: str) -> list[BuildLocation]:
    """Every node known to hold ``build_id``, by node id."""
    rows = session.exec(
        select(BuildLocationRow)
        .where(BuildLocationRow.build_id == build_id)
        .order_by(col(BuildLocationRow.node_id))
    ).all()
    return [BuildLocation.model_validate(r.model_dump(exclude={"recorded_at"})) for r in rows]

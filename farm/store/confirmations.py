"""The reruns of a night's suspicious cells (table ``confirmation_run``).

Typed in and out (:class:`farm.records.ConfirmationRun`); ``ConfirmationRunRow`` never
leaves the store. A run is written as it lands, so a night stopped half-way keeps the
runs it made and a resumed night runs only the rest. Read back with the sweep
(:func:`farm.store.cells.load_sweep`, through :func:`confirmation_runs`): one query
by sweep id.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Session, col, select

from farm.records import ConfirmationRun
from farm.store.base import _require_sweep, _unit_of_work, dialect_insert
from farm.store.columns import read_column
from farm.store.tables import ConfirmationRunRow

__all__ = ["confirmation_runs", "record_confirmation_run"]


def record_confirmation_run(session: Session, sweep_id: int, run: ConfirmationRun) -> None:
    """Store ``run`` as a rerun of sweep ``sweep_id``'s cell (the same cell, side and
    index again replaces it). Raises StoreError when there is no such sweep."""
    insert = dialect_insert(session)
    values = {
        "sweep_id": sweep_id,
        "cell_id": run.cell_id,
        "side": run.side,
        "run": run.run,
        "build_id": run.build_id,
        "status": run.result.status,
        "device_s": run.result.device_s,
        "result": run.result.model_dump(mode="json"),
        "created_at": datetime.now(UTC),
    }
    unique = ("sweep_id", "cell_id", "side", "run")
    with _unit_of_work(session):
        _require_sweep(session, sweep_id)
        upsert = insert(ConfirmationRunRow).values(values)
        session.exec(
            upsert.on_conflict_do_update(
                index_elements=list(unique),
                set_={k: upsert.excluded[k] for k in values if k not in unique},
            )
        )


def confirmation_runs(session: Session, sweep_id: int) -> tuple[ConfirmationRun, ...]:
    """Sweep ``sweep_id``'s reruns in the order they were stored."""
    rows = session.exec(
        select(ConfirmationRunRow)
        .where(ConfirmationRunRow.sweep_id == sweep_id)
        .order_by(col(ConfirmationRunRow.id))
    ).all()
    return tuple(
        read_column(
            ConfirmationRun,
            {
                "cell_id": r.cell_id,
                "side": r.side,
                "run": r.run,
                "build_id": r.build_id,
                "result": r.result,
            },
            table="confirmation_run",
            row=r.id,
            column="result",
        )
        for r in rows
    )

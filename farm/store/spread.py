"""Each key's stored night-to-night spread (table ``key_spread``).

A nightly or A/A verdict, once stored, upserts one row per spec-on key of its job:
the spread over the job's last nights as :func:`farm.analysis.noise.noise_table`
computed it then. One row per job, key and night, so the health dashboard plots the
spread over the nights and its table shows each key's latest. Typed rows in and out
(:class:`farm.analysis.noise.KeyNoiseRow`); ``KeySpreadRow`` never leaves the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session, col, select

from farm.analysis.noise import KeyNoiseRow
from farm.comparable import ComparableKey
from farm.store.base import _require_sweep, _unit_of_work, dialect_insert
from farm.store.columns import read_column
from farm.store.tables import KeySpreadRow

__all__ = ["record_spread", "stored_spread"]


def record_spread(session: Session, job: str, sweep_id: int, rows: Sequence[KeyNoiseRow]) -> None:
    """Upsert ``rows`` as job ``job``'s spread computed at sweep ``sweep_id`` (a rerun
    replaces the figures, it adds no row). Raises StoreError when there is no such
    sweep."""
    if not rows:
        return
    insert = dialect_insert(session)
    now = datetime.now(UTC)
    with _unit_of_work(session):
        _require_sweep(session, sweep_id)
        for row in rows:
            values = {
                "job": job,
                "key_label": row.key.label,
                "key": row.key.model_dump(mode="json"),
                "sweep_id": sweep_id,
                "nights": row.nights,
                "al_mean": row.al_mean,
                "al_sd": row.al_sd,
                "position_sd": list(row.position_sd),
                "accuracy_sd": row.accuracy_sd,
                "flip_rate": row.flip_rate,
                "aa_nights": row.aa_nights,
                "aa_false_alarms": row.aa_false_alarms,
                "computed_at": now,
            }
            upsert = insert(KeySpreadRow).values(values)
            unique = ("job", "key_label", "sweep_id")
            session.exec(
                upsert.on_conflict_do_update(
                    index_elements=list(unique),
                    set_={k: upsert.excluded[k] for k in values if k not in unique},
                )
            )


def stored_spread(
    session: Session, job: str, sweep_id: int | None = None
) -> tuple[int, list[KeyNoiseRow]] | None:
    """(sweep id, its rows by key label) of job ``job``'s spread computed at
    ``sweep_id`` (None: the newest night that has one), or None when there is none."""
    if sweep_id is None:
        sweep_id = session.exec(
            select(KeySpreadRow.sweep_id)
            .where(KeySpreadRow.job == job)
            .order_by(col(KeySpreadRow.sweep_id).desc())
            .limit(1)
        ).first()
        if sweep_id is None:
            return None
    found = session.exec(
        select(KeySpreadRow)
        .where(KeySpreadRow.job == job, KeySpreadRow.sweep_id == sweep_id)
        .order_by(col(KeySpreadRow.key_label))
    ).all()
    if not found:
        return None
    return sweep_id, [_row(r) for r in found]


def _row(r: KeySpreadRow) -> KeyNoiseRow:
    def at(column: str) -> dict[str, Any]:
        return {"table": "key_spread", "row": r.id, "column": column}

    return KeyNoiseRow(
        key=read_column(ComparableKey, r.key, **at("key")),
        nights=r.nights,
        al_mean=r.al_mean,
        al_sd=r.al_sd,
        position_sd=read_column(tuple[float, ...], r.position_sd, **at("position_sd")),
        accuracy_sd=r.accuracy_sd,
        flip_rate=r.flip_rate,
        aa_nights=r.aa_nights,
        aa_false_alarms=r.aa_false_alarms,
    )

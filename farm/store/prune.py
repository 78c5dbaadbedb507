"""``farm db prune``: drop the output text of old sweeps, keep every number.

Text is the bulk of the store (after a year of nightlies, 7.8 GB of its 7.9 GB) and only
greedy-agreement checks of recent sweeps read it. Pruning a sweep unlinks its requests
from their texts (``request_numbers.text_ids`` = NULL) and deletes the texts no
unpruned variant links to; counters, request numbers, summaries, verdicts and alerts
stay. Reports of a pruned sweep show greedy agreement as unknown.

The texts still linked are collected from the unpruned rows, in Python (the links are
JSON lists): after a first prune only the retention window has any, so a prune costs
what that window holds, not what the store holds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session

from farm.bounds import parse_age as bounded_age
from farm.frozen import Frozen
from farm.store.base import _unit_of_work
from farm.store.requests import _batches, _table
from farm.store.tables import (
    CellRow,
    RequestNumbersRow,
    RequestTextRow,
    SweepRow,
    VariantRunRow,
)

__all__ = ["PruneReport", "parse_age", "prune_text"]


class PruneReport(Frozen):
    """What a prune removed (or, with ``dry_run``, would remove)."""

    cutoff: datetime
    dry_run: bool
    sweeps: int  # sweeps started before the cutoff that still had text
    requests: int  # requests whose text was unlinked
    texts: int  # distinct texts deleted (no request uses them any more)
    text_bytes: int  # their UTF-8 size

    def describe(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"{verb} the output text of {self.requests} requests in {self.sweeps} sweeps "
            f"started before {self.cutoff:%Y-%m-%d %H:%M} UTC: {self.texts} stored texts, "
            f"{self.text_bytes / 1e6:.1f} MB of text; every number, verdict and alert kept"
        )


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h`` or ``2w`` as a timedelta (farm.bounds.parse_age: at most a
    century). Raises ValueError saying what is expected."""
    return bounded_age(text, units="hdw")


def prune_text(
    session: Session, older_than: timedelta, *, dry_run: bool = False, now: datetime | None = None
) -> PruneReport:
    """Unlink the text of every request of sweeps started more than ``older_than``
    before ``now`` (running sweeps excepted) and delete texts no request uses.

    One transaction; with ``dry_run`` nothing is written. Raises StoreError (store).
    """
    cutoff = (now or datetime.now(UTC)) - older_than
    s, c, v = _table(SweepRow), _table(CellRow), _table(VariantRunRow)
    n, t = _table(RequestNumbersRow), _table(RequestTextRow)
    old_runs = (
        sa.select(v.c.id)
        .join(c, c.c.id == v.c.cell_row_id)
        .join(s, s.c.id == c.c.sweep_id)
        .where(s.c.started_at < cutoff, s.c.status != "running")
    )
    on_postgresql = session.get_bind().dialect.name == "postgresql"
    text_bytes = (
        sa.func.octet_length(t.c.output_text)
        if on_postgresql
        else sa.func.length(sa.cast(t.c.output_text, sa.LargeBinary))
    )
    conn = session.connection()
    with _unit_of_work(session):
        if on_postgresql:
            # Waits for saves in flight and holds new ones back (they take ROW
            # EXCLUSIVE, farm.store.requests): none can link a text deleted here.
            conn.execute(sa.text("LOCK TABLE request_text IN SHARE ROW EXCLUSIVE MODE"))
        linked = n.c.text_ids.is_not(None)
        old_sweeps: set[int] = set()
        requests = 0
        for sweep_id, text_ids in conn.execute(
            sa.select(c.c.sweep_id, n.c.text_ids)
            .join(v, v.c.id == n.c.variant_run_id)
            .join(c, c.c.id == v.c.cell_row_id)
            .where(linked, n.c.variant_run_id.in_(old_runs))
        ):
            old_sweeps.add(sweep_id)
            requests += sum(i is not None for i in text_ids)
        kept: set[int] = set()
        for (text_ids,) in conn.execute(
            sa.select(n.c.text_ids).where(linked, n.c.variant_run_id.not_in(old_runs))
        ):
            kept.update(text_ids)
        # Texts no kept request links to (orphans of re-saved cells included).
        unused = [i for i in conn.execute(sa.select(t.c.id)).scalars() if i not in kept]
        size = 0
        for chunk in _batches(unused):
            size += conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(text_bytes), 0)).where(t.c.id.in_(chunk))
            ).scalar_one()
            if not dry_run:
                conn.execute(t.delete().where(t.c.id.in_(chunk)))
        if not dry_run:
            conn.execute(
                n.update().where(linked, n.c.variant_run_id.in_(old_runs)).values(text_ids=None)
            )
    return PruneReport(
        cutoff=cutoff,
        dry_run=dry_run,
        sweeps=len(old_sweeps),
        requests=requests,
        texts=len(unused),
        text_bytes=int(size),
    )

"""variant runs: one row per (cell, ordinal)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

Concurrent saves of one cell on PostgreSQL could each insert the cell's variant runs,
storing them twice. Duplicates already stored are removed first, keeping the newest
row of each (cell, ordinal) with its counters and requests, then a unique index is
added. An index, not a constraint: on SQLite a constraint means recreating the table,
and dropping the old one with foreign keys on would cascade to every counter and
request row.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "uq_variant_run_cell_row_id_ordinal"


def upgrade() -> None:
    _drop_duplicates(op.get_bind())
    op.create_index(_NAME, "variant_run", ["cell_row_id", "ordinal"], unique=True)


def downgrade() -> None:
    op.drop_index(_NAME, table_name="variant_run")


def _drop_duplicates(bind: sa.Connection) -> None:
    meta = sa.MetaData()
    run = sa.Table("variant_run", meta, autoload_with=bind)
    keep = sa.select(sa.func.max(run.c.id)).group_by(run.c.cell_row_id, run.c.ordinal)
    stale = [i for (i,) in bind.execute(sa.select(run.c.id).where(run.c.id.not_in(keep)))]
    if not stale:
        return
    # Children first: SQLite enforces ON DELETE CASCADE only with foreign keys on.
    for child in ("metric", "request_record"):
        table = sa.Table(child, meta, autoload_with=bind)
        bind.execute(table.delete().where(table.c.variant_run_id.in_(stale)))
    bind.execute(run.delete().where(run.c.id.in_(stale)))

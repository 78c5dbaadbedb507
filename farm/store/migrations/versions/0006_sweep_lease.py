"""sweep lease: which driver runs a sweep, and when it last said so

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

Two nullable columns (NULL for every sweep before them: a running sweep without a
heartbeat counts as abandoned), so it runs unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweep") as batch:
        batch.add_column(sa.Column("driver", sa.String(), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweep") as batch:
        batch.drop_column("heartbeat_at")
        batch.drop_column("driver")

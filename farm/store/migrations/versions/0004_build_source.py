"""build source: the content identity of a build not installed from a PyPI release

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

A nullable column (NULL for PyPI releases, as every build before it), so it runs
unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("build") as batch:
        batch.add_column(sa.Column("source", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("build") as batch:
        batch.drop_column("source")

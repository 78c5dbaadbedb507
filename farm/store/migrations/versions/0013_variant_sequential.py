"""variant_run sequential: the looks of a variant run against a reference, and what decided

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

Variants stored before it ran every prompt at once: NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("variant_run") as batch:
        batch.add_column(sa.Column("sequential", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("variant_run") as batch:
        batch.drop_column("sequential")

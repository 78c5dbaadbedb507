"""request_numbers categories: each request's category in its prompt set (MT-Bench,
SPEED-Bench), for acceptance by category

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

Requests stored before it had no category: NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("request_numbers") as batch:
        batch.add_column(sa.Column("categories", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_numbers") as batch:
        batch.drop_column("categories")

"""cell npus: the accelerators a cell's server held, for the device time verdicts cost

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

Cells stored before it ran on one device each as far as anyone can tell: NULL, read
as one device (a CPU host, or a single NPU).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cell") as batch:
        batch.add_column(sa.Column("npus", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cell") as batch:
        batch.drop_column("npus")

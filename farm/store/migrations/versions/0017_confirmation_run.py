"""table ``confirmation_run``: the reruns of a night's suspicious cells

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

A nightly reruns a cell whose first run is suspicious beside the last good night's
build, interleaved on one node, and decides from the runs. Each rerun is one row: the
sweep and cell it confirms, its side and index, the build, and the result as JSON.
Types are spelled out (no imports from ``farm.store``) so this revision keeps
describing the schema as it was.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "confirmation_run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("cell_id", sa.String(), nullable=False),
        sa.Column("side", sa.String(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("device_s", sa.Float(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "side IN ('candidate', 'reference')", name=op.f("ck_confirmation_run_side")
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweep.id"],
            name=op.f("fk_confirmation_run_sweep_id_sweep"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_confirmation_run")),
        sa.UniqueConstraint(
            "sweep_id",
            "cell_id",
            "side",
            "run",
            name=op.f("uq_confirmation_run_sweep_id_cell_id_side_run"),
        ),
    )
    op.create_index(op.f("ix_confirmation_run_sweep_id"), "confirmation_run", ["sweep_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_confirmation_run_sweep_id"), table_name="confirmation_run")
    op.drop_table("confirmation_run")

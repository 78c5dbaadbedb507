"""verdicts: one row per sweep and kind (nightly, pr) with its outcome and findings

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

A new table only, so it runs unchanged on SQLite and PostgreSQL. Types are spelled
out (no imports from ``farm.store``) so this revision keeps describing the schema as
it was, whatever the verdicts module becomes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "verdict",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("findings", sa.JSON(), nullable=False),
        sa.Column("notes", sa.JSON(), nullable=False),
        sa.Column("comparisons", sa.Integer(), nullable=False),
        sa.Column("baseline_sweep_ids", sa.JSON(), nullable=False),
        sa.Column("reused_cells", sa.JSON(), nullable=False),
        sa.Column("history", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(), nullable=True),
        sa.Column("pr_number", sa.Integer(), nullable=True),
        sa.Column("head_sha", sa.String(), nullable=True),
        sa.Column("created_at", _UTC, nullable=False),
        sa.CheckConstraint("kind IN ('nightly', 'pr')", name=op.f("ck_verdict_kind")),
        sa.CheckConstraint(
            "outcome IN ('clean', 'regression', 'failed_cells')", name=op.f("ck_verdict_outcome")
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweep.id"],
            name=op.f("fk_verdict_sweep_id_sweep"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_verdict")),
        sa.UniqueConstraint("sweep_id", "kind", name=op.f("uq_verdict_sweep_id_kind")),
    )
    op.create_index(op.f("ix_verdict_pr_number"), "verdict", ["pr_number"])


def downgrade() -> None:
    op.drop_table("verdict")

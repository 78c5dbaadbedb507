"""bisections: `farm bisect` searches and their finished steps

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

New tables only, so it runs unchanged on SQLite and PostgreSQL. Types are spelled out
(no imports from ``farm.store``) so this revision keeps describing the schema as it
was, whatever the bisections module becomes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "bisection",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("overlay", sa.String(), nullable=True),
        sa.Column("repo", sa.String(), nullable=False),
        sa.Column("good_commit", sa.String(), nullable=False),
        sa.Column("bad_commit", sa.String(), nullable=False),
        sa.Column("commits", sa.JSON(), nullable=False),
        sa.Column("planned_cells", sa.JSON(), nullable=False),
        sa.Column("regressed", sa.JSON(), nullable=False),
        sa.Column("endpoints", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("first_bad", sa.Integer(), nullable=True),
        sa.Column("last_good", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("builds_run", sa.Integer(), nullable=False),
        sa.Column("cells_run", sa.Integer(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("finished_at", _UTC, nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'found', 'inconclusive')", name=op.f("ck_bisection_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bisection")),
        sa.UniqueConstraint("key", name=op.f("uq_bisection_key")),
    )
    op.create_index(op.f("ix_bisection_job"), "bisection", ["job"])
    op.create_table(
        "bisect_step",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bisection_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("commit", sa.String(), nullable=False),
        sa.Column("build_id", sa.String(), nullable=True),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("engine_s", sa.Float(), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.CheckConstraint(
            "verdict IN ('good', 'bad', 'skip')", name=op.f("ck_bisect_step_verdict")
        ),
        sa.ForeignKeyConstraint(
            ["bisection_id"],
            ["bisection.id"],
            name=op.f("fk_bisect_step_bisection_id_bisection"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bisect_step")),
        sa.UniqueConstraint(
            "bisection_id", "position", name=op.f("uq_bisect_step_bisection_id_position")
        ),
    )
    op.create_index(op.f("ix_bisect_step_bisection_id"), "bisect_step", ["bisection_id"])


def downgrade() -> None:
    op.drop_table("bisect_step")
    op.drop_table("bisection")

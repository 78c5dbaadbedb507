"""build locations: which node holds which build, and where

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

A new table only, so it runs unchanged on SQLite and PostgreSQL. Types are spelled
out (no imports from ``farm.store``) so this revision keeps describing the schema as
it was.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "build_location",
        sa.Column("build_id", sa.String(), nullable=False),
        sa.Column("node_id", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("env_dir", sa.String(), nullable=False),
        sa.Column("recorded_at", _UTC, nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"],
            ["build.build_id"],
            name=op.f("fk_build_location_build_id_build"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("build_id", "node_id", name=op.f("pk_build_location")),
    )


def downgrade() -> None:
    op.drop_table("build_location")

"""alerts: one row per deduplicated regression alert

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06

A new table only, so it runs unchanged on SQLite and PostgreSQL. Types are spelled
out (no imports from ``farm.store``) so this revision keeps describing the schema as
it was, whatever the alerts module becomes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alert",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("metric", sa.String(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("severity", sa.String(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("first_sweep_id", sa.Integer(), nullable=False),
        sa.Column("last_sweep_id", sa.Integer(), nullable=False),
        sa.Column("opened_sweep_id", sa.Integer(), nullable=False),
        sa.Column("occurrences", sa.Integer(), nullable=False),
        sa.Column("created_at", _UTC, nullable=False),
        sa.Column("updated_at", _UTC, nullable=False),
        sa.Column("acknowledged_by", sa.String(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("notified_at", _UTC, nullable=True),
        sa.CheckConstraint(
            "state IN ('open', 'acknowledged', 'resolved')", name=op.f("ck_alert_state")
        ),
        sa.CheckConstraint("severity IN ('critical', 'warning')", name=op.f("ck_alert_severity")),
        sa.ForeignKeyConstraint(
            ["first_sweep_id"], ["sweep.id"], name=op.f("fk_alert_first_sweep_id_sweep")
        ),
        sa.ForeignKeyConstraint(
            ["last_sweep_id"], ["sweep.id"], name=op.f("fk_alert_last_sweep_id_sweep")
        ),
        sa.ForeignKeyConstraint(
            ["opened_sweep_id"], ["sweep.id"], name=op.f("fk_alert_opened_sweep_id_sweep")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert")),
        sa.UniqueConstraint("key", name=op.f("uq_alert_key")),
    )
    op.create_index(op.f("ix_alert_state"), "alert", ["state"])


def downgrade() -> None:
    op.drop_table("alert")

"""A/A nights and the stored spread: verdict kind ``aa``, table ``key_spread``

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04

``farm nightly --aa`` stores its verdict with kind ``aa`` (its findings are false
alarms of the rule, never alerts, and the night is never a baseline); each stored
nightly or A/A verdict upserts one ``key_spread`` row per spec-on key: the
night-to-night spread over the job's last nights. Batch mode: SQLite rebuilds the
verdict table to change its check constraint. Types are spelled out (no imports from
``farm.store``) so this revision keeps describing the schema as it was.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("verdict") as batch:
        batch.drop_constraint(op.f("ck_verdict_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_verdict_kind"), "kind IN ('nightly', 'pr', 'aa')")
    op.create_table(
        "key_spread",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("key_label", sa.String(), nullable=False),
        sa.Column("key", sa.JSON(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("nights", sa.Integer(), nullable=False),
        sa.Column("al_mean", sa.Float(), nullable=False),
        sa.Column("al_sd", sa.Float(), nullable=False),
        sa.Column("position_sd", sa.JSON(), nullable=False),
        sa.Column("accuracy_sd", sa.Float(), nullable=True),
        sa.Column("flip_rate", sa.Float(), nullable=True),
        sa.Column("aa_nights", sa.Integer(), nullable=False),
        sa.Column("aa_false_alarms", sa.Integer(), nullable=False),
        sa.Column("computed_at", _UTC, nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweep.id"],
            name=op.f("fk_key_spread_sweep_id_sweep"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_key_spread")),
        sa.UniqueConstraint(
            "job", "key_label", "sweep_id", name=op.f("uq_key_spread_job_key_label_sweep_id")
        ),
    )
    op.create_index(op.f("ix_key_spread_job"), "key_spread", ["job"])
    op.create_index(op.f("ix_key_spread_sweep_id"), "key_spread", ["sweep_id"])


def downgrade() -> None:
    op.drop_table("key_spread")
    # An A/A verdict has no place in the older schema: its night stays, unjudged.
    op.execute("DELETE FROM verdict WHERE kind = 'aa'")
    with op.batch_alter_table("verdict") as batch:
        batch.drop_constraint(op.f("ck_verdict_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_verdict_kind"), "kind IN ('nightly', 'pr')")

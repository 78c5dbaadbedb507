"""alert triage: states untriaged / acknowledged / downstream / invalid / fixed /
recovered, who triaged and when, a link, news of a changed cause

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

``open`` alerts become ``untriaged`` (nobody had said anything of them), ``resolved``
ones ``fixed`` (the one way to close an alert before); ``acknowledged_by`` becomes
``triaged_by``, and an acknowledged or resolved alert's triage time is its last update.
Batch mode: SQLite rebuilds the table to change its check constraint.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)
_NEW = "'untriaged', 'acknowledged', 'downstream', 'invalid', 'fixed', 'recovered'"
_OLD = "'open', 'acknowledged', 'resolved'"


def upgrade() -> None:
    with op.batch_alter_table("alert") as batch:
        batch.drop_constraint(op.f("ck_alert_state"), type_="check")
        batch.alter_column("acknowledged_by", new_column_name="triaged_by")
        batch.add_column(sa.Column("triaged_at", _UTC, nullable=True))
        batch.add_column(sa.Column("link", sa.Text(), nullable=True))
        batch.add_column(sa.Column("news", sa.Text(), nullable=True))
        batch.add_column(sa.Column("recovered_sweep_id", sa.Integer(), nullable=True))
    op.execute("UPDATE alert SET state = 'untriaged' WHERE state = 'open'")
    op.execute("UPDATE alert SET state = 'fixed' WHERE state = 'resolved'")
    op.execute("UPDATE alert SET triaged_at = updated_at WHERE state <> 'untriaged'")
    with op.batch_alter_table("alert") as batch:
        batch.create_check_constraint(op.f("ck_alert_state"), f"state IN ({_NEW})")
        batch.create_foreign_key(
            op.f("fk_alert_recovered_sweep_id_sweep"), "sweep", ["recovered_sweep_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("alert") as batch:
        batch.drop_constraint(op.f("fk_alert_recovered_sweep_id_sweep"), type_="foreignkey")
        batch.drop_constraint(op.f("ck_alert_state"), type_="check")
    op.execute("UPDATE alert SET state = 'open' WHERE state IN ('untriaged', 'downstream')")
    op.execute(
        "UPDATE alert SET state = 'resolved' WHERE state IN ('invalid', 'fixed', 'recovered')"
    )
    with op.batch_alter_table("alert") as batch:
        batch.drop_column("recovered_sweep_id")
        batch.drop_column("news")
        batch.drop_column("link")
        batch.drop_column("triaged_at")
        batch.alter_column("triaged_by", new_column_name="acknowledged_by")
        batch.create_check_constraint(op.f("ck_alert_state"), f"state IN ({_OLD})")

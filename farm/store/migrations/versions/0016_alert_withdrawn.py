"""alert state ``withdrawn``: an early per-cell alert its night's verdict did not confirm

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

A nightly raises a cell's alerts as the cell lands; at the night's end those the
verdict does not raise are closed as ``withdrawn`` (told as such when they were told).
Batch mode: SQLite rebuilds the table to change its check constraint.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "'untriaged', 'acknowledged', 'downstream', 'invalid', 'fixed', 'recovered'"
_NEW = _OLD + ", 'withdrawn'"


def upgrade() -> None:
    with op.batch_alter_table("alert") as batch:
        batch.drop_constraint(op.f("ck_alert_state"), type_="check")
        batch.create_check_constraint(op.f("ck_alert_state"), f"state IN ({_NEW})")


def downgrade() -> None:
    # A withdrawn alert was a false alarm of the early check: the nearest older state.
    op.execute("UPDATE alert SET state = 'invalid' WHERE state = 'withdrawn'")
    with op.batch_alter_table("alert") as batch:
        batch.drop_constraint(op.f("ck_alert_state"), type_="check")
        batch.create_check_constraint(op.f("ck_alert_state"), f"state IN ({_OLD})")

"""comparable key: axes as a mapping, and each variant's comparable key, indexed

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

``cell.axes`` and ``variant_run.axes`` hold every axis value (the old columns stay,
copies for SQL readers); ``variant_run.comparable_key`` / ``key_label`` and
``cell.fingerprint`` are set from :mod:`farm.comparable`. Rows written before this
revision are filled in here, with the workload identities of their sweep's job file
(left empty when that file no longer validates).
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cell") as batch:
        batch.add_column(sa.Column("axes", sa.JSON(), nullable=True))
    with op.batch_alter_table("variant_run") as batch:
        batch.add_column(sa.Column("axes", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("comparable_key", sa.String(), nullable=True))
        batch.add_column(sa.Column("key_label", sa.String(), nullable=True))
        batch.create_index("ix_variant_run_comparable_key", ["comparable_key"])
    _fill_keys(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("variant_run") as batch:
        batch.drop_index("ix_variant_run_comparable_key")
        batch.drop_column("key_label")
        batch.drop_column("comparable_key")
        batch.drop_column("axes")
    with op.batch_alter_table("cell") as batch:
        batch.drop_column("axes")


def _identities(job_yaml: str) -> dict[str, str]:
    from farm.errors import FarmError
    from farm.plan import workload_identity
    from farm.spec import parse_job

    try:
        job = parse_job(job_yaml)
    except FarmError:
        return {}
    return {w.name: workload_identity(w) for w in job.workloads}


def _fill_keys(bind: sa.Connection) -> None:
    from farm.plan import ServerCell

    meta = sa.MetaData()
    sweep = sa.Table("sweep", meta, autoload_with=bind)
    cell = sa.Table("cell", meta, autoload_with=bind)
    run = sa.Table("variant_run", meta, autoload_with=bind)
    for sweep_id, job_yaml in bind.execute(sa.select(sweep.c.id, sweep.c.job_yaml)).all():
        identities = _identities(job_yaml)
        for row in bind.execute(sa.select(cell).where(cell.c.sweep_id == sweep_id)).mappings():
            variants = [
                {**v, "workload_identity": identities.get(str(v.get("workload")), "")}
                for v in row["variants"]
            ]
            server = ServerCell.model_validate({**_legacy(row), "variants": variants})
            bind.execute(
                cell.update()
                .where(cell.c.id == row["id"])
                .values(
                    axes=server.axes,
                    fingerprint=server.key.fingerprint,
                    variants=[
                        {**v.model_dump(mode="json"), "comparable_key": key.fingerprint}
                        for v in server.variants
                        for key in (server.variant_key(v.axes),)
                    ],
                )
            )
            runs = bind.execute(
                sa.select(run.c.id, run.c.thinking, run.c.workload).where(
                    run.c.cell_row_id == row["id"]
                )
            ).all()
            for run_id, thinking, workload in runs:
                axes = {"thinking": thinking, "workload": workload}
                key = server.variant_key(axes)
                bind.execute(
                    run.update()
                    .where(run.c.id == run_id)
                    .values(axes=axes, comparable_key=key.fingerprint, key_label=key.label)
                )


def _legacy(row: Any) -> dict[str, Any]:
    names = (
        "engine",
        "family",
        "model",
        "graph_mode",
        "planned_graph_mode",
        "mtp_depth",
        "sliding_window",
        "remaps",
    )
    return {n: row[n] for n in names}

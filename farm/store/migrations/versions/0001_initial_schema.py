"""initial schema: sweeps, builds, cells, variant runs, metrics, requests

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Types are spelled out (no imports from ``farm.store.tables``) so this revision keeps
describing the schema as it was, whatever the tables module becomes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("job_yaml", sa.Text(), nullable=False),
        sa.Column("started_at", _UTC, nullable=False),
        sa.Column("finished_at", _UTC, nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("farm_version", sa.String(), nullable=False),
        sa.CheckConstraint(
            "status IN ('running', 'ok', 'failed', 'interrupted')", name=op.f("ck_sweep_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep")),
    )
    op.create_index(op.f("ix_sweep_job"), "sweep", ["job"])

    op.create_table(
        "build",
        sa.Column("build_id", sa.String(), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("family", sa.String(), nullable=False),
        sa.Column("package", sa.String(), nullable=False),
        sa.Column("version", sa.String(), nullable=False),
        sa.Column("pins", sa.JSON(), nullable=False),
        sa.Column("patches", sa.JSON(), nullable=False),
        sa.Column("python", sa.String(), nullable=False),
        sa.Column("env_dir", sa.String(), nullable=False),
        sa.Column("node", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("build_id", name=op.f("pk_build")),
    )

    op.create_table(
        "sweep_build",
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.String(), nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweep.id"],
            name=op.f("fk_sweep_build_sweep_id_sweep"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["build_id"],
            ["build.build_id"],
            name=op.f("fk_sweep_build_build_id_build"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("sweep_id", "build_id", name=op.f("pk_sweep_build")),
    )
    op.create_index(op.f("ix_sweep_build_build_id"), "sweep_build", ["build_id"])

    op.create_table(
        "cell",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("cell_id", sa.String(), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("family", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("graph_mode", sa.String(), nullable=False),
        sa.Column("planned_graph_mode", sa.String(), nullable=False),
        sa.Column("mtp_depth", sa.Integer(), nullable=False),
        sa.Column("sliding_window", sa.String(), nullable=False),
        sa.Column("remaps", sa.JSON(), nullable=False),
        sa.Column("variants", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("effective", sa.JSON(), nullable=True),
        sa.Column("effective_graph_mode", sa.String(), nullable=True),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("node", sa.String(), nullable=True),
        sa.Column("started_at", _UTC, nullable=True),
        sa.Column("finished_at", _UTC, nullable=True),
        sa.Column("startup_s", sa.Float(), nullable=True),
        sa.Column("generation_s", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("log_path", sa.String(), nullable=True),
        sa.CheckConstraint(
            "status IN ('planned', 'ok', 'failed', 'build_failed')", name=op.f("ck_cell_status")
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweep.id"], name=op.f("fk_cell_sweep_id_sweep"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cell")),
        sa.UniqueConstraint("sweep_id", "cell_id", name=op.f("uq_cell_sweep_id_cell_id")),
    )
    op.create_index(op.f("ix_cell_fingerprint"), "cell", ["fingerprint"])

    op.create_table(
        "excluded_cell",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("axes", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweep.id"],
            name=op.f("fk_excluded_cell_sweep_id_sweep"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_excluded_cell")),
    )
    op.create_index(op.f("ix_excluded_cell_sweep_id"), "excluded_cell", ["sweep_id"])

    op.create_table(
        "variant_run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cell_row_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("thinking", sa.String(), nullable=False),
        sa.Column("workload", sa.String(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("elapsed_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cell_row_id"],
            ["cell.id"],
            name=op.f("fk_variant_run_cell_row_id_cell"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_variant_run")),
    )
    op.create_index(op.f("ix_variant_run_cell_row_id"), "variant_run", ["cell_row_id"])

    op.create_table(
        "metric",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("variant_run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["variant_run_id"],
            ["variant_run.id"],
            name=op.f("fk_metric_variant_run_id_variant_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric")),
        sa.UniqueConstraint(
            "variant_run_id",
            "name",
            "position",
            name=op.f("uq_metric_variant_run_id_name_position"),
        ),
    )

    op.create_table(
        "request_record",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("variant_run_id", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sa.String(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("counters", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["variant_run_id"],
            ["variant_run.id"],
            name=op.f("fk_request_record_variant_run_id_variant_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_record")),
    )
    op.create_index(op.f("ix_request_record_variant_run_id"), "request_record", ["variant_run_id"])


def downgrade() -> None:
    # Children before parents; dropping a table drops its indexes.
    for table in (
        "request_record",
        "metric",
        "variant_run",
        "excluded_cell",
        "cell",
        "sweep_build",
        "build",
        "sweep",
    ):
        op.drop_table(table)

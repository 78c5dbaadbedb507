"""request text in its own table, narrow request numbers, a per-variant summary

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Issue 15: a year of nightlies was 7.8 GB of request rows, almost all output text, and
history read every request of every sweep. Here:

- ``request_text`` holds each distinct output text once (content-addressed: greedy
  decoding repeats a prompt's text night after night); ``request_record.text_id``
  points at it and is set to NULL by ``farm db prune``.
- ``request_record.counters`` (JSON) becomes the narrow columns ``drafts``,
  ``draft_tokens``, ``accepted`` and ``accepted_per_pos`` (a short JSON list).
- ``variant_summary``: one row per variant run with its request counts, counters and
  the AL interval history draws, backfilled here with the code that computes it at
  save time (farm.analysis.history.al_interval, same seed).

On PostgreSQL the space of the dropped columns returns after ``VACUUM FULL
request_record`` (a plain VACUUM makes it reusable by new rows).
"""

import hashlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql, sqlite

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHUNK = 2000
_TEXT_INDEX = "ix_request_record_text_id"
_TEXT_FK = "fk_request_record_text_id_request_text"


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "request_text",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_text")),
        sa.UniqueConstraint("digest", name=op.f("uq_request_text_digest")),
    )
    if bind.dialect.name == "postgresql":
        # Compress texts of a few hundred bytes too (the default waits for ~2 kB rows).
        op.execute("ALTER TABLE request_text SET (toast_tuple_target = 128)")
    op.create_table(
        "variant_summary",
        sa.Column("variant_run_id", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("failed_requests", sa.Integer(), nullable=False),
        sa.Column("scored", sa.Integer(), nullable=False),
        sa.Column("correct", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("drafts", sa.BigInteger(), nullable=False),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("accepted_per_pos", sa.JSON(), nullable=False),
        sa.Column("al_low", sa.Float(), nullable=True),
        sa.Column("al_high", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["variant_run_id"],
            ["variant_run.id"],
            name=op.f("fk_variant_summary_variant_run_id_variant_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("variant_run_id", name=op.f("pk_variant_summary")),
    )
    # Plain ADD COLUMNs (no table rebuild on SQLite); the foreign key comes with the
    # rebuild that drops the old columns below.
    with op.batch_alter_table("request_record") as batch:
        batch.add_column(sa.Column("text_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("drafts", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("draft_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("accepted", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("accepted_per_pos", sa.JSON(), nullable=True))
    _move_requests(bind)
    _fill_summaries(bind)
    with op.batch_alter_table("request_record") as batch:
        batch.drop_column("output_text")
        batch.drop_column("counters")
        batch.create_foreign_key(_TEXT_FK, "request_text", ["text_id"], ["id"], ondelete="SET NULL")
    _create_text_index()


def _create_text_index() -> None:
    # Partial: pruned requests (text_id NULL) cost no index entry.
    op.create_index(
        _TEXT_INDEX,
        "request_record",
        ["text_id"],
        postgresql_where=sa.text("text_id IS NOT NULL"),
        sqlite_where=sa.text("text_id IS NOT NULL"),
    )


def downgrade() -> None:
    bind = op.get_bind()
    op.drop_index(_TEXT_INDEX, table_name="request_record")
    with op.batch_alter_table("request_record") as batch:
        batch.drop_constraint(_TEXT_FK, type_="foreignkey")
        batch.add_column(sa.Column("output_text", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("counters", sa.JSON(), nullable=True))
    _restore_requests(bind)
    with op.batch_alter_table("request_record") as batch:
        batch.alter_column("output_text", server_default=None)
        for name in ("accepted_per_pos", "accepted", "draft_tokens", "drafts", "text_id"):
            batch.drop_column(name)
    op.drop_table("variant_summary")
    op.drop_table("request_text")


def _digest(text: str) -> bytes:
    # farm.store.requests.text_digest, copied: a migration must not follow later code.
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]


def _chunks(bind: sa.Connection, query: sa.Select[Any], key: Any) -> Iterator[Sequence[Any]]:
    """Rows of ``query`` in chunks, by keyset on ``key`` (never the whole table at once)."""
    last = None
    while True:
        page = query if last is None else query.where(key > last)
        rows = bind.execute(page.order_by(key).limit(_CHUNK)).all()
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def _move_requests(bind: sa.Connection) -> None:
    meta = sa.MetaData()
    req = sa.Table("request_record", meta, autoload_with=bind)
    text = sa.Table("request_text", meta, autoload_with=bind)
    insert: Any = postgresql.insert if bind.dialect.name == "postgresql" else sqlite.insert
    query = sa.select(req.c.id, req.c.output_text, req.c.counters)
    for rows in _chunks(bind, query, req.c.id):
        by_digest = {_digest(t): t for _, t, _ in rows}
        bind.execute(
            insert(text)
            .values([{"digest": d, "output_text": t} for d, t in by_digest.items()])
            .on_conflict_do_nothing()
        )
        found = sa.select(text.c.digest, text.c.id).where(text.c.digest.in_(list(by_digest)))
        ids = {digest: text_id for digest, text_id in bind.execute(found)}
        updates = []
        for row_id, output, counters in rows:
            c = counters or {}
            per_pos = c.get("accepted_per_pos") if counters else None
            updates.append(
                {
                    "row_id": row_id,
                    "text_id": ids[_digest(output)],
                    "drafts": c.get("drafts", 0) if counters else None,
                    "draft_tokens": c.get("draft_tokens", 0) if counters else None,
                    "accepted": c.get("accepted", 0) if counters else None,
                    "accepted_per_pos": list(per_pos or ()) if counters else None,
                }
            )
        bind.execute(
            req.update()
            .where(req.c.id == sa.bindparam("row_id"))
            .values(
                text_id=sa.bindparam("text_id"),
                drafts=sa.bindparam("drafts"),
                draft_tokens=sa.bindparam("draft_tokens"),
                accepted=sa.bindparam("accepted"),
                accepted_per_pos=sa.bindparam("accepted_per_pos", type_=sa.JSON(none_as_null=True)),
            ),
            updates,
        )


def _fill_summaries(bind: sa.Connection) -> None:
    from farm.analysis.history import al_interval
    from farm.records import RequestRecord, SpecCounters

    meta = sa.MetaData()
    cell = sa.Table("cell", meta, autoload_with=bind)
    run = sa.Table("variant_run", meta, autoload_with=bind)
    metric = sa.Table("metric", meta, autoload_with=bind)
    req = sa.Table("request_record", meta, autoload_with=bind)
    summary = sa.Table("variant_summary", meta, autoload_with=bind)
    sweep_ids = bind.execute(sa.select(cell.c.sweep_id).distinct()).scalars().all()
    for sweep_id in sweep_ids:
        runs = bind.execute(
            sa.select(run.c.id).join(cell).where(cell.c.sweep_id == sweep_id)
        ).scalars()
        run_ids = list(runs)
        if not run_ids:
            continue
        scalars: dict[int, dict[str, int]] = defaultdict(dict)
        per_pos: dict[int, dict[int, int]] = defaultdict(dict)
        for run_id, name, pos, value in bind.execute(
            sa.select(
                metric.c.variant_run_id, metric.c.name, metric.c.position, metric.c.value
            ).where(metric.c.variant_run_id.in_(run_ids))
        ):
            if pos is None:
                scalars[run_id][name] = value
            elif name == "accepted_per_pos":
                per_pos[run_id][pos] = value
        requests: dict[int, list[RequestRecord]] = defaultdict(list)
        for r in bind.execute(
            sa.select(req)
            .where(req.c.variant_run_id.in_(run_ids))
            .order_by(req.c.prompt_id, req.c.id)
        ).mappings():
            counters = (
                None
                if r["drafts"] is None
                else SpecCounters(
                    drafts=r["drafts"],
                    draft_tokens=r["draft_tokens"],
                    accepted=r["accepted"],
                    accepted_per_pos=tuple(r["accepted_per_pos"] or ()),
                )
            )
            requests[r["variant_run_id"]].append(
                RequestRecord(
                    prompt_id=r["prompt_id"],
                    output_text=None,
                    completion_tokens=r["completion_tokens"],
                    finish_reason=r["finish_reason"],
                    latency_s=r["latency_s"],
                    correct=r["correct"],
                    error=r["error"],
                    counters=counters,
                )
            )
        rows = []
        for run_id in run_ids:
            reqs = requests[run_id]
            ok = [r for r in reqs if r.error is None]
            scored = [r for r in ok if r.correct is not None]
            positions = per_pos[run_id]
            low, high = al_interval(reqs, sweep_id)
            rows.append(
                {
                    "variant_run_id": run_id,
                    "requests": len(reqs),
                    "failed_requests": len(reqs) - len(ok),
                    "scored": len(scored),
                    "correct": sum(bool(r.correct) for r in scored),
                    "output_tokens": sum(r.completion_tokens for r in ok),
                    "drafts": scalars[run_id].get("drafts", 0),
                    "draft_tokens": scalars[run_id].get("draft_tokens", 0),
                    "accepted": scalars[run_id].get("accepted", 0),
                    "accepted_per_pos": [
                        positions.get(i, 0) for i in range(max(positions) + 1 if positions else 0)
                    ],
                    "al_low": low,
                    "al_high": high,
                }
            )
        bind.execute(summary.insert(), rows)


def _restore_requests(bind: sa.Connection) -> None:
    meta = sa.MetaData()
    req = sa.Table("request_record", meta, autoload_with=bind)
    text = sa.Table("request_text", meta, autoload_with=bind)
    query = sa.select(
        req.c.id,
        text.c.output_text,
        req.c.drafts,
        req.c.draft_tokens,
        req.c.accepted,
        req.c.accepted_per_pos,
    ).select_from(req.outerjoin(text, text.c.id == req.c.text_id))
    for rows in _chunks(bind, query, req.c.id):
        bind.execute(
            req.update()
            .where(req.c.id == sa.bindparam("row_id"))
            .values(
                output_text=sa.bindparam("output_text"),
                counters=sa.bindparam("counters", type_=sa.JSON()),
            ),
            [
                {
                    "row_id": row_id,
                    "output_text": output or "",
                    "counters": None
                    if drafts is None
                    else {
                        "drafts": drafts,
                        "draft_tokens": tokens,
                        "accepted": accepted,
                        "accepted_per_pos": list(per_pos or ()),
                    },
                }
                for row_id, output, drafts, tokens, accepted, per_pos in rows
            ],
        )

"""request text in its own table, request numbers packed per variant, a per-variant summary

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

A year of nightlies was 7.8 GB of request rows, almost all output text, and
history read every request of every sweep. Here:

- ``request_text`` holds each distinct output text once (content-addressed: greedy
  decoding repeats a prompt's text night after night).
- ``request_numbers`` replaces ``request_record``: one row per variant run holding
  its requests' numbers as JSON lists (one entry per request, in prompt id then saved
  order; ``text_ids`` point into ``request_text`` and become NULL on ``farm db
  prune``). A row per request cost ~130 B on PostgreSQL in headers and index entries
  alone; one compressed row per variant costs a fraction of it.
- ``variant_summary``: one row per variant run with its request counts, counters and
  the AL interval history draws, backfilled here with the code that computes it at
  save time (farm.analysis.history.al_interval, same seed).

On PostgreSQL the packed rows keep the default TOAST settings (pglz, EXTENDED):
measured against lz4, STORAGE MAIN and toast_tuple_target = 128, none was smaller
(latencies, the largest list, are digits pglz cannot shrink). The move runs one
sweep at a time; the downgrade rebuilds 0007's ``request_record``.
"""

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql, sqlite

if TYPE_CHECKING:
    from farm.records import RequestRecord

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Variant runs moved per statement (each with its ~200 requests).
_RUNS = 100
# Ids per IN list: SQLite before 3.32 allows 999 bound parameters.
_IDS = 400
# The packed columns, as farm.store.requests.PACKED_COLUMNS was when this was written.
_PACKED = (
    "prompt_ids",
    "text_ids",
    "completion_tokens",
    "finish_reasons",
    "latencies_s",
    "correct",
    "errors",
    "drafts",
    "draft_tokens",
    "accepted",
    "accepted_per_pos",
)
_REQUIRED = ("prompt_ids", "completion_tokens", "latencies_s")
_NEW = ("request_text", "request_numbers", "variant_summary")


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
    op.create_table(
        "request_numbers",
        sa.Column("variant_run_id", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.JSON(), nullable=name not in _REQUIRED) for name in _PACKED),
        sa.ForeignKeyConstraint(
            ["variant_run_id"],
            ["variant_run.id"],
            name=op.f("fk_request_numbers_variant_run_id_variant_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("variant_run_id", name=op.f("pk_request_numbers")),
    )
    _move_requests(bind)
    op.drop_table("request_record")


def downgrade() -> None:
    bind = op.get_bind()
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
    _restore_requests(bind)
    op.drop_table("request_numbers")
    op.drop_table("variant_summary")
    op.drop_table("request_text")


def _digest(text: str) -> bytes:
    # farm.store.requests.text_digest, copied: a migration must not follow later code.
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]


def _in_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _insert(bind: sa.Connection) -> Any:
    return postgresql.insert if bind.dialect.name == "postgresql" else sqlite.insert


def _pack(requests: "Sequence[RequestRecord]", text_ids: dict[str, int]) -> dict[str, Any]:
    """Each packed column's compact JSON text (None: NULL), as the farm wrote them when
    this revision was made (farm.store.requests.pack_requests, copied)."""
    counters = [r.counters for r in requests]
    columns: dict[str, list[Any]] = {
        "prompt_ids": [r.prompt_id for r in requests],
        "text_ids": [None if r.output_text is None else text_ids[r.output_text] for r in requests],
        "completion_tokens": [r.completion_tokens for r in requests],
        "finish_reasons": [r.finish_reason for r in requests],
        "latencies_s": [r.latency_s for r in requests],
        "correct": [r.correct for r in requests],
        "errors": [[i, r.error] for i, r in enumerate(requests) if r.error is not None],
        "drafts": [c and c.drafts for c in counters],
        "draft_tokens": [c and c.draft_tokens for c in counters],
        "accepted": [c and c.accepted for c in counters],
        "accepted_per_pos": [c and list(c.accepted_per_pos) for c in counters],
    }
    return {
        name: json.dumps(values, separators=(",", ":"))
        if name in _REQUIRED or any(v is not None for v in values)
        else None
        for name, values in columns.items()
    }


def _insert_numbers(bind: sa.Connection, table: sa.Table) -> sa.Insert:
    on_postgresql = bind.dialect.name == "postgresql"

    def json_text(name: str) -> Any:
        param = sa.bindparam(name, type_=sa.Text)
        return sa.cast(param, postgresql.JSON) if on_postgresql else param

    return table.insert().values(
        variant_run_id=sa.bindparam("variant_run_id"),
        **{name: json_text(name) for name in _PACKED},
    )


def _move_requests(bind: sa.Connection) -> None:
    """request_record rows (0007: output_text, counters JSON) into request_text,
    request_numbers and variant_summary, a sweep's variant runs at a time."""
    meta = sa.MetaData()
    meta.reflect(bind, only=("cell", "variant_run", "metric", "request_record", *_NEW))
    cell, run = meta.tables["cell"], meta.tables["variant_run"]
    sweep_ids = bind.execute(sa.select(cell.c.sweep_id).distinct()).scalars().all()
    for sweep_id in sweep_ids:
        run_ids = (
            bind.execute(
                sa.select(run.c.id)
                .join(cell, cell.c.id == run.c.cell_row_id)
                .where(cell.c.sweep_id == sweep_id)
                .order_by(run.c.id)
            )
            .scalars()
            .all()
        )
        for chunk in _in_chunks(run_ids, _RUNS):
            _move_runs(bind, meta.tables, sweep_id, chunk)


def _move_runs(bind: sa.Connection, tables: Any, sweep_id: int, run_ids: Sequence[int]) -> None:
    from farm.records import RequestRecord, SpecCounters

    req, text = tables["request_record"], tables["request_text"]
    requests: dict[int, list[RequestRecord]] = defaultdict(list)
    # Prompt id, then saved (id) order: what load_sweep read at 0007. The sort is
    # Python's, as at save time, whatever the database's collation.
    rows = bind.execute(
        sa.select(req).where(req.c.variant_run_id.in_(run_ids)).order_by(req.c.id)
    ).mappings()
    for r in sorted(rows, key=lambda r: r["prompt_id"]):
        c = r["counters"]
        requests[r["variant_run_id"]].append(
            RequestRecord(
                prompt_id=r["prompt_id"],
                output_text=r["output_text"],
                completion_tokens=r["completion_tokens"],
                finish_reason=r["finish_reason"],
                latency_s=r["latency_s"],
                correct=r["correct"],
                error=r["error"],
                counters=None
                if not c
                else SpecCounters(
                    drafts=c.get("drafts", 0),
                    draft_tokens=c.get("draft_tokens", 0),
                    accepted=c.get("accepted", 0),
                    accepted_per_pos=tuple(c.get("accepted_per_pos") or ()),
                ),
            )
        )
    by_digest = {
        _digest(r.output_text): r.output_text
        for reqs in requests.values()
        for r in reqs
        if r.output_text is not None
    }
    text_ids: dict[str, int] = {}
    for digests in _in_chunks(list(by_digest), _IDS):
        bind.execute(
            _insert(bind)(text)
            .values([{"digest": d, "output_text": by_digest[d]} for d in digests])
            .on_conflict_do_nothing()
        )
        found = sa.select(text.c.digest, text.c.id).where(text.c.digest.in_(digests))
        text_ids.update((by_digest[d], i) for d, i in bind.execute(found))
    packed = [
        {"variant_run_id": run_id, **_pack(reqs, text_ids)} for run_id, reqs in requests.items()
    ]
    if packed:
        bind.execute(_insert_numbers(bind, tables["request_numbers"]), packed)
    summaries = _summaries(bind, tables["metric"], sweep_id, run_ids, requests)
    bind.execute(tables["variant_summary"].insert(), summaries)


def _summaries(
    bind: sa.Connection,
    metric: sa.Table,
    sweep_id: int,
    run_ids: Sequence[int],
    requests: "dict[int, list[RequestRecord]]",
) -> list[dict[str, Any]]:
    from farm.analysis.history import al_interval

    scalars: dict[int, dict[str, int]] = defaultdict(dict)
    per_pos: dict[int, dict[int, int]] = defaultdict(dict)
    for run_id, name, pos, value in bind.execute(
        sa.select(metric.c.variant_run_id, metric.c.name, metric.c.position, metric.c.value).where(
            metric.c.variant_run_id.in_(run_ids)
        )
    ):
        if pos is None:
            scalars[run_id][name] = value
        elif name == "accepted_per_pos":
            per_pos[run_id][pos] = value
    rows = []
    for run_id in run_ids:
        reqs, positions = requests[run_id], per_pos[run_id]
        ok = [r for r in reqs if r.error is None]
        scored = [r for r in ok if r.correct is not None]
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
    return rows


def _restore_requests(bind: sa.Connection) -> None:
    """request_numbers back into 0007's request_record rows, in the order they read."""
    meta = sa.MetaData()
    req = sa.Table("request_record", meta, autoload_with=bind)
    numbers = sa.Table("request_numbers", meta, autoload_with=bind)
    text = sa.Table("request_text", meta, autoload_with=bind)
    last = None
    while True:
        page = sa.select(numbers).order_by(numbers.c.variant_run_id).limit(_RUNS)
        if last is not None:
            page = page.where(numbers.c.variant_run_id > last)
        packed = bind.execute(page).mappings().all()
        if not packed:
            return
        last = packed[-1]["variant_run_id"]
        wanted = sorted({i for p in packed for i in p["text_ids"] or () if i is not None})
        texts: dict[int, str] = {}
        for ids in _in_chunks(wanted, _IDS):
            found = sa.select(text.c.id, text.c.output_text).where(text.c.id.in_(ids))
            texts.update((i, t) for i, t in bind.execute(found))
        rows = [row for p in packed for row in _unpacked_rows(p, texts)]
        if rows:
            bind.execute(req.insert(), rows)


def _unpacked_rows(packed: Any, texts: dict[int, str]) -> Iterator[dict[str, Any]]:
    count = len(packed["prompt_ids"])
    columns = {name: packed[name] or [None] * count for name in _PACKED if name != "errors"}
    errors = dict(packed["errors"] or ())
    for i in range(count):
        text_id, drafts = columns["text_ids"][i], columns["drafts"][i]
        yield {
            "variant_run_id": packed["variant_run_id"],
            "prompt_id": columns["prompt_ids"][i],
            # 0007 has no NULL text: a pruned request reads back as "".
            "output_text": "" if text_id is None else texts.get(text_id, ""),
            "completion_tokens": columns["completion_tokens"][i],
            "finish_reason": columns["finish_reasons"][i],
            "latency_s": columns["latencies_s"][i],
            "correct": columns["correct"][i],
            "error": errors.get(i),
            "counters": None
            if drafts is None
            else {
                "drafts": drafts,
                "draft_tokens": columns["draft_tokens"][i],
                "accepted": columns["accepted"][i],
                "accepted_per_pos": list(columns["accepted_per_pos"][i] or ()),
            },
        }

"""Request rows, their text and the per-variant summaries: written with a cell's
variants, read back by ``load_sweep`` and by history.

A request's numbers live in ``request_record`` (narrow columns), its output text in
``request_text`` (content-addressed, shared by every request that produced it, dropped
by ``farm db prune``), and each variant's figures in ``variant_summary``, so history
over many sweeps (:func:`history_series`) is one query that reads no request row.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session

from farm.comparable import ComparableKey
from farm.plan import ServerCell
from farm.records import RequestRecord, SpecCounters, VariantResult

if TYPE_CHECKING:
    from farm.analysis.history import HistoryPoint

from farm.store.tables import (
    CellRow,
    RequestRow,
    RequestTextRow,
    SweepRow,
    VariantRunRow,
    VariantSummaryRow,
    _Table,
)

__all__ = [
    "delete_requests",
    "history_series",
    "insert_requests",
    "read_requests",
    "server_cell",
    "text_digest",
]

# Rows per statement: SQLite before 3.32 allows 999 bound parameters.
_BATCH = 400


def _table(row_type: type[_Table]) -> sa.Table:
    return cast(sa.Table, row_type.__table__)  # type: ignore[attr-defined]


def text_digest(text: str) -> bytes:
    """The key of ``text`` in ``request_text``: the first 16 bytes of its UTF-8 SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]


def server_cell(
    family: str,
    axes: dict[str, Any] | None,
    planned_graph_mode: str,
    remaps: list[str],
    variants: list[dict[str, Any]],
) -> ServerCell:
    """The planned cell of a ``cell`` row's columns (variants without their stored keys)."""
    return ServerCell.model_validate(
        {
            "family": family,
            "axes": axes,
            "planned_graph_mode": planned_graph_mode,
            "remaps": tuple(remaps),
            "variants": tuple(
                {k: v for k, v in variant.items() if k != "comparable_key"} for variant in variants
            ),
        }
    )


def _insert(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def _text_ids(session: Session, texts: Iterable[str]) -> dict[str, int]:
    """The ``request_text`` id of each text, inserting the texts not stored yet.

    Insert-or-ignore then read back: a concurrent save of the same text (another cell
    of the same night) cannot make either fail.
    """
    t = _table(RequestTextRow)
    conn = session.connection()
    by_digest = {text_digest(text): text for text in texts}
    digests = list(by_digest)
    ids: dict[bytes, int] = {}
    for i in range(0, len(digests), _BATCH):
        chunk = digests[i : i + _BATCH]
        found = sa.select(t.c.digest, t.c.id).where(t.c.digest.in_(chunk))
        ids.update(tuple(r) for r in conn.execute(found))
        missing = [{"digest": d, "output_text": by_digest[d]} for d in chunk if d not in ids]
        if missing:
            conn.execute(_insert(session)(t).values(missing).on_conflict_do_nothing())
            ids.update(tuple(r) for r in conn.execute(found))
    return {by_digest[d]: n for d, n in ids.items()}


def insert_requests(
    session: Session, sweep_id: int, runs: Sequence[tuple[int, VariantResult]]
) -> None:
    """Insert the requests, texts and summary of each ``(variant_run id, variant)``."""
    texts = _text_ids(
        session,
        {r.output_text for _, v in runs for r in v.requests if r.output_text is not None},
    )
    requests: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for run_id, variant in runs:
        requests.extend(
            _request_values(run_id, r, None if r.output_text is None else texts[r.output_text])
            for r in variant.requests
        )
        summaries.append(_summary_values(run_id, sweep_id, variant))
    # Bulk inserts (executemany): a variant carries hundreds of requests.
    conn = session.connection()
    if requests:
        conn.execute(sa.insert(_table(RequestRow)), requests)
    if summaries:
        conn.execute(sa.insert(_table(VariantSummaryRow)), summaries)


def _request_values(run_id: int, r: RequestRecord, text_id: int | None) -> dict[str, Any]:
    c = r.counters
    return {
        "variant_run_id": run_id,
        "prompt_id": r.prompt_id,
        "text_id": text_id,
        "completion_tokens": r.completion_tokens,
        "finish_reason": r.finish_reason,
        "latency_s": r.latency_s,
        "correct": r.correct,
        "error": r.error,
        "drafts": c.drafts if c else None,
        "draft_tokens": c.draft_tokens if c else None,
        "accepted": c.accepted if c else None,
        "accepted_per_pos": list(c.accepted_per_pos) if c else None,
    }


def _summary_values(run_id: int, sweep_id: int, v: VariantResult) -> dict[str, Any]:
    ok = [r for r in v.requests if r.error is None]
    scored = [r for r in ok if r.correct is not None]
    # The order load_sweep reads them in (prompt id, then as saved): the bootstrap
    # draws by row, so the interval matches one computed from a loaded sweep.
    # numpy is paid only by writes and history reads, never by `farm sweeps`.
    from farm.analysis.history import al_interval

    low, high = al_interval(sorted(v.requests, key=lambda r: r.prompt_id), sweep_id)
    return {
        "variant_run_id": run_id,
        "requests": len(v.requests),
        "failed_requests": len(v.requests) - len(ok),
        "scored": len(scored),
        "correct": sum(bool(r.correct) for r in scored),
        "output_tokens": sum(r.completion_tokens for r in ok),
        "drafts": v.counters.drafts,
        "draft_tokens": v.counters.draft_tokens,
        "accepted": v.counters.accepted,
        "accepted_per_pos": list(v.counters.accepted_per_pos),
        "al_low": low,
        "al_high": high,
    }


def delete_requests(session: Session, runs: Any) -> None:
    """Delete the requests and summaries of the variant runs selected by ``runs``.

    Their texts stay (other requests may share them); ``farm db prune`` removes texts
    nobody uses.
    """
    # Explicit deletes instead of ON DELETE CASCADE, which SQLite honours only when
    # the connection enabled foreign keys.
    for row_type in (RequestRow, VariantSummaryRow):
        table = _table(row_type)
        session.connection().execute(sa.delete(table).where(table.c.variant_run_id.in_(runs)))


def read_requests(session: Session, sweep_id: int) -> dict[int, list[RequestRecord]]:
    """Every request of the sweep with its text (None once pruned), by variant run id,
    each run's in prompt id order. Reads columns, not ORM rows: a sweep has thousands."""
    r, t = _table(RequestRow), _table(RequestTextRow)
    v, c = _table(VariantRunRow), _table(CellRow)
    query = (
        sa.select(
            r.c.variant_run_id,
            r.c.prompt_id,
            t.c.output_text,
            r.c.completion_tokens,
            r.c.finish_reason,
            r.c.latency_s,
            r.c.correct,
            r.c.error,
            r.c.drafts,
            r.c.draft_tokens,
            r.c.accepted,
            r.c.accepted_per_pos,
        )
        .select_from(r)
        .join(v, v.c.id == r.c.variant_run_id)
        .join(c, c.c.id == v.c.cell_row_id)
        .outerjoin(t, t.c.id == r.c.text_id)
        .where(c.c.sweep_id == sweep_id)
        .order_by(r.c.prompt_id, r.c.id)
    )
    out: dict[int, list[RequestRecord]] = defaultdict(list)
    for row in session.connection().execute(query):
        (run_id, prompt_id, text, tokens, finish, latency, correct, error, *counters) = row
        drafts, draft_tokens, accepted, per_pos = counters
        out[run_id].append(
            RequestRecord(
                prompt_id=prompt_id,
                output_text=text,
                completion_tokens=tokens,
                finish_reason=finish,
                latency_s=latency,
                correct=correct,
                error=error,
                counters=None
                if drafts is None
                else SpecCounters(
                    drafts=drafts,
                    draft_tokens=draft_tokens,
                    accepted=accepted,
                    accepted_per_pos=tuple(per_pos or ()),
                ),
            )
        )
    return out


def history_series(
    session: Session, sweep_ids: Sequence[int]
) -> dict[ComparableKey, tuple[HistoryPoint, ...]]:
    """Per-key AL series over the stored sweeps ``sweep_ids``, from their variant
    summaries: what ``series_from_sweeps`` gives for the loaded sweeps (default
    seed and resamples), in one query that reads no request."""
    from farm.analysis import history

    s, c = _table(SweepRow), _table(CellRow)
    v, m = _table(VariantRunRow), _table(VariantSummaryRow)
    query = (
        sa.select(
            s.c.id,
            s.c.started_at,
            c.c.id,
            c.c.status,
            c.c.family,
            c.c.axes,
            c.c.planned_graph_mode,
            c.c.remaps,
            c.c.variants,
            v.c.axes,
            m.c.drafts,
            m.c.accepted,
            m.c.al_low,
            m.c.al_high,
        )
        .select_from(m)
        .join(v, v.c.id == m.c.variant_run_id)
        .join(c, c.c.id == v.c.cell_row_id)
        .join(s, s.c.id == c.c.sweep_id)
        .where(s.c.id.in_(list(sweep_ids)))
    )
    cells: dict[int, ServerCell] = {}
    figures = []
    for row in session.connection().execute(query):
        (sweep_id, started, cell_row_id, status, *cell_columns) = row[:9]
        run_axes, drafts, accepted, low, high = row[9:]
        if cell_row_id not in cells:
            cells[cell_row_id] = server_cell(*cell_columns)
        cell = cells[cell_row_id]
        figures.append(
            history.VariantFigures(
                sweep_id=sweep_id,
                timestamp=started,
                key=cell.variant_key(run_axes),
                cell_status=status,
                mtp_depth=cell.mtp_depth,
                mean_acceptance_length=SpecCounters(
                    drafts=drafts, accepted=accepted
                ).mean_acceptance_length,
                low=low,
                high=high,
            )
        )
    return history.series_from_figures(figures)

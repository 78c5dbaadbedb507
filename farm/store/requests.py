"""Request numbers, their text and the per-variant summaries: written with a cell's
variants, read back by ``load_sweep`` and by history.

A variant run's request numbers are one ``request_numbers`` row of JSON lists (see
:class:`~farm.store.tables.RequestNumbersRow` for the layout), its requests' output
texts live in ``request_text`` (content-addressed, shared by every request that
produced it, dropped by ``farm db prune``), and each variant's figures in
``variant_summary``, so history over many sweeps (:func:`history_series`) is one query
that reads no request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session

from farm.comparable import ComparableKey
from farm.errors import StoreDamagedError
from farm.plan import ServerCell
from farm.records import RequestRecord, SpecCounters, VariantResult
from farm.store.columns import read_column, reading_row

if TYPE_CHECKING:
    from farm.analysis.history import HistoryPoint

from farm.store.tables import (
    BuildRow,
    CellRow,
    RequestNumbersRow,
    RequestTextRow,
    SweepBuildRow,
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

# Rows (or ids) per statement: SQLite before 3.32 allows 999 bound parameters.
_BATCH = 400

# The packed columns of request_numbers. Every one holds a JSON list with one entry per
# request, except ``errors`` (sparse); the optional ones are NULL when every entry
# would be None.
PACKED_COLUMNS = (
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
    "categories",
)
_REQUIRED = frozenset({"prompt_ids", "completion_tokens", "latencies_s"})
_COUNTERS = ("drafts", "draft_tokens", "accepted", "accepted_per_pos")
# RequestRecord field -> the column it is packed in (for errors that name the column).
_FIELD_COLUMNS = {
    "prompt_id": "prompt_ids",
    "output_text": "text_ids",
    "completion_tokens": "completion_tokens",
    "finish_reason": "finish_reasons",
    "latency_s": "latencies_s",
    "correct": "correct",
    "error": "errors",
    "category": "categories",
}
_KINDS = {"float": "a number", "int": "a whole number", "bool": "a boolean", "string": "text"}


def _table(row_type: type[_Table]) -> sa.Table:
    return cast(sa.Table, row_type.__table__)  # type: ignore[attr-defined]


def text_digest(text: str) -> bytes:
    """The key of ``text`` in ``request_text``: the first 16 bytes of its UTF-8 SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]


def server_cell(
    family: str,
    axes: object,
    planned_graph_mode: str,
    remaps: object,
    variants: object,
    *,
    row: object,
) -> ServerCell:
    """The planned cell of ``cell`` row ``row``'s columns (variants without their
    stored keys). Raises StoreDamagedError naming the column that does not fit."""
    at: dict[str, Any] = {"table": "cell", "row": row}
    axis_values = None if axes is None else read_column(dict[str, Any], axes, column="axes", **at)
    planned = read_column(tuple[dict[str, Any], ...], variants, column="variants", **at)
    with reading_row(
        "cell", row, fields={"remaps": "remaps", "variants": "variants"}, default="axes"
    ):
        return ServerCell.model_validate(
            {
                "family": family,
                "axes": axis_values,
                "planned_graph_mode": planned_graph_mode,
                "remaps": read_column(tuple[str, ...], remaps, column="remaps", **at),
                "variants": tuple(
                    {k: v for k, v in variant.items() if k != "comparable_key"}
                    for variant in planned
                ),
            }
        )


def _insert(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def _batches(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), _BATCH):
        yield items[i : i + _BATCH]


def _text_ids(session: Session, texts: Iterable[str]) -> dict[str, int]:
    """The ``request_text`` id of each text, inserting the texts not stored yet.

    Insert-or-ignore then read back: a concurrent save of the same text (another cell
    of the same night) cannot make either fail.
    """
    t = _table(RequestTextRow)
    conn = session.connection()
    if session.get_bind().dialect.name == "postgresql":
        # Nothing references a text by foreign key any more: this lock (which saves do
        # not conflict on) makes `farm db prune` wait for saves in flight, so it never
        # deletes a text a save has just found. SQLite has one writer at a time anyway.
        conn.execute(sa.text("LOCK TABLE request_text IN ROW EXCLUSIVE MODE"))
    by_digest = {text_digest(text): text for text in texts}
    ids: dict[bytes, int] = {}
    for chunk in _batches(list(by_digest)):
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
    """Insert the request numbers, texts and summary of each ``(variant_run id, variant)``."""
    texts = _text_ids(
        session,
        {r.output_text for _, v in runs for r in v.requests if r.output_text is not None},
    )
    numbers: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for run_id, variant in runs:
        # Stored in the order load_sweep reads them: prompt id, then as saved.
        requests = sorted(variant.requests, key=lambda r: r.prompt_id)
        if requests:
            numbers.append({"variant_run_id": run_id, **pack_requests(requests, texts)})
        summaries.append(_summary_values(run_id, sweep_id, variant, requests))
    conn = session.connection()
    if numbers:
        conn.execute(_insert_numbers(session), numbers)
    if summaries:
        conn.execute(sa.insert(_table(VariantSummaryRow)), summaries)


def _insert_numbers(session: Session) -> sa.Insert:
    """The insert of packed rows, each column's JSON text given as is: compact, with
    no space after separators (SQLAlchemy's JSON type would add one per entry)."""
    n = _table(RequestNumbersRow)
    on_postgresql = session.get_bind().dialect.name == "postgresql"

    def json_text(name: str) -> sa.ColumnElement[Any]:
        param = sa.bindparam(name, type_=sa.Text)
        # SQLite keeps JSON as text; a CAST there would apply NUMERIC affinity.
        return sa.cast(param, postgresql.JSON) if on_postgresql else param

    return sa.insert(n).values(
        variant_run_id=sa.bindparam("variant_run_id"),
        **{name: json_text(name) for name in PACKED_COLUMNS},
    )


def pack_requests(
    requests: Sequence[RequestRecord], text_ids: dict[str, int]
) -> dict[str, str | None]:
    """Each packed column's JSON text (None for SQL NULL) for ``requests``, in order."""
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
        "categories": [r.category for r in requests],
    }
    return {
        name: json.dumps(values, separators=(",", ":"))
        if name in _REQUIRED or any(v is not None for v in values)
        else None
        for name, values in columns.items()
    }


def _summary_values(
    run_id: int, sweep_id: int, v: VariantResult, requests: Sequence[RequestRecord]
) -> dict[str, Any]:
    ok = [r for r in requests if r.error is None]
    scored = [r for r in ok if r.correct is not None]
    # ``requests`` in the order load_sweep reads them: the bootstrap draws by row, so
    # the interval matches one computed from a loaded sweep.
    # numpy is paid only by writes and history reads, never by `farm sweeps`.
    from farm.analysis.history import al_interval

    low, high = al_interval(requests, sweep_id)
    return {
        "variant_run_id": run_id,
        "requests": len(requests),
        "failed_requests": len(requests) - len(ok),
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
    """Delete the request numbers and summaries of the variant runs selected by ``runs``.

    Their texts stay (other requests may share them); ``farm db prune`` removes texts
    nobody uses.
    """
    # Explicit deletes instead of ON DELETE CASCADE, which SQLite honours only when
    # the connection enabled foreign keys.
    for row_type in (RequestNumbersRow, VariantSummaryRow):
        table = _table(row_type)
        session.connection().execute(sa.delete(table).where(table.c.variant_run_id.in_(runs)))


class _Damage(ValueError):
    """A packed value this farm cannot read: the column (and entry) and what is wrong."""

    def __init__(self, column: str, problem: str) -> None:
        super().__init__(f"{column}: {problem}")


def read_requests(session: Session, sweep_id: int) -> dict[int, list[RequestRecord]]:
    """Every request of the sweep with its text (None once pruned), by variant run id,
    each run's in prompt id order.

    Raises StoreDamagedError naming the row, its sweep and the column when a packed
    row cannot be read (malformed JSON, lists of different lengths, a wrong type)."""
    n, v, c = _table(RequestNumbersRow), _table(VariantRunRow), _table(CellRow)
    # As text, decoded here: a malformed value is then reported with its row.
    query = (
        sa.select(n.c.variant_run_id, *(sa.cast(n.c[name], sa.Text) for name in PACKED_COLUMNS))
        .join(v, v.c.id == n.c.variant_run_id)
        .join(c, c.c.id == v.c.cell_row_id)
        .where(c.c.sweep_id == sweep_id)
    )
    conn = session.connection()
    runs: dict[int, dict[str, list[Any]]] = {}
    for run_id, *raw in conn.execute(query):
        try:
            runs[run_id] = unpack_requests(dict(zip(PACKED_COLUMNS, raw, strict=True)))
        except _Damage as damage:
            raise _damaged(session, run_id, sweep_id, damage) from None
    wanted = sorted({i for run in runs.values() for i in run["text_ids"] if i is not None})
    t = _table(RequestTextRow)
    texts: dict[int, str] = {}
    for chunk in _batches(wanted):
        query = sa.select(t.c.id, t.c.output_text).where(t.c.id.in_(chunk))
        texts.update(tuple(r) for r in conn.execute(query))
    out: dict[int, list[RequestRecord]] = {}
    for run_id, columns in runs.items():
        try:
            out[run_id] = _records(columns, texts)
        except _Damage as damage:
            raise _damaged(session, run_id, sweep_id, damage) from None
    return out


def unpack_requests(raw: dict[str, str | None]) -> dict[str, list[Any]]:
    """The packed columns' JSON texts as one list per column, an entry per request
    (NULL columns as Nones, ``errors`` spread out). Raises _Damage (a ValueError)."""
    columns: dict[str, list[Any]] = {}
    for name in PACKED_COLUMNS:
        text = raw[name]
        if text is None:
            if name in _REQUIRED:
                raise _Damage(name, "is NULL")
            continue
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise _Damage(name, f"{_shown(text)} is not valid JSON ({exc})") from None
        if not isinstance(value, list):
            raise _Damage(name, f"{_shown(text)} is not a list")
        columns[name] = value
    count = len(columns["prompt_ids"])
    errors: list[Any] = [None] * count
    for entry in columns.pop("errors", []):
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and type(entry[0]) is int
            and 0 <= entry[0] < count
        ):
            raise _Damage("errors", f"{_shown(entry)} is not [request index, message]")
        errors[entry[0]] = entry[1]
    columns["errors"] = errors
    for name in PACKED_COLUMNS:
        values = columns.setdefault(name, [None] * count)
        if len(values) != count:
            raise _Damage(name, f"{len(values)} entries for {count} requests (prompt_ids)")
    return columns


@cache
def _request_list() -> TypeAdapter[list[RequestRecord]]:
    # One validation call per variant: a RequestRecord(...) per request cost three
    # times as much (reading a sweep was mostly building its requests).
    return TypeAdapter(list[RequestRecord])


def _records(columns: dict[str, list[Any]], texts: dict[int, str]) -> list[RequestRecord]:
    counters = [
        None
        if drafts is None
        else {
            "drafts": drafts,
            "draft_tokens": tokens,
            "accepted": accepted,
            "accepted_per_pos": pos,
        }
        for drafts, tokens, accepted, pos in zip(*(columns[n] for n in _COUNTERS), strict=True)
    ]
    fields = {
        "prompt_id": columns["prompt_ids"],
        # A text deleted under a reader reads as pruned.
        "output_text": [None if i is None else texts.get(i) for i in columns["text_ids"]],
        "completion_tokens": columns["completion_tokens"],
        "finish_reason": columns["finish_reasons"],
        "latency_s": columns["latencies_s"],
        "correct": columns["correct"],
        "error": columns["errors"],
        "counters": counters,
        "category": columns["categories"],
    }
    requests = [dict(zip(fields, row, strict=True)) for row in zip(*fields.values(), strict=True)]
    try:
        return _request_list().validate_python(requests)
    except ValidationError as exc:
        error = exc.errors()[0]
        index, field, *inner = error["loc"]
        column = str(inner[0]) if field == "counters" and inner else _FIELD_COLUMNS[str(field)]
        kind = str(error["type"]).split("_")[0]
        what = f"is not {_KINDS[kind]}" if kind in _KINDS else str(error["msg"]).lower()
        raise _Damage(f"{column}[{index}]", f"{_shown(error['input'])} {what}") from None


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _damaged(session: Session, run_id: int, sweep_id: int, damage: _Damage) -> StoreDamagedError:
    url = session.get_bind().engine.url.render_as_string(hide_password=True)
    return StoreDamagedError(
        f"the store at {url} holds rows this farm cannot read (fix or delete them, or "
        f"restore a backup):\n  row request_numbers variant_run_id={run_id} of sweep "
        f"{sweep_id}: {damage}"
    )


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
    builds = _sweep_engine_builds(session, sweep_ids)
    figures = []
    for row in session.connection().execute(query):
        (sweep_id, started, cell_row_id, status, *cell_columns) = row[:9]
        run_axes, drafts, accepted, low, high = row[9:]
        if cell_row_id not in cells:
            cells[cell_row_id] = server_cell(*cell_columns, row=cell_row_id)
        cell = cells[cell_row_id]
        figures.append(
            history.HistoryFigures(
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
                builds=builds.get((sweep_id, cell.engine), ()),
            )
        )
    return history.series_from_figures(figures)


def _sweep_engine_builds(
    session: Session, sweep_ids: Sequence[int]
) -> dict[tuple[int, str], tuple[str, ...]]:
    """(sweep id, engine) -> the ids of that engine's builds the sweep ran, sorted (as
    :func:`farm.analysis.history.engine_builds` reads them off a loaded sweep)."""
    link, build = _table(SweepBuildRow), _table(BuildRow)
    query = (
        sa.select(link.c.sweep_id, build.c.engine, build.c.build_id)
        .join(build, build.c.build_id == link.c.build_id)
        .where(link.c.sweep_id.in_(list(sweep_ids)))
    )
    found: dict[tuple[int, str], set[str]] = {}
    for sweep_id, engine, build_id in session.connection().execute(query):
        found.setdefault((sweep_id, engine), set()).add(build_id)
    return {k: tuple(sorted(v)) for k, v in found.items()}

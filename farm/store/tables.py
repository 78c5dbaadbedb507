"""ORM tables of the farm store (SQLModel). Rows never leave ``farm.store``.

One row per sweep, build, planned cell, excluded cell, variant run and counter:
counters are stored in long format (one row per counter and draft position) so any
statistic can be recomputed with plain SQL, on SQLite and PostgreSQL alike. A variant
run's requests are one row of JSON lists (``request_numbers``), readable from SQL
with ``json_each`` / ``json_array_elements``.
The schema itself is created by the Alembic revisions in ``migrations/``; these
classes must match them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, get_args

import sqlalchemy as sa
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

from farm.records import CELL_STATUSES, SWEEP_STATUSES, ConfirmSide

__all__ = [
    "BisectStepRow",
    "BisectionRow",
    "BuildLocationRow",
    "BuildRow",
    "CellRow",
    "ConfirmationRunRow",
    "ExcludedCellRow",
    "KeySpreadRow",
    "MetricRow",
    "RequestNumbersRow",
    "RequestTextRow",
    "SweepBuildRow",
    "SweepRow",
    "UTCDateTime",
    "VariantRunRow",
    "VariantSummaryRow",
    "metadata",
]


# Named constraints let later Alembic batch migrations on SQLite drop or alter them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored
    as naive UTC and given ``tzinfo=UTC`` back on read. Naive input is refused: the
    store cannot know which zone it meant.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} given to the store; use UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _status_check(column: str, values: tuple[str, ...]) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({allowed})", name=column)


class _Table(SQLModel, registry=registry(metadata=metadata)):
    """Base of the store's tables: its own metadata, so no other SQLModel leaks in."""


class SweepRow(_Table, table=True):
    __tablename__ = "sweep"
    __table_args__ = (_status_check("status", SWEEP_STATUSES),)

    id: int | None = Field(default=None, primary_key=True)
    job: str = Field(index=True)
    job_yaml: str = Field(sa_type=sa.Text)
    started_at: datetime = Field(sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    status: str
    host: str
    farm_version: str
    # The lease of a running sweep: the driver (host:pid) and its last heartbeat.
    driver: str | None = None
    heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class BuildRow(_Table, table=True):
    """An engine environment; content-addressed, so shared by every sweep that uses it."""

    __tablename__ = "build"

    build_id: str = Field(primary_key=True)
    engine: str
    family: str
    package: str
    version: str
    pins: list[str] = Field(sa_type=sa.JSON)
    patches: list[str] = Field(sa_type=sa.JSON)
    python: str
    env_dir: str
    node: str | None = None
    source: str | None = None


class BuildLocationRow(_Table, table=True):
    """Where a build lives: one row per node (Ray node id) that holds it, and the path."""

    __tablename__ = "build_location"

    build_id: str = Field(foreign_key="build.build_id", primary_key=True, ondelete="CASCADE")
    node_id: str = Field(primary_key=True)
    host: str
    env_dir: str
    recorded_at: datetime = Field(sa_type=UTCDateTime)


class SweepBuildRow(_Table, table=True):
    __tablename__ = "sweep_build"

    sweep_id: int = Field(foreign_key="sweep.id", primary_key=True, ondelete="CASCADE")
    build_id: str = Field(
        foreign_key="build.build_id", primary_key=True, index=True, ondelete="CASCADE"
    )


class CellRow(_Table, table=True):
    """A planned server-level cell, updated in place with its outcome."""

    __tablename__ = "cell"
    __table_args__ = (
        sa.UniqueConstraint("sweep_id", "cell_id"),
        _status_check("status", CELL_STATUSES),
    )

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweep.id", ondelete="CASCADE")
    # Position in the plan, so a sweep reads back in the order it was planned.
    ordinal: int
    cell_id: str
    engine: str
    family: str
    model: str
    graph_mode: str
    planned_graph_mode: str
    mtp_depth: int
    sliding_window: str
    # Every server axis's value (farm.axes); the columns above copy the axes that
    # existed when the store was made, for SQL readers such as the dashboards.
    axes: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    remaps: list[str] = Field(sa_type=sa.JSON)
    variants: list[dict[str, Any]] = Field(sa_type=sa.JSON)
    # The server-level comparable key's fingerprint (farm.comparable).
    fingerprint: str = Field(index=True)
    status: str
    effective: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    # Copied out of ``effective`` because reports group by it.
    effective_graph_mode: str | None = None
    argv: list[str] = Field(default_factory=list, sa_type=sa.JSON)
    node: str | None = None
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    startup_s: float | None = None
    generation_s: float | None = None
    # NPUs the server held (0 on a CPU host; NULL before revision 0012).
    npus: int | None = None
    error: str | None = Field(default=None, sa_type=sa.Text)
    log_tail: str | None = Field(default=None, sa_type=sa.Text)
    log_path: str | None = None


class ExcludedCellRow(_Table, table=True):
    __tablename__ = "excluded_cell"

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweep.id", index=True, ondelete="CASCADE")
    ordinal: int
    axes: dict[str, Any] = Field(sa_type=sa.JSON)
    reason: str = Field(sa_type=sa.Text)


class VariantRunRow(_Table, table=True):
    """One request-level variant (thinking x workload) run against a cell's server."""

    __tablename__ = "variant_run"
    # One row per variant of a cell, however many drivers save it at once. A unique
    # index, not a constraint: SQLite adds it without recreating the table.
    __table_args__ = (
        sa.Index("uq_variant_run_cell_row_id_ordinal", "cell_row_id", "ordinal", unique=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    cell_row_id: int = Field(foreign_key="cell.id", index=True, ondelete="CASCADE")
    ordinal: int
    thinking: str
    workload: str
    axes: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    # The variant's comparable key (farm.comparable): fingerprint and readable label.
    comparable_key: str | None = Field(default=None, index=True)
    key_label: str | None = None
    concurrency: int
    elapsed_s: float
    # farm.records.SequentialRecord when the variant ran in looks; NULL otherwise.
    sequential: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON(none_as_null=True))


class MetricRow(_Table, table=True):
    """One speculative-decoding counter of a variant run; ``position`` for per-position ones."""

    __tablename__ = "metric"
    __table_args__ = (sa.UniqueConstraint("variant_run_id", "name", "position"),)

    id: int | None = Field(default=None, primary_key=True)
    # Indexed through the unique constraint, whose first column it is.
    variant_run_id: int = Field(foreign_key="variant_run.id", ondelete="CASCADE")
    name: str
    position: int | None = None
    value: int = Field(sa_type=sa.BigInteger)


class RequestTextRow(_Table, table=True):
    """A request's output text, stored once however many requests produced it.

    Content-addressed (``digest``: the first 16 bytes of its UTF-8 SHA-256): under
    greedy decoding a prompt gives the same text on every night and in every cell
    that agrees with speculation off, so most requests share a row. Text is kept
    apart from the request's numbers so ``farm db prune`` can drop it and history
    reads never touch it.
    """

    __tablename__ = "request_text"

    id: int | None = Field(default=None, primary_key=True)
    digest: bytes = Field(sa_type=sa.LargeBinary, unique=True)
    output_text: str = Field(sa_type=sa.Text)


def _optional_list() -> Any:
    """A packed column that is NULL when every entry would be None."""
    return Field(default=None, sa_type=sa.JSON(none_as_null=True))


class RequestNumbersRow(_Table, table=True):
    """The numbers of every request of one variant run, packed into one row.

    One JSON list per column, one entry per request, in the order ``load_sweep``
    reads them (prompt id, then as saved). A column whose entries would all be None
    is NULL: ``text_ids`` once ``farm db prune`` unlinked the texts, the counters of a
    variant without per-request counters, ``correct`` of an unscored one. ``errors``
    is sparse: ``[[request index, message], ...]``, NULL when none failed.

    Why one row, not one per request: a request row cost ~145 B on
    PostgreSQL, mostly row header and index entries; packed and compressed by TOAST
    a request costs ~45 B, and a variant is read whole anyway.
    """

    __tablename__ = "request_numbers"

    variant_run_id: int = Field(foreign_key="variant_run.id", primary_key=True, ondelete="CASCADE")
    prompt_ids: list[str] = Field(sa_type=sa.JSON)
    # request_text ids (None where a request has no text).
    text_ids: list[int | None] | None = _optional_list()
    completion_tokens: list[int] = Field(sa_type=sa.JSON)
    finish_reasons: list[str | None] | None = _optional_list()
    latencies_s: list[float] = Field(sa_type=sa.JSON)
    correct: list[bool | None] | None = _optional_list()
    errors: list[list[Any]] | None = _optional_list()
    # Per-request speculative counters; a request without them has None in each.
    drafts: list[int | None] | None = _optional_list()
    draft_tokens: list[int | None] | None = _optional_list()
    accepted: list[int | None] | None = _optional_list()
    accepted_per_pos: list[list[int] | None] | None = _optional_list()
    # The prompt set's category of each request (MT-Bench, SPEED-Bench).
    categories: list[str | None] | None = _optional_list()


class VariantSummaryRow(_Table, table=True):
    """Per-variant figures written with the variant, so history reads no request row.

    Counts over the variant's requests (``failed`` have an error; ``scored`` are the
    successful ones with a correctness verdict), its summed counters, and the
    request-level bootstrap interval of AL that history draws
    (:func:`farm.analysis.history.al_interval`; None without per-request counters).
    """

    __tablename__ = "variant_summary"

    variant_run_id: int = Field(foreign_key="variant_run.id", primary_key=True, ondelete="CASCADE")
    requests: int
    failed_requests: int
    scored: int
    correct: int
    output_tokens: int = Field(sa_type=sa.BigInteger)
    drafts: int = Field(sa_type=sa.BigInteger)
    draft_tokens: int = Field(sa_type=sa.BigInteger)
    accepted: int = Field(sa_type=sa.BigInteger)
    accepted_per_pos: list[int] = Field(sa_type=sa.JSON)
    al_low: float | None = None
    al_high: float | None = None


class VerdictRow(_Table, table=True):
    """The verdict of a nightly, A/A night or PR run on a sweep (``farm.results.verdict``);
    one per sweep and kind, so a rerun of the same night cannot store a second one."""

    __tablename__ = "verdict"
    __table_args__ = (
        sa.UniqueConstraint("sweep_id", "kind"),
        _status_check("kind", ("nightly", "pr", "aa")),
        _status_check("outcome", ("clean", "regression", "failed_cells")),
    )

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweep.id", ondelete="CASCADE")
    kind: str
    outcome: str
    findings: list[dict[str, Any]] = Field(sa_type=sa.JSON)
    notes: list[str] = Field(default_factory=list, sa_type=sa.JSON)
    comparisons: int = 0
    baseline_sweep_ids: list[int] = Field(default_factory=list, sa_type=sa.JSON)
    reused_cells: list[dict[str, Any]] = Field(default_factory=list, sa_type=sa.JSON)
    history: int = 0
    engine: str | None = None
    pr_number: int | None = Field(default=None, index=True)
    head_sha: str | None = None
    created_at: datetime = Field(sa_type=UTCDateTime)


class KeySpreadRow(_Table, table=True):
    """One key's night-to-night spread over a job's last nights, as computed when the
    verdict of night ``sweep_id`` was stored (:func:`farm.analysis.noise.noise_table`);
    one per job, key and sweep, so the spread can be plotted over the nights."""

    __tablename__ = "key_spread"
    __table_args__ = (sa.UniqueConstraint("job", "key_label", "sweep_id"),)

    id: int | None = Field(default=None, primary_key=True)
    job: str = Field(index=True)
    key_label: str
    key: dict[str, Any] = Field(sa_type=sa.JSON)  # the ComparableKey
    sweep_id: int = Field(foreign_key="sweep.id", index=True, ondelete="CASCADE")
    nights: int
    al_mean: float
    al_sd: float
    position_sd: list[float] = Field(sa_type=sa.JSON)
    accuracy_sd: float | None = None
    flip_rate: float | None = None
    aa_nights: int = 0
    aa_false_alarms: int = 0
    computed_at: datetime = Field(sa_type=UTCDateTime)


class ConfirmationRunRow(_Table, table=True):
    """One rerun of a suspicious cell in its night (:class:`farm.records.ConfirmationRun`):
    the cell, the side (``candidate``: the night's build; ``reference``: the last good
    night's build), the run's index on that side and the build that served it; the
    run's result as JSON (read back whole with the sweep, never queried by field)."""

    __tablename__ = "confirmation_run"
    __table_args__ = (
        sa.UniqueConstraint("sweep_id", "cell_id", "side", "run"),
        _status_check("side", get_args(ConfirmSide)),
    )

    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweep.id", index=True, ondelete="CASCADE")
    cell_id: str
    side: str
    run: int
    build_id: str
    status: str
    device_s: float
    result: dict[str, Any] = Field(sa_type=sa.JSON)
    created_at: datetime = Field(sa_type=UTCDateTime)


class BisectionRow(_Table, table=True):
    """A `farm bisect` search (``farm.workflows.bisect``): the job, engine and ends,
    the candidate commits, the regressed cells each step runs, and where it stands.
    ``key`` hashes job, engine, both end commits and the planned cells, so a second
    run of the same bisection finds this one and reuses its steps."""

    __tablename__ = "bisection"
    __table_args__ = (
        sa.UniqueConstraint("key"),
        _status_check("status", ("running", "found", "inconclusive")),
    )

    id: int | None = Field(default=None, primary_key=True)
    key: str
    job: str = Field(index=True)
    engine: str
    overlay: str | None = None  # the overlay package bisected; None: the engine's own source
    repo: str
    good_commit: str
    bad_commit: str
    commits: list[dict[str, Any]] = Field(sa_type=sa.JSON)  # oldest first, good .. bad
    planned_cells: list[str] = Field(sa_type=sa.JSON)
    regressed: dict[str, str] = Field(sa_type=sa.JSON)  # variant key -> cell id
    endpoints: dict[str, Any] = Field(sa_type=sa.JSON)  # per end: build, sweeps, figures
    status: str
    first_bad: int | None = None  # index into commits
    last_good: int | None = None
    reason: str = Field(default="", sa_type=sa.Text)
    builds_run: int = 0
    cells_run: int = 0
    wall_s: float = 0.0
    created_at: datetime = Field(sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class BisectStepRow(_Table, table=True):
    """One finished step of a bisection: the commit, its build and sweep, the verdict
    and the figures of each regressed variant. A step is stored when it finishes and
    never run again; its sweep may be pruned later, its figures stay."""

    __tablename__ = "bisect_step"
    __table_args__ = (
        sa.UniqueConstraint("bisection_id", "position"),
        _status_check("verdict", ("good", "bad", "skip")),
    )

    id: int | None = Field(default=None, primary_key=True)
    bisection_id: int = Field(foreign_key="bisection.id", index=True, ondelete="CASCADE")
    position: int  # index into the bisection's commits
    commit: str
    build_id: str | None = None
    sweep_id: int | None = None
    verdict: str
    figures: list[dict[str, Any]] = Field(sa_type=sa.JSON)
    reason: str = Field(default="", sa_type=sa.Text)
    engine_s: float = 0.0  # engine start-up + generation of its cells
    created_at: datetime = Field(sa_type=UTCDateTime)

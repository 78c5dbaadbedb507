"""Typed results handed from the runner to the store and the analysis.

These are the only shapes that cross stage boundaries after a cell has run: the
runner produces them (inside a Ray worker), the driver stores them, the analysis
reads them back. They are frozen so a result cannot change after it was measured.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, model_validator

from farm.axes import AxisValue, OnOff, fold_axis_values
from farm.plan import ExcludedCell, ServerCell

__all__ = [
    "CELL_OUTCOMES",
    "CELL_STATUSES",
    "SWEEP_STATUSES",
    "BuildInfo",
    "CellResult",
    "CellStatus",
    "EffectiveConfig",
    "RequestRecord",
    "SpecCounters",
    "StoredCell",
    "SweepRecord",
    "SweepStatus",
    "VariantResult",
]

# Status words, defined here only. A planned cell has no outcome yet; a sweep is
# running until it ends ok (every cell ran), failed, or interrupted.
CellStatus = Literal["ok", "failed", "build_failed"]
CELL_OUTCOMES: tuple[CellStatus, ...] = get_args(CellStatus)
CELL_STATUSES: tuple[str, ...] = ("planned", *CELL_OUTCOMES)
SweepStatus = Literal["running", "ok", "failed", "interrupted"]
SWEEP_STATUSES: tuple[SweepStatus, ...] = get_args(SweepStatus)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpecCounters(_Frozen):
    """Speculative-decoding counters over one variant (deltas between two scrapes).

    ``accepted_per_pos[i]`` counts draft tokens accepted at draft position ``i``.
    All zero when speculation is off.
    """

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / draft tokens; comparable only within one MTP depth."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens emitted per verify step."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        if not self.drafts:
            return ()
        return tuple(a / self.drafts for a in self.accepted_per_pos)


class RequestRecord(_Frozen):
    """One request of a variant: what was asked, what came back, how long it took."""

    prompt_id: str
    # None once ``farm db prune`` dropped it: greedy agreement is unknown then.
    output_text: str | None
    completion_tokens: int
    finish_reason: str | None
    latency_s: float
    correct: bool | None = None
    error: str | None = None
    counters: SpecCounters | None = None


class VariantResult(_Frozen):
    """One request-level variant (a value of each request axis) run against a cell's
    server; ``axes`` as in :class:`farm.plan.Variant`."""

    axes: dict[str, AxisValue]
    counters: SpecCounters
    requests: tuple[RequestRecord, ...]
    elapsed_s: float
    concurrency: int

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: Any) -> Any:
        return fold_axis_values(data, "request")

    @property
    def thinking(self) -> OnOff:
        return cast(OnOff, self.axes["thinking"])

    @property
    def workload(self) -> str:
        return str(self.axes["workload"])


class EffectiveConfig(_Frozen):
    """What the engine really did, read back after start-up (not what was asked)."""

    engine_version: str | None = None
    graph_mode: str | None = None
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    drafter_eager: bool | None = None
    sliding_window: int | None = None
    max_model_len: int | None = None
    notes: tuple[str, ...] = ()


class CellResult(_Frozen):
    """The outcome of one server-level cell: its variants, or why it failed."""

    cell_id: str
    status: CellStatus
    started_at: datetime
    finished_at: datetime
    node: str | None = None
    argv: tuple[str, ...] = ()
    effective: EffectiveConfig | None = None
    variants: tuple[VariantResult, ...] = ()
    startup_s: float | None = None
    generation_s: float | None = None
    error: str | None = None
    log_tail: str | None = None
    log_path: str | None = None

    @classmethod
    def never_ran(
        cls, cell_id: str, error: str, status: CellStatus = "failed", node: str | None = None
    ) -> CellResult:
        """The result of a cell that did not get to run (its build failed, its task
        was lost): no variants, started and finished now."""
        now = datetime.now(UTC)
        return cls(
            cell_id=cell_id, status=status, started_at=now, finished_at=now, node=node, error=error
        )


class BuildInfo(_Frozen):
    """A ready engine environment: where its interpreter is and what went into it."""

    build_id: str
    engine: str
    family: str
    package: str
    version: str
    pins: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()
    python: str
    env_dir: str
    node: str | None = None
    source: str | None = None  # content identity when not a PyPI release (wheel, tree, git)


class StoredCell(_Frozen):
    """A planned cell as stored, with its result when it has one."""

    cell: ServerCell
    result: CellResult | None = None


class SweepRecord(_Frozen):
    """A sweep read back from the store: everything a report or analysis needs."""

    sweep_id: int
    job: str
    started_at: datetime
    finished_at: datetime | None = None
    status: SweepStatus
    cells: tuple[StoredCell, ...] = ()
    excluded: tuple[ExcludedCell, ...] = ()
    builds: tuple[BuildInfo, ...] = ()

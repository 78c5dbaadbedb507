"""Typed results handed from the runner to the store and the analysis.

These are the only shapes that cross stage boundaries after a cell has run: the
runner produces them (inside a Ray worker), the driver stores them, the analysis
reads them back. They are frozen so a result cannot change after it was measured.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast, get_args

from pydantic import model_validator

from farm.axes import AxisValue, OnOff, fold_axis_values
from farm.bounds import Seconds, StoredInt
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.inert import UntrustedText
from farm.plan import ExcludedCell, ServerCell

__all__ = [
    "CELL_OUTCOMES",
    "CELL_STATUSES",
    "SWEEP_STATUSES",
    "BuildInfo",
    "CellResult",
    "CellStatus",
    "ConfirmSide",
    "ConfirmationRun",
    "Decision",
    "EffectiveConfig",
    "LookDecision",
    "LookStatistics",
    "RequestRecord",
    "SequentialRecord",
    "SpecCounters",
    "StoredCell",
    "SweepRecord",
    "SweepStatus",
    "VariantResult",
    "counted",
    "counters_digest",
    "summed_counters",
]

# Status words, defined here only. A planned cell has no outcome yet; a sweep is
# running until it ends ok (every cell ran), failed, or interrupted.
CellStatus = Literal["ok", "failed", "build_failed"]
CELL_OUTCOMES: tuple[CellStatus, ...] = get_args(CellStatus)
CELL_STATUSES: tuple[str, ...] = ("planned", *CELL_OUTCOMES)
SweepStatus = Literal["running", "ok", "failed", "interrupted"]
SWEEP_STATUSES: tuple[SweepStatus, ...] = get_args(SweepStatus)


class SpecCounters(Frozen):
    """Speculative-decoding counters over one variant (deltas between two scrapes).

    ``accepted_per_pos[i]`` counts draft tokens accepted at draft position ``i``.
    All zero when speculation is off. The same scrapes give what the speculation ran
    under, where the engine exports it (0 otherwise, and in per-request counters):
    ``engine_steps``, the engine's forward passes, and the prefix cache's
    ``prefix_queries`` and ``prefix_hits`` (prompt tokens looked up, and found).
    """

    drafts: StoredInt = 0
    draft_tokens: StoredInt = 0
    accepted: StoredInt = 0
    accepted_per_pos: tuple[StoredInt, ...] = ()
    engine_steps: StoredInt = 0
    prefix_queries: StoredInt = 0
    prefix_hits: StoredInt = 0

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / draft tokens; comparable only within one MTP depth."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens emitted per verify step."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    def counts(self, positions: int = 0) -> dict[str, int]:
        """Every counter by name, ``accepted_per_pos[i]`` for each position (at least
        ``positions`` of them, 0 past the ones held)."""
        scalars = {n: v for n, v in self if isinstance(v, int)}
        width = max(positions, len(self.accepted_per_pos))
        pos = (*self.accepted_per_pos, *(0,) * (width - len(self.accepted_per_pos)))
        return scalars | {f"accepted_per_pos[{i}]": v for i, v in enumerate(pos)}

    @property
    def verifies_per_step(self) -> float | None:
        """Requests verifying drafts in one engine step, on average: about 1 when the
        variant's requests never shared a decode batch (whatever its concurrency), up
        to the concurrency when they always did. A batch-dependent bug needs > 1."""
        return self.drafts / self.engine_steps if self.drafts and self.engine_steps else None

    @property
    def prefix_hit_rate(self) -> float | None:
        """Share of looked-up prompt tokens the prefix cache had."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        if not self.drafts:
            return ()
        return tuple(a / self.drafts for a in self.accepted_per_pos)


class RequestRecord(Frozen):
    """One request of a variant: what was asked, what came back, how long it took."""

    prompt_id: str
    # None once ``farm db prune`` dropped it: greedy agreement is unknown then.
    output_text: str | None
    completion_tokens: StoredInt
    finish_reason: str | None
    latency_s: Seconds
    correct: bool | None = None
    error: UntrustedText | None = None  # an engine's or harness's: credentials masked
    counters: SpecCounters | None = None
    # The prompt set's own category (MT-Bench, SPEED-Bench), for acceptance by category.
    category: str | None = None


# What a sequential look decided (farm.analysis.sequential).
Decision = Literal["regress", "pass", "continue"]


class LookStatistics(Frozen):
    """The paired comparison over the first ``prompts`` prompts (delta-method SE)."""

    prompts: int
    reference_al: float
    candidate_al: float
    difference: float  # candidate - reference AL
    se: float
    min_effect: float


class LookDecision(Frozen):
    """What look ``look`` (0-based) decided, with its boundaries in AL-difference units:
    regress when ``difference <= regress_at``, pass when ``difference >= pass_at``."""

    look: int
    prompts: int
    decision: Decision
    statistics: LookStatistics
    regress_at: float
    pass_at: float


class LookCalibration(Frozen):
    """A key's AL rule calibrated from its nights (:mod:`farm.analysis.noise`) as its
    sequential looks apply it: each look's difference taken against ``centre`` (the
    median AL of the key's baseline window) instead of the reference night's own AL
    (None: against that night), ``run_sd`` (the run-level sd times sqrt(1 + c)) added to
    every look's standard error, and a minimum effect of at least ``min_effect`` (k x
    ``run_sd``). ``rule``: how the threshold came about, as findings say it."""

    centre: float | None = None
    run_sd: float
    min_effect: float
    rule: str = ""


class SequentialRecord(Frozen):
    """The stored record of one sequential comparison, made by the runner as a
    variant's looks went (:mod:`farm.analysis.sequential`): the rule, each look, and
    the reference run it was paired with: that cell of ``reference_sweep_id``, whose
    per-request counters have digest ``reference_digest`` (:func:`counters_digest`)."""

    rule: str
    parameters: dict[str, float | int | str]
    decision: Decision
    prompts_used: int
    max_prompts: int
    planned_looks: tuple[int, ...]
    looks: tuple[LookDecision, ...]
    reference_sweep_id: int | None = None
    reference_cell_id: str | None = None
    reference_digest: str | None = None
    calibration: LookCalibration | None = None  # the key's calibrated rule, when it had one

    @property
    def stopped_early(self) -> bool:
        return self.decision != "continue" and self.prompts_used < self.max_prompts

    def describe(self) -> str:
        """One line, e.g. ``regress: decided after 64 of 200 prompts (look 4 of 13)``."""
        return (
            f"{self.decision}: decided after {self.prompts_used} of {self.max_prompts} "
            f"prompts (look {len(self.looks)} of {len(self.planned_looks)})"
        )


def counted(requests: Sequence[RequestRecord]) -> list[tuple[str, SpecCounters]]:
    """(prompt id, counters) of the requests that succeeded with counters, in order:
    what every acceptance statistic is computed from."""
    return [
        (r.prompt_id, r.counters) for r in requests if r.error is None and r.counters is not None
    ]


def summed_counters(counters: Sequence[SpecCounters]) -> SpecCounters:
    """The speculative counters of ``counters`` added up (per position too, a shorter
    per-position list counting 0 past its end); engine-wide ones (steps, prefix cache)
    are not per request and stay 0."""
    width = max((len(c.accepted_per_pos) for c in counters), default=0)
    return SpecCounters(
        drafts=sum(c.drafts for c in counters),
        draft_tokens=sum(c.draft_tokens for c in counters),
        accepted=sum(c.accepted for c in counters),
        accepted_per_pos=tuple(
            sum(c.accepted_per_pos[i] for c in counters if i < len(c.accepted_per_pos))
            for i in range(width)
        ),
    )


def counters_digest(requests: Sequence[RequestRecord]) -> str:
    """16 hex digits naming a run's per-request counters (:func:`counted`): what a
    sequential record was paired with, told apart from any other run however the
    baseline of a comparison was assembled."""
    kept = [(p, c.model_dump(mode="json")) for p, c in counted(requests)]
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


class VariantResult(Frozen):
    """One request-level variant (a value of each request axis) run against a cell's
    server; ``axes`` as in :class:`farm.plan.Variant`."""

    axes: dict[str, AxisValue]
    counters: SpecCounters
    requests: tuple[RequestRecord, ...]
    elapsed_s: Seconds
    concurrency: StoredInt
    # Run in looks against a reference (the workload's ``sequential``): what decided.
    sequential: SequentialRecord | None = None

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


class EffectiveConfig(Frozen):
    """What the engine really did, read back after start-up (not what was asked)."""

    engine_version: str | None = None
    graph_mode: str | None = None
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    drafter_eager: bool | None = None
    sliding_window: int | None = None
    max_model_len: int | None = None
    prefix_caching: bool | None = None
    # Linear-attention or mamba layers in the model's config.json (None: not read).
    hybrid: bool | None = None
    notes: tuple[str, ...] = ()


class CellResult(Frozen):
    """The outcome of one server-level cell: its variants, or why it failed."""

    cell_id: str
    status: CellStatus
    started_at: datetime
    finished_at: datetime
    node: str | None = None
    argv: tuple[str, ...] = ()
    effective: EffectiveConfig | None = None
    variants: tuple[VariantResult, ...] = ()
    startup_s: Seconds | None = None
    generation_s: Seconds | None = None
    npus: StoredInt | None = None  # accelerators the server held; 0 on a CPU host
    # From the engine, its harness or a remote service: credentials masked when built
    # (farm.inert.UntrustedText), so no report, alert or export can show them.
    error: UntrustedText | None = None
    log_tail: UntrustedText | None = None
    log_path: str | None = None

    @property
    def device_s(self) -> float:
        """What the cell cost: its server's start-up and generation time on each device
        it held (a CPU host, and a cell stored without its NPU count, as one)."""
        busy = (self.startup_s or 0.0) + (self.generation_s or 0.0)
        return busy * max(self.npus or 0, 1)

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


class BuildInfo(Frozen):
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


class StoredCell(Frozen):
    """A planned cell as stored, with its result when it has one."""

    cell: ServerCell
    result: CellResult | None = None


ConfirmSide = Literal["candidate", "reference"]


class ConfirmationRun(Frozen):
    """One rerun of a suspicious cell in its own night (:mod:`farm.analysis.confirm`):
    ``side`` candidate (the night's build) or reference (the last good night's build,
    rerun tonight beside it: a confirmation run of that build, never a cell of the
    night or a baseline), ``run`` its index on that side (from 1; the night's own cell
    is the candidate's run 0), ``build_id`` the build that served it."""

    cell_id: str
    side: ConfirmSide
    run: StoredInt
    build_id: str
    result: CellResult

    def al(self, axes: Mapping[str, AxisValue]) -> float | None:
        """The AL of variant ``axes`` in this rerun (None: it did not run ok there)."""
        if self.result.status != "ok":
            return None
        found = next((v for v in self.result.variants if v.axes == axes), None)
        return found.counters.mean_acceptance_length if found is not None else None


class SweepRecord(Frozen):
    """A sweep read back from the store: everything a report or analysis needs;
    ``confirmations`` the reruns of its suspicious cells, in the order they ran."""

    sweep_id: int
    job: str
    started_at: datetime
    finished_at: datetime | None = None
    status: SweepStatus
    cells: tuple[StoredCell, ...] = ()
    excluded: tuple[ExcludedCell, ...] = ()
    builds: tuple[BuildInfo, ...] = ()
    confirmations: tuple[ConfirmationRun, ...] = ()

    def cells_measuring(self, key: ComparableKey) -> tuple[str, ...]:
        """The cells that measured ``key`` (a history series names a key, not a cell)."""
        return tuple(
            stored.cell.cell_id
            for stored in self.cells
            if any(stored.cell.variant_key(v.axes) == key for v in stored.cell.variants)
        )

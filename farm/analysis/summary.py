"""Per-variant figures of a sweep: acceptance, greedy agreement, accuracy, speed."""

from __future__ import annotations

from collections.abc import Sequence

from farm.analysis.labels import label_mismatches
from farm.axes import REQUEST_AXES, AxisValue, variant_label
from farm.frozen import Frozen
from farm.records import (
    BuildInfo,
    RequestRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    VariantResult,
    summed_counters,
)

__all__ = [
    "CategoryAcceptance",
    "VariantSummary",
    "acceptance_by_category",
    "patched_bases",
    "summarize_sweep",
]


class CategoryAcceptance(Frozen):
    """A variant's acceptance over the requests of one prompt-set category (MT-Bench's
    writing, SPEED-Bench's coding, ...), from the requests' own counters."""

    category: str
    requests: int
    drafts: int
    mean_acceptance_length: float | None
    per_position: tuple[float, ...]


def acceptance_by_category(requests: Sequence[RequestRecord]) -> tuple[CategoryAcceptance, ...]:
    """Acceptance per category of the successful requests that carry a category and
    per-request counters, by category name; empty when none
    does (a farm-format prompt set, or an engine without per-request counters)."""
    by_category: dict[str, list[SpecCounters]] = {}
    for r in requests:
        if r.category is not None and r.counters is not None and r.error is None:
            by_category.setdefault(r.category, []).append(r.counters)
    sums = {name: (len(cs), summed_counters(cs)) for name, cs in by_category.items()}
    return tuple(
        CategoryAcceptance(
            category=name,
            requests=n,
            drafts=c.drafts,
            mean_acceptance_length=c.mean_acceptance_length,
            per_position=c.per_position_rate,
        )
        for name, (n, c) in sorted(sums.items())
    )


class VariantSummary(Frozen):
    """One row of the sweep matrix: a cell's variant with its figures."""

    cell_id: str
    # Every server axis as requested, and the request axes of the variant (absent for a
    # cell that ran no variant).
    axes: dict[str, AxisValue]
    effective_graph_mode: str | None
    status: str
    error: str | None = None
    requests: int = 0
    failed_requests: int = 0
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position: tuple[float, ...] = ()
    greedy_same: int | None = None
    greedy_compared: int | None = None
    accuracy: float | None = None
    output_tokens_per_s: float | None = None
    # What the variant ran under (farm.records.SpecCounters): requests verifying per
    # engine step, and the prefix cache's hit rate.
    verifies_per_step: float | None = None
    prefix_hit_rate: float | None = None
    # Its sequential looks stopped early: "regress at 16 of 64 prompts".
    decided: str | None = None
    # Acceptance per category of its prompt set (MT-Bench, SPEED-Bench).
    categories: tuple[CategoryAcceptance, ...] = ()

    @property
    def engine(self) -> str:
        return str(self.axes["engine"])

    @property
    def mtp_depth(self) -> int:
        return int(self.axes["mtp_depth"])

    @property
    def label(self) -> str | None:
        """The variant's label (as findings name it), None for a cell without variants."""
        request = {a.name: self.axes[a.name] for a in REQUEST_AXES if a.name in self.axes}
        if not request:
            return None
        return variant_label(self.cell_id, request)


def _baseline_key(stored: StoredCell, variant: VariantResult) -> tuple[AxisValue, ...]:
    """Every axis but the MTP depth, with the planned graph mode (a cell that ran as
    another mode is not paired at all: :func:`farm.analysis.labels.label_mismatches`)."""
    axes = stored.cell.variant_key(variant.axes).axis_values()
    return tuple(v for k, v in axes.items() if k != "mtp_depth")


def summarize_sweep(sweep: SweepRecord) -> tuple[VariantSummary, ...]:
    """Summarise every variant of ``sweep``.

    Greedy agreement compares each request's output with the same prompt's output
    of the speculation-off cell (MTP depth 0) that shares engine, model, graph mode,
    sliding window, thinking and workload: under greedy decoding, speculation must not
    change the output. Only cells that ran as their labels say are paired (a cell the
    engine ran as another mode has no agreement figure).
    """
    baselines: dict[tuple[AxisValue, ...], dict[str, str | None]] = {}
    for stored in sweep.cells:
        if label_mismatches(stored):
            continue
        if not stored.cell.speculative and stored.result is not None:
            for v in stored.result.variants:
                baselines[_baseline_key(stored, v)] = {
                    r.prompt_id: r.output_text for r in v.requests if r.error is None
                }
    rows: list[VariantSummary] = []
    for stored in sweep.cells:
        cell, result = stored.cell, stored.result
        common = {
            "cell_id": cell.cell_id,
            "effective_graph_mode": result.effective.graph_mode
            if result and result.effective
            else None,
        }
        if result is None or not result.variants:
            rows.append(
                VariantSummary(
                    **common,
                    axes=cell.axes,
                    status=result.status if result else "planned",
                    error=result.error if result else None,
                )
            )
            continue
        for v in result.variants:
            ok = [r for r in v.requests if r.error is None]
            scored = [r for r in ok if r.correct is not None]
            same = compared = None
            base = None if label_mismatches(stored) else baselines.get(_baseline_key(stored, v))
            if base is not None and cell.speculative:
                shared = [r for r in ok if r.prompt_id in base]
                # Text pruned (`farm db prune`) on either side: that prompt's agreement
                # is unknown, and with every text pruned so is the variant's.
                pairs = [
                    (r.output_text, base[r.prompt_id])
                    for r in shared
                    if r.output_text is not None and base[r.prompt_id] is not None
                ]
                same, compared = sum(a == b for a, b in pairs), len(pairs)
                if not pairs and len(shared) > 0:
                    same = compared = None
            tokens = sum(r.completion_tokens for r in ok)
            rows.append(
                VariantSummary(
                    **common,
                    axes={**cell.axes, **v.axes},
                    status=result.status,
                    error=result.error,
                    requests=len(v.requests),
                    failed_requests=len(v.requests) - len(ok),
                    acceptance_rate=v.counters.acceptance_rate,
                    mean_acceptance_length=v.counters.mean_acceptance_length,
                    per_position=v.counters.per_position_rate,
                    greedy_same=same,
                    greedy_compared=compared,
                    accuracy=sum(bool(r.correct) for r in scored) / len(scored) if scored else None,
                    output_tokens_per_s=tokens / v.elapsed_s if v.elapsed_s > 0 else None,
                    verifies_per_step=v.counters.verifies_per_step,
                    prefix_hit_rate=v.counters.prefix_hit_rate,
                    decided=_decided(v),
                    categories=acceptance_by_category(v.requests),
                )
            )
    return tuple(rows)


def _decided(variant: VariantResult) -> str | None:
    looks = variant.sequential
    if looks is None or not looks.stopped_early:
        return None
    return f"{looks.decision} at {looks.prompts_used} of {looks.max_prompts} prompts"


def patched_bases(builds: tuple[BuildInfo, ...]) -> dict[str, str]:
    """Patched engine -> its base: the engine of the same package, version, source and
    pins whose patch series is the longest proper prefix of this one's (none at all, or
    the fixes a canary is stacked on).

    The within-sweep patch check compares each patched build with this base.
    """

    def identity(b: BuildInfo) -> tuple[object, ...]:
        return (b.family, b.package, b.version, b.source, b.pins)

    bases: dict[str, str] = {}
    for build in builds:
        below = [
            other
            for other in builds
            if identity(other) == identity(build)
            and len(other.patches) < len(build.patches)
            and tuple(build.patches[: len(other.patches)]) == tuple(other.patches)
        ]
        if build.patches and below:
            bases[build.engine] = max(below, key=lambda other: len(other.patches)).engine
    return bases

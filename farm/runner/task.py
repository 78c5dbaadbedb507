"""What a worker needs to run one cell: the runner's typed input."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from farm.analysis.sequential import SequentialDesign
from farm.analysis.stats import AcceptanceSample
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.plan import ServerCell, Variant
from farm.records import (
    BuildInfo,
    LookCalibration,
    SpecCounters,
    StoredCell,
    counted,
    counters_digest,
)
from farm.spec import EngineSpec, ModelSpec, TimeoutSpec
from farm.workload.prompts import LoadedWorkload

__all__ = ["CellTask", "ReferenceRun", "SequentialLooks", "reference_runs", "sequential_looks"]


class ReferenceRun(Frozen):
    """A stored variant a candidate is paired with: where it ran, its per-request
    counters (the requests that succeeded with counters, in stored order) and their
    :func:`farm.records.counters_digest`."""

    sweep_id: int
    cell_id: str
    prompt_ids: tuple[str, ...]
    counters: tuple[SpecCounters, ...]
    digest: str
    # The key's calibrated AL rule its looks apply (a noisy key with history), or None.
    calibration: LookCalibration | None = None

    def sample(self) -> AcceptanceSample:
        return AcceptanceSample.from_counters(self.prompt_ids, self.counters)


class SequentialLooks(Frozen):
    """Run variant ``variant`` (its :attr:`farm.plan.Variant.key`) in the looks of
    ``design``, each decided against ``reference``; ``name`` seeds the last look's
    bootstrap as the sweep comparison seeds it (the variant's comparable-key label)."""

    variant: str
    name: str
    design: SequentialDesign
    reference: ReferenceRun


class CellTask(Frozen):
    """Everything a worker needs to run one cell, with no access to the job file."""

    cell: ServerCell
    engine: EngineSpec
    model: ModelSpec
    model_path: str
    workloads: tuple[LoadedWorkload, ...]
    # The engine build on the node the cell runs on: the pool sets it at dispatch.
    build: BuildInfo | None = None
    timeouts: TimeoutSpec
    log_dir: str
    sequential: tuple[SequentialLooks, ...] = ()

    def looks_for(self, variant: Variant) -> SequentialLooks | None:
        """The sequential plan of ``variant``, None when it runs every prompt at once."""
        return next((s for s in self.sequential if s.variant == variant.key), None)


def sequential_looks(
    cell: ServerCell,
    workloads: tuple[LoadedWorkload, ...],
    references: Mapping[ComparableKey, ReferenceRun],
) -> tuple[SequentialLooks, ...]:
    """The looks of each variant of ``cell`` whose workload asks for them and whose
    comparable key has a reference run; the last look at the workload's prompt count."""
    if not cell.speculative:
        return ()
    by_name = {w.spec.name: w for w in workloads}
    out = []
    for variant in cell.variants:
        workload = by_name.get(variant.workload)
        key = cell.variant_key(variant.axes)
        reference = references.get(key)
        if workload is None or workload.spec.sequential is None or reference is None:
            continue
        spec = workload.spec.sequential
        if spec.look_every >= len(workload.prompts):
            continue  # fewer prompts than a look: the fixed-sample rule
        design = SequentialDesign(
            look_every=spec.look_every, max_prompts=len(workload.prompts), power=spec.power
        )
        out.append(
            SequentialLooks(variant=variant.key, name=key.label, design=design, reference=reference)
        )
    return tuple(out)


def reference_runs(
    cells: Iterable[tuple[int, StoredCell]], engine_map: Mapping[str, str] | None = None
) -> dict[ComparableKey, ReferenceRun]:
    """Every spec-on variant that ran in ``cells`` ((sweep id, stored cell) pairs), as
    a reference for sequential looks, by comparable key; ``engine_map`` names the
    engine a key is given under (a PR's candidate for its base's cells)."""
    rename = engine_map or {}
    out = {}
    for sweep_id, stored in cells:
        result = stored.result
        if result is None or result.status != "ok" or not stored.cell.speculative:
            continue
        for variant in result.variants:
            kept = counted(variant.requests)
            if not kept:
                continue
            key = stored.cell.variant_key(variant.axes)
            key = key.model_copy(update={"engine": rename.get(key.engine, key.engine)})
            out[key] = ReferenceRun(
                sweep_id=sweep_id,
                cell_id=stored.cell.cell_id,
                prompt_ids=tuple(p for p, _ in kept),
                counters=tuple(c for _, c in kept),
                digest=counters_digest(variant.requests),
            )
    return out

"""Findings shared by every verdict that pairs two sweeps' cells (nightly against the
last good night, a PR against its base, a bisection step against its ends). Pure.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from farm.analysis.stats import AcceptanceSample, compare_acceptance
from farm.analysis.verdicts import CheckConfig, judge
from farm.comparable import ComparableKey
from farm.records import StoredCell, SweepRecord, VariantResult
from farm.workflows.verdict import PositionChange, VerdictFinding

__all__ = [
    "PairedVariant",
    "failed_cell_findings",
    "position_changes",
    "position_text",
    "spec_on_variants",
]


@dataclass(frozen=True)
class PairedVariant:
    """A spec-on variant of an ok cell, as a side of a paired comparison."""

    key: ComparableKey
    cell_id: str
    label: str
    result: VariantResult


def spec_on_variants(
    sweep: SweepRecord, rename: Mapping[str, str] | None = None
) -> dict[str, PairedVariant]:
    """Spec-on variants of ``sweep``'s ok cells by comparable key label (as the rows of
    ``compare_sweeps`` are); ``rename`` maps an engine name to the one it stands for
    (a PR's candidate engine to its base)."""
    out: dict[str, PairedVariant] = {}
    for stored in sweep.cells:
        c, result = stored.cell, stored.result
        if c.mtp_depth == 0 or result is None or result.status != "ok":
            continue
        for v in result.variants:
            key = c.variant_key(v.axes)
            if rename and key.engine in rename:
                key = key.model_copy(update={"engine": rename[key.engine]})
            out[key.label] = PairedVariant(key, c.cell_id, c.variant_label(v.axes), v)
    return out


def position_changes(
    base: VariantResult, cand: VariantResult, key_label: str, cfg: CheckConfig
) -> tuple[PositionChange, ...]:
    """Acceptance per draft position, candidate against base, paired by prompt; ``fell``
    by the minimum per-position effect of ``cfg``."""
    # The generator of compare_sweeps for this key: the same resamples, so the
    # intervals agree with the row `farm compare` prints.
    rng = np.random.default_rng([cfg.seed, zlib.crc32(key_label.encode())])
    d = compare_acceptance(
        AcceptanceSample.from_requests(base.requests),
        AcceptanceSample.from_requests(cand.requests),
        rng=rng,
        resamples=cfg.resamples,
        level=cfg.level,
    )
    return tuple(
        PositionChange(
            position=i,
            baseline=d.reference_per_position[i].estimate,
            candidate=d.candidate_per_position[i].estimate,
            difference=diff.estimate,
            low=diff.low,
            high=diff.high,
            fell=judge(diff, cfg.min_position_diff, "lower")[1],
        )
        for i, diff in enumerate(d.per_position)
    )


def position_text(positions: Sequence[PositionChange]) -> str:
    """The positions that fell, as a clause of a finding's summary."""
    fell = [p for p in positions if p.fell]
    if not fell:
        return "no single draft position fell by the minimum effect"
    return "; ".join(
        f"acceptance at position {p.position} fell {p.baseline:.3f} -> {p.candidate:.3f} "
        f"({p.difference:+.3f})"
        for p in fell
    )


def failed_cell_findings(cells: Iterable[StoredCell], side: str = "") -> list[VerdictFinding]:
    """One ``cell_failed`` finding per cell that did not end ok (``side`` prefixes the
    summary: "candidate", "baseline")."""
    out = []
    for stored in cells:
        result = stored.result
        if result is None or result.status == "ok":
            continue
        first = (result.error or "no error recorded").strip().splitlines() or [""]
        prefix = f"{side} " if side else ""
        out.append(
            VerdictFinding(
                source="cells",
                check="cell_failed",
                key=stored.cell.key.label,
                cells=(stored.cell.cell_id,),
                summary=f"{prefix}{stored.cell.cell_id} {result.status}: {first[0][:200]}",
            )
        )
    return out

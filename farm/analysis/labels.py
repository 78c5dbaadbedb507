"""Cells that are what their labels say. Pure.

A cell's label (``full_decode_only.mtp3.swa-on``) is a claim about how its engine ran;
the claim is checked against what the engine itself reported after start-up
(:class:`farm.records.EffectiveConfig`: its start-up log and ``/v1/models`` for vLLM,
``/server_info`` for sglang), never against the label or the model's config. A cell
that ran as another configuration is a finding of its own (``label_mismatch``) and is
never compared as its label: a "compiled" cell that ran eager, paired with eager,
would pass exactly the comparison a full-graph bug needs.

What is checked: graph mode, MTP depth, prefix caching and the drafter's graph mode,
each where the engine reported it (an unreported setting is not a mismatch; the
sliding window is not read back by either engine, so it is not checked here).
"""

from __future__ import annotations

from farm.records import EffectiveConfig, StoredCell, SweepRecord
from farm.results.verdict import Finding

__all__ = ["LABEL_CHECK", "as_labelled", "label_findings", "label_mismatches"]

# The finding check (and alert kind) of a cell that ran as another configuration.
LABEL_CHECK = "label_mismatch"


def label_mismatches(stored: StoredCell) -> tuple[str, ...]:
    """What ``stored``'s engine reported running that its label does not say (empty:
    it ran as labelled, or it did not run, or the engine reported nothing)."""
    result = stored.result
    if result is None or result.status != "ok" or result.effective is None:
        return ()
    cell, ran = stored.cell, result.effective
    out = []
    if ran.graph_mode is not None and ran.graph_mode != cell.planned_graph_mode:
        out.append(f"labelled graph mode {cell.planned_graph_mode}, ran {ran.graph_mode}")
    if ran.num_speculative_tokens is not None and ran.num_speculative_tokens != cell.mtp_depth:
        out.append(f"labelled MTP depth {cell.mtp_depth}, ran {ran.num_speculative_tokens}")
    if ran.prefix_caching is not None and ran.prefix_caching != (cell.prefix_caching == "on"):
        out.append(
            f"labelled prefix caching {cell.prefix_caching}, ran "
            f"{'on' if ran.prefix_caching else 'off'}"
        )
    out += _drafter(cell.draft_graph_mode, cell.planned_graph_mode, cell.mtp_depth, ran)
    return tuple(out)


def _drafter(draft: str, graph: str, depth: int, ran: EffectiveConfig) -> list[str]:
    if ran.drafter_eager is None or depth == 0 or graph == "eager":
        return []
    if ran.drafter_eager != (draft == "eager"):
        did = "eager" if ran.drafter_eager else f"in the target's mode ({graph})"
        return [f"labelled drafter {draft}, ran {did}"]
    return []


def label_findings(sweep: SweepRecord, side: str = "") -> list[Finding]:
    """One ``label_mismatch`` finding per cell of ``sweep`` that ran as another
    configuration (``side`` before the cell: "candidate", "baseline")."""
    out = []
    for stored in sweep.cells:
        found = label_mismatches(stored)
        if not found:
            continue
        prefix = f"{side} " if side else ""
        out.append(
            Finding(
                source="label",
                check=LABEL_CHECK,
                key=stored.cell.key,
                cells=(stored.cell.cell_id,),
                summary=(
                    f"{prefix}{stored.cell.cell_id}: {'; '.join(found)} (as the engine "
                    "reported it); not compared as its label"
                ),
            )
        )
    return out


def as_labelled(sweep: SweepRecord) -> SweepRecord:
    """``sweep`` without the cells that ran as another configuration: what may be
    compared by its labels."""
    kept = tuple(c for c in sweep.cells if not label_mismatches(c))
    if len(kept) == len(sweep.cells):
        return sweep
    return sweep.model_copy(update={"cells": kept})

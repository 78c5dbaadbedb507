"""Sweep summaries: acceptance figures and greedy agreement against spec-off cells."""

from __future__ import annotations

from datetime import UTC, datetime

from farm.analysis import summarize_sweep
from farm.plan import ServerCell, Variant
from farm.records import (
    CellResult,
    RequestRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    VariantResult,
)

NOW = datetime(2026, 11, 29, tzinfo=UTC)
V = Variant(thinking="on", workload="arith")


def _cell(depth: int, graph: str = "eager") -> ServerCell:
    return ServerCell(
        engine="cpu",
        family="vllm",
        model="tiny",
        graph_mode=graph,  # type: ignore[arg-type]
        planned_graph_mode=graph,
        mtp_depth=depth,
        sliding_window="on",
        variants=(V,),
        fingerprint=f"f{depth}{graph}",
    )


def _result(cell: ServerCell, outputs: list[str], counters: SpecCounters) -> CellResult:
    requests = tuple(
        RequestRecord(
            prompt_id=f"p{i}",
            output_text=o,
            completion_tokens=10,
            finish_reason="stop",
            latency_s=1.0,
            correct=o.endswith("7"),
        )
        for i, o in enumerate(outputs)
    )
    variant = VariantResult(
        thinking="on",
        workload="arith",
        counters=counters,
        requests=requests,
        elapsed_s=2.0,
        concurrency=2,
    )
    return CellResult(
        cell_id=cell.cell_id, status="ok", started_at=NOW, finished_at=NOW, variants=(variant,)
    )


def test_summary_figures_and_greedy_agreement() -> None:
    base, spec, other = _cell(0), _cell(3), _cell(3, "compiled")
    counters = SpecCounters(drafts=10, draft_tokens=30, accepted=15, accepted_per_pos=(8, 5, 2))
    sweep = SweepRecord(
        sweep_id=1,
        job="t",
        started_at=NOW,
        status="ok",
        cells=(
            StoredCell(cell=base, result=_result(base, ["a7", "b7", "c1"], SpecCounters())),
            StoredCell(cell=spec, result=_result(spec, ["a7", "x", "c1"], counters)),
            StoredCell(cell=other, result=None),
        ),
    )
    rows = {r.cell_id: r for r in summarize_sweep(sweep)}
    row = rows[spec.cell_id]
    assert row.acceptance_rate == 0.5
    assert row.mean_acceptance_length == 2.5
    assert row.per_position == (0.8, 0.5, 0.2)
    assert (row.greedy_same, row.greedy_compared) == (2, 3)
    assert row.accuracy == 1 / 3
    assert row.output_tokens_per_s == 15.0
    assert rows[base.cell_id].greedy_compared is None  # the baseline is not compared to itself
    assert rows[base.cell_id].mean_acceptance_length is None
    # A compiled cell has no compiled spec-off baseline here, and has no result yet.
    assert rows[other.cell_id].status == "planned"

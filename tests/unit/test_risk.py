"""Which cells a PR run starts first: the job's past regressions and the files the PR
changes (farm.analysis.risk). Pure."""

from __future__ import annotations

from farm.analysis.risk import touched_parts, touched_risk
from farm.plan import ServerCell, Variant
from farm.workflows.pr.order import likely_first


def _cell(graph: str, depth: int, window: str, prefix: str = "on") -> ServerCell:
    return ServerCell.model_validate(
        {
            "engine": "vllm-ascend",
            "family": "vllm",
            "model": "m",
            "graph_mode": graph,
            "planned_graph_mode": graph,
            "mtp_depth": depth,
            "sliding_window": window,
            "prefix_caching": prefix,
            "variants": (Variant(thinking="off", workload="w"),),
            "fingerprint": f"{graph}{depth}{window}{prefix}",
        }
    )


CELLS = [
    _cell("eager", 0, "off"),
    _cell("eager", 3, "off", "off"),
    _cell("piecewise", 1, "on"),
    _cell("full_decode_only", 3, "on"),
    _cell("full_decode_only", 3, "off", "off"),
]


def test_the_seed_prs_files_name_the_parts_they_touch() -> None:
    # vllm-ascend #8210 and sglang #27202, as their diffs list them.
    assert touched_parts(["vllm_ascend/attention/attention_v1.py"]) == ["attention"]
    sglang = [
        "python/sglang/srt/hardware_backend/npu/attention/ascend_hybrid_linear_attn_backend.py",
        "python/sglang/srt/hardware_backend/npu/memory_pool_npu.py",
    ]
    assert touched_parts(sglang) == ["attention", "hybrid state and caches"]
    assert touched_parts(["README.md", "docs/usage.md"]) == []


def test_an_attention_change_runs_window_graph_and_deep_mtp_cells_first() -> None:
    first = likely_first(CELLS, [], ["vllm_ascend/attention/attention_v1.py"])
    # SWA + full graph + MTP 3 (every condition of #8210), then SWA + piecewise.
    assert first[:2] == (CELLS[3].cell_id, CELLS[2].cell_id)
    risk = touched_risk(CELLS, ["vllm_ascend/attention/attention_v1.py"])
    assert risk[CELLS[0].cell_id] == risk[CELLS[4].cell_id] == 0.0  # no window: cannot show


def test_a_speculative_change_puts_deep_mtp_first_and_spec_off_last() -> None:
    first = likely_first(CELLS, [], ["vllm/v1/spec_decode/eagle.py"])
    assert first[-1] == CELLS[0].cell_id  # MTP off cannot show a drafting bug
    assert set(first[:3]) == {CELLS[1].cell_id, CELLS[3].cell_id, CELLS[4].cell_id}


def test_a_change_that_touches_no_known_part_keeps_the_plans_order() -> None:
    assert likely_first(CELLS, [], ["README.md"]) == ()
    assert likely_first(CELLS, []) == ()

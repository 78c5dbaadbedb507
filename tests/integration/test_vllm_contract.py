"""The vLLM adapter's argv, checked by the engine's own argument parser.

Every server argv the adapter builds for jobs/local.yaml (and for the graph modes
only a graph-capturing build can run) is parsed by vLLM's OpenAI-server parser and
turned into EngineArgs inside the real engine build, so a misspelt flag, a value
of the wrong type or a flag of another version fails here.
"""

from __future__ import annotations

import json
import subprocess

from farm.engines import adapter_for, job_capabilities
from farm.plan import Capabilities, expand_matrix
from farm.records import BuildInfo
from farm.spec import JobSpec, OverlaySpec

_PARSE = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # older layout
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.engine.arg_utils import AsyncEngineArgs
parser = make_arg_parser(FlexibleArgumentParser())
out = []
for argv in json.load(sys.stdin):
    args = parser.parse_args(argv)
    ea = AsyncEngineArgs.from_cli_args(args)
    cc = ea.compilation_config
    out.append({
        "enforce_eager": ea.enforce_eager,
        "speculative_config": ea.speculative_config,
        "cudagraph_mode": str(getattr(cc, "cudagraph_mode", None)),
        "capture_sizes": getattr(cc, "cudagraph_capture_sizes", None),
        "max_num_seqs": ea.max_num_seqs,
        "hf_overrides": ea.hf_overrides,
        "max_model_len": ea.max_model_len,
        "port": args.port,
        "per_request_spec": getattr(ea, "per_request_spec_decode_metrics", None),
        "prefix_caching": ea.enable_prefix_caching,
        "kv": None if ea.kv_transfer_config is None else {
            k: getattr(ea.kv_transfer_config, k)
            for k in ("kv_connector", "kv_role", "kv_buffer_device")},
    })
print(json.dumps(out, default=str))
"""


def _parse(build: BuildInfo, argvs: list[list[str]]) -> list[dict[str, object]]:
    done = subprocess.run(
        [build.python, "-c", _PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_every_local_cell_argv_parses_in_vllm(local_job: JobSpec, engine_build: BuildInfo) -> None:
    # With prefix caching varied: "on" leaves vLLM's default (on), "off" turns it off;
    # and the drafter's graph mode: eager beside a compiled target.
    varied = {"prefix_caching": ("on", "off"), "draft_graph_mode": ("target", "eager")}
    job = local_job.model_copy(update={"axes": local_job.axes.model_copy(update=varied)})
    plan = expand_matrix(job, job_capabilities(job))
    assert {c.prefix_caching for c in plan.cells} == {"on", "off"}
    assert {c.draft_graph_mode for c in plan.cells} == {"target", "eager"}
    engine, model = local_job.engines[0], local_job.models[0]
    adapter = adapter_for(engine.family)
    launches = [
        adapter.launch(c, engine, model, "/m", engine_build.python, 8000 + i)
        for i, c in enumerate(plan.cells)
    ]
    parsed = _parse(engine_build, [list(lx.argv[3:]) for lx in launches])
    for cell, got in zip(plan.cells, parsed, strict=True):
        assert got["enforce_eager"] is (cell.planned_graph_mode == "eager"), cell.cell_id
        spec = got["speculative_config"]
        if cell.mtp_depth == 0:
            assert spec is None
        else:
            assert isinstance(spec, dict)
            assert spec["method"] == model.speculative_method
            assert spec["num_speculative_tokens"] == cell.mtp_depth
            assert spec.get("enforce_eager", False) is (cell.draft_graph_mode == "eager")
            assert got["per_request_spec"] == "summary"
        overrides = got["hf_overrides"] or {}
        assert (overrides.get("sliding_window", "unset") is None) is (cell.sliding_window == "off")
        assert got["max_model_len"] == model.max_model_len
        # None: vLLM decides, and v1 turns it on for every model it serves here.
        assert got["prefix_caching"] in ((None, True) if cell.prefix_caching == "on" else (False,))


def test_graph_capture_modes_parse_in_vllm(local_job: JobSpec, engine_build: BuildInfo) -> None:
    # vllm-ascend shares vLLM's CLI: its graph modes must parse with this parser too.
    ascend = local_job.engines[0].model_copy(
        update={"family": "vllm-ascend", "package": "vllm-ascend"}
    )
    job = local_job.model_copy(
        update={
            "engines": (ascend,),
            "axes": local_job.axes.model_copy(
                update={
                    "graph_mode": ("eager", "piecewise", "full_decode_only", "full"),
                    "mtp_depth": (3,),
                }
            ),
        }
    )
    caps: dict[str, Capabilities] = job_capabilities(job)
    plan = expand_matrix(job, caps)
    adapter = adapter_for("vllm-ascend")
    launches = [adapter.launch(c, ascend, job.models[0], "/m", "python", 8000) for c in plan.cells]
    parsed = _parse(engine_build, [list(lx.argv[3:]) for lx in launches])
    modes = {
        c.planned_graph_mode: p["cudagraph_mode"] for c, p in zip(plan.cells, parsed, strict=True)
    }
    assert modes["piecewise"].endswith("PIECEWISE")
    assert modes["full_decode_only"].endswith("FULL_DECODE_ONLY")
    assert modes["full"].endswith("FULL")
    # Full graphs with MTP 3 capture whole decode rounds: multiples of 4 tokens, up to
    # the sequences the server is told to batch.
    for cell, got in zip(plan.cells, parsed, strict=True):
        if cell.planned_graph_mode in ("full_decode_only", "full"):
            assert got["capture_sizes"] == [4, 8, 16, 32, 64], cell.cell_id
            assert got["max_num_seqs"] == 16
        else:
            assert not got["capture_sizes"] and got["max_num_seqs"] is None, cell.cell_id


def test_pd_cell_argvs_parse_in_vllm(local_job: JobSpec, engine_build: BuildInfo) -> None:
    # The CPU build with NIXL overlaid: both servers of a pd cell run NixlConnector.
    nixl = (
        OverlaySpec(package="nixl-cu12", version="1.5.1"),
        OverlaySpec(package="nixl", version="1.5.2"),
    )
    engine = local_job.engines[0].model_copy(update={"overlays": nixl})
    axes = {"deployment": ("pd",), "mtp_depth": (3,), "graph_mode": ("eager", "compiled")}
    job = local_job.model_copy(
        update={"engines": (engine,), "axes": local_job.axes.model_copy(update=axes)}
    )
    plan = expand_matrix(job, job_capabilities(job))
    assert plan.cells and all(c.disaggregated for c in plan.cells)
    adapter = adapter_for(engine.family)
    model = local_job.models[0]
    pairs = [
        adapter.pd_launches(c, engine, model, "/m", "python", (8000, 8001), (5600, 5601))
        for c in plan.cells
    ]
    launches = [launch for pair in pairs for launch in pair]
    parsed = _parse(engine_build, [list(lx.argv[3:]) for lx in launches])
    assert len(parsed) == len(launches)
    for got in parsed:
        assert got["kv"] == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_buffer_device": "cpu",
        }
        spec = got["speculative_config"]
        assert isinstance(spec, dict) and spec["num_speculative_tokens"] == 3
    assert [got["port"] for got in parsed[:2]] == [8000, 8001]

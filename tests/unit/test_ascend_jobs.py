"""jobs/nightly-ascend.yaml and jobs/pr-ascend.yaml: the seed sweeps as plans and argv."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from farm.cli.main import app
from farm.engines import job_capabilities, pd_label, plan_launches
from farm.plan import Plan, expand_matrix
from farm.spec import JobSpec, load_job

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def _plan(name: str) -> tuple[JobSpec, Plan]:
    job = load_job(JOBS / name)
    return job, expand_matrix(job, job_capabilities(job))


def _after(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_nightly_covers_both_seed_matrices() -> None:
    job, plan = _plan("nightly-ascend.yaml")
    pd = [c for c in plan.cells if c.disaggregated]
    colocated = [c for c in plan.cells if not c.disaggregated]
    apart = [c for c in colocated if c.draft_graph_mode == "eager"]
    vllm = [c for c in colocated if c.family == "vllm-ascend" and c not in apart]
    sgl = [c for c in colocated if c.family == "sglang"]
    # (a) 2 builds x {eager, piecewise, full_decode_only} x MTP {1, 3} x SWA {on, off},
    # and the drafter eager beside full_decode_only (vllm-ascend's own nightly case)
    assert len(vllm) == 2 * 3 * 2 * 2
    assert len(apart) == 2 * 2 * 2
    assert all(c.planned_graph_mode == "full_decode_only" for c in apart)
    assert all(c.family == "vllm-ascend" for c in apart)  # sglang has no such switch:
    no_switch = [
        e
        for e in plan.excluded
        if e.axes["draft_graph_mode"] == "eager"
        and e.axes["graph_mode"] == "full_decode_only"
        and e.axes["engine"].startswith("sglang")
        and e.axes["model"].startswith("qwen")
        and not e.reason.startswith("job exclude")
    ]
    assert no_switch and all("sglang runs the drafter" in e.reason for e in no_switch)
    assert {c.model for c in vllm} == {"step-3.5-flash"}
    assert {(c.planned_graph_mode, c.mtp_depth, c.sliding_window) for c in vllm} == {
        (g, d, s)
        for g in ("eager", "piecewise", "full_decode_only")
        for d in (1, 3)
        for s in ("on", "off")
    }
    # Step-3.5's template ignores enable_thinking: one variant per workload and
    # context, and the plan says why. The conversations run at 64k and 128k tokens of
    # context, and the cell serves the longest on top of the model's length.
    assert all(
        {v.key for v in c.variants}
        == {"think-off.aime25", "think-off.ctx65536.long-chat", "think-off.ctx131072.long-chat"}
        for c in vllm
    )
    assert all(any("thinking=on dropped" in r for r in c.remaps) for c in vllm)
    assert {c.prefix_caching for c in vllm} == {"on"}
    # (b) 2 builds x graph on/off x prefix caching on/off, NEXTN 3, concurrency {1, 4}
    # x thinking {on, off}
    assert len(sgl) == 2 * 2 * 2
    assert {c.planned_graph_mode for c in sgl} == {"eager", "full_decode_only"}
    off = [c for c in sgl if c.prefix_caching == "off"]
    assert len(off) == 4 and all(c.cell_id.endswith(".prefix-off") for c in off)
    assert {c.mtp_depth for c in sgl} == {3}
    for cell in sgl:
        assert {v.key for v in cell.variants} == {
            f"think-{t}.{w}"
            for t in ("on", "off")
            for w in ("ceval-c1", "ceval-c4", "ctx65536.long-chat", "ctx131072.long-chat")
        }
    piecewise = [
        e
        for e in plan.excluded
        if e.axes["graph_mode"] == "piecewise"
        and e.axes["engine"].startswith("sglang")
        and e.axes["model"].startswith("qwen")
        and not e.reason.startswith("job exclude rule")
    ]
    assert len(piecewise) == 2 * 2 and all("NPU" in e.reason for e in piecewise)
    concurrency = {w.name: w.concurrency for w in job.workloads}
    assert concurrency == {"aime25": 4, "ceval-c1": 1, "ceval-c4": 4, "long-chat": 4}
    # With and without the fix are different builds, hence never the same fingerprint.
    fixed = {e.name: e.patches for e in job.engines}
    assert fixed["vllm-ascend-pr8210-fix"] == ("swa-graph-fia-causal-window",)
    assert fixed["sglang-0.5.12.post1-pr27202"] == ("npu-hybrid-mtp-verify",)
    assert len({c.key.fingerprint for c in plan.cells}) == len(plan.cells)
    # (c) the PD split: vllm-ascend 2 builds x {eager, full_decode_only} x MTP {1, 3};
    # sglang 2 builds under its decode graph; SWA, prefix caching and the drafter at
    # their defaults.
    assert {(c.family, c.planned_graph_mode, c.mtp_depth) for c in pd} == {
        *(("vllm-ascend", g, d) for g in ("eager", "full_decode_only") for d in (1, 3)),
        ("sglang", "full_decode_only", 3),
    }
    assert len(pd) == 2 * 2 * 2 + 2
    assert all(c.cell_id.endswith(".pd") for c in pd)
    assert {(c.sliding_window, c.prefix_caching, c.draft_graph_mode) for c in pd} == {
        ("on", "on", "target")
    }


def test_nightly_pd_cells_run_both_servers_with_the_engines_own_connectors() -> None:
    job, plan = _plan("nightly-ascend.yaml")
    launches = plan_launches(job, plan)
    for cell in (c for c in plan.cells if c.disaggregated):
        prefill = launches[pd_label(cell.cell_id, "prefill")]
        decode = launches[pd_label(cell.cell_id, "decode")]
        devices = [x.env["ASCEND_RT_VISIBLE_DEVICES"].split(",") for x in (prefill, decode)]
        assert not set(devices[0]) & set(devices[1])  # two device groups of the cell's
        if cell.family == "vllm-ascend":
            roles = []
            for launch in (prefill, decode):
                config = json.loads(_after(launch.argv, "--kv-transfer-config"))
                assert config["kv_connector"] == "MooncakeConnectorV1"
                extra = config["kv_connector_extra_config"]
                assert extra["prefill"]["tp_size"] == extra["decode"]["tp_size"] == 8
                assert _after(launch.argv, "--tensor-parallel-size") == "8"
                roles.append(config["kv_role"])
                spec = json.loads(_after(launch.argv, "--speculative-config"))
                assert spec["num_speculative_tokens"] == cell.mtp_depth  # MTP on both
            assert roles == ["kv_producer", "kv_consumer"]
        else:
            modes = [_after(x.argv, "--disaggregation-mode") for x in (prefill, decode)]
            assert modes == ["prefill", "decode"]
            assert _after(prefill.argv, "--disaggregation-transfer-backend") == "ascend"
            assert "--disaggregation-bootstrap-port" in prefill.argv
            assert [len(d) for d in devices] == [2, 2]


def test_nightly_argv_and_env_per_cell() -> None:
    job, plan = _plan("nightly-ascend.yaml")
    launches = plan_launches(job, plan)
    pd = [c for c in plan.cells if c.disaggregated]
    assert set(launches) == {c.cell_id for c in plan.cells if c not in pd} | {
        pd_label(c.cell_id, role) for c in pd for role in ("prefill", "decode")
    }
    for cell in (c for c in plan.cells if c not in pd):
        launch = launches[cell.cell_id]
        argv = launch.argv
        if cell.family == "vllm-ascend":
            assert _after(argv, "--tensor-parallel-size") == "16"
            assert _after(argv, "--distributed-executor-backend") == "mp"
            assert launch.env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, range(16)))
            spec = json.loads(_after(argv, "--speculative-config"))
            apart = {"enforce_eager": True} if cell.draft_graph_mode == "eager" else {}
            assert spec == {"method": "mtp", "num_speculative_tokens": cell.mtp_depth, **apart}
            if cell.planned_graph_mode == "eager":
                assert "--enforce-eager" in argv and "--compilation-config" not in argv
            else:
                compilation = json.loads(_after(argv, "--compilation-config"))
                assert compilation["cudagraph_mode"] == cell.planned_graph_mode.upper()
                # The job's capture sizes, as the deployment sets them, and the plan's
                # word on which verify rounds they capture or pad.
                assert compilation["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16]
                if cell.planned_graph_mode == "full_decode_only":
                    fit = f"verify rounds of {cell.mtp_depth + 1} tokens a request"
                    assert any(r.startswith(fit) and "3->4" in r for r in cell.remaps)
            assert ("--hf-overrides" in argv) is (cell.sliding_window == "off")
        else:
            assert argv[1:3] == ("-m", "sglang.launch_server")
            assert (
                _after(argv, "--speculative-num-steps"),
                _after(argv, "--speculative-eagle-topk"),
                _after(argv, "--speculative-num-draft-tokens"),
            ) == ("3", "1", "4")
            assert _after(argv, "--tp-size") == "4"
            assert launch.env == {"ASCEND_USE_FIA": "1", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}
            assert ("--disable-cuda-graph" in argv) is (cell.planned_graph_mode == "eager")
            assert "--ray" not in " ".join(argv)


def test_pr_job_is_a_slice_of_the_nightly() -> None:
    _, nightly = _plan("nightly-ascend.yaml")
    _, pr = _plan("pr-ascend.yaml")
    assert 0 < len(pr.cells) < len(nightly.cells)
    assert {c.mtp_depth for c in pr.cells} == {3}
    assert {c.engine for c in pr.cells} == {"vllm-ascend-pr8210-fix", "sglang-0.5.12.post1-pr27202"}
    # The cells where the seed bugs show are in the PR matrix.
    ids = {c.cell_id for c in pr.cells}
    assert "vllm-ascend-pr8210-fix.step-3.5-flash.full_decode_only.mtp3.swa-on" in ids
    assert "sglang-0.5.12.post1-pr27202.qwen3.6-35b-a3b.full_decode_only.mtp3.swa-on" in ids


def test_farm_plan_prints_each_cells_argv_and_env() -> None:
    result = CliRunner().invoke(
        app, ["plan", str(JOBS / "nightly-ascend.yaml"), "--only", "engine=sglang-0.5.12.post1"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "env: ASCEND_RT_VISIBLE_DEVICES=0,1,2,3 ASCEND_USE_FIA=1" in out
    assert "--speculative-algorithm NEXTN" in out and "--disable-piecewise-cuda-graph" in out
    assert "sglang-0.5.12.post1.qwen3.6-35b-a3b.eager.mtp3.swa-on\n" in out
    quiet = CliRunner().invoke(app, ["plan", str(JOBS / "pr-ascend.yaml"), "--no-argv"])
    assert quiet.exit_code == 0 and "argv:" not in quiet.output


def test_farm_plan_prints_both_servers_of_a_pd_cell() -> None:
    only = ["--only", "deployment=pd", "--only", "engine=vllm-ascend-pr8210-fix"]
    result = CliRunner().invoke(app, ["plan", str(JOBS / "nightly-ascend.yaml"), *only])
    assert result.exit_code == 0, result.output
    out = result.output
    cell = "vllm-ascend-pr8210-fix.step-3.5-flash.full_decode_only.mtp3.swa-on.pd"
    assert f"{cell} prefill\n  env: ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\n" in out
    assert f"{cell} decode\n  env: ASCEND_RT_VISIBLE_DEVICES=8,9,10,11,12,13,14,15\n" in out
    assert out.count('"kv_role": "kv_producer"') == out.count('"kv_role": "kv_consumer"') == 4

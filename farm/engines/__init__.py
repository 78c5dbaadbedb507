"""Engine adapters, one per engine family, registered explicitly."""

from __future__ import annotations

from farm.engines.base import BuildRecipe, Completion, EngineAdapter, ServerLaunch
from farm.engines.vllm import VllmAdapter
from farm.errors import PlanError
from farm.plan import Capabilities
from farm.spec import JobSpec

__all__ = [
    "ADAPTERS",
    "BuildRecipe",
    "Completion",
    "EngineAdapter",
    "ServerLaunch",
    "adapter_for",
    "job_capabilities",
]

ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": VllmAdapter(),
    "vllm-ascend": VllmAdapter(),
}


def adapter_for(family: str) -> EngineAdapter:
    """The adapter of an engine family; PlanError when the family has none yet."""
    try:
        return ADAPTERS[family]
    except KeyError:
        raise PlanError(
            f"no engine adapter for family {family!r}; available: {sorted(ADAPTERS)}"
        ) from None


def job_capabilities(job: JobSpec) -> dict[str, Capabilities]:
    """Capabilities of every engine in ``job``, keyed by engine name."""
    return {e.name: adapter_for(e.family).capabilities(e) for e in job.engines}

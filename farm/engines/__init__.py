"""Engine adapters, one per engine family, registered explicitly."""

from __future__ import annotations

from farm.engines.base import BuildRecipe, Completion, EngineAdapter
from farm.engines.process import EngineProcess, PdSide, ServerLaunch
from farm.engines.sglang import SglangAdapter
from farm.engines.vllm import VllmAdapter
from farm.errors import PlanError
from farm.plan import Capabilities, Plan, cell_model
from farm.spec import JobSpec

__all__ = [
    "ADAPTERS",
    "BuildRecipe",
    "Completion",
    "EngineAdapter",
    "EngineProcess",
    "PdSide",
    "ServerLaunch",
    "adapter_for",
    "job_capabilities",
    "pd_label",
    "plan_launches",
]

ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": VllmAdapter(),
    "vllm-ascend": VllmAdapter(),
    "sglang": SglangAdapter(),
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


def plan_launches(
    job: JobSpec, plan: Plan, python: str = "python", port: int = 8000
) -> dict[str, ServerLaunch]:
    """The server argv and environment of every cell of ``plan``, keyed by cell id;
    a disaggregated cell's two servers as ``<cell id> prefill`` and ``<cell id>
    decode`` (:func:`pd_label`).

    As the runner builds them, except for the interpreter (``python``), the ports
    (picked free at run time: ``port``, and for a pd cell's decode server ``port + 1``,
    its KV side channels ``port + 100`` and ``port + 101``) and the NPU ids (Ray assigns
    them; shown as the first ``npus`` devices, the model's count or else the job's).
    """
    engines = {e.name: e for e in job.engines}
    models = {m.name: m for m in job.models}
    launches = {}
    for cell in plan.cells:
        model = cell_model(models[cell.model], cell)
        npus = model.npus or job.resources.npus
        adapter = adapter_for(cell.family)
        where = (cell, engines[cell.engine], model, str(job.resolve(model.path)), python)
        if cell.disaggregated:
            pair = adapter.pd_launches(
                *where, (port, port + 1), (port + 100, port + 101), tuple(range(npus))
            )
            for launch in pair:
                assert launch.pd is not None
                launches[pd_label(cell.cell_id, launch.pd.role)] = launch
        else:
            launches[cell.cell_id] = adapter.launch(*where, port, tuple(range(npus)))
    return launches


def pd_label(cell_id: str, role: str) -> str:
    """``<cell id> prefill``: how one server of a disaggregated cell is named."""
    return f"{cell_id} {role}"

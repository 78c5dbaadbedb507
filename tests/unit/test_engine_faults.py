"""Fault injection at the engine edge: bad engine output, orphaned engine processes,
the environment of untrusted processes.

Nothing real answers malformed JSON, reports a NaN counter or hangs on demand, so
the engine here is a FAKE (``tests/fakes/engine_server.py``: a small HTTP server
answering like vLLM's, or wrongly on purpose), started and driven by the farm's own
runner: ``run_cell`` with the vLLM adapter whose argv points at the fake. What the
runner does with the answers (parsing, counters, deadlines, the process group, the
environment) is the real code.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from farm.engines.devices import ProcessGroupGone
from farm.engines.environment import child_environment
from farm.engines.process import EngineProcess, ServerLaunch
from farm.engines.vllm import VllmAdapter
from farm.masking import looks_secret
from farm.records import SpecCounters
from farm.runner.cell import cell_deadline_s
from farm.spec import TimeoutSpec, WorkloadSpec
from farm.workload.harness import HarnessCommand, run_harness
from farm.workload.prompts import LoadedWorkload, Prompt
from tests.fakes.engine_adapter import FakeEngineAdapter, cell_task, cell_variant, run_with_adapter

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_WORKER = FAKES / "engine_worker.py"

# The driver's secrets as the farm's deployment sets them.
DRIVER_SECRETS = {
    "FARM_DB_URL": "postgresql://farm:hunter2@db/farm",
    "FARM_DB_PASSWORD": "hunter2",
    "RAY_AUTH_TOKEN": "ray-secret",
    "GITHUB_TOKEN": "ghp_secret",
    "GRAFANA_TOKEN": "glsa_secret",
    "FARM_NOTIFY_SLACK_URL": "https://hooks.slack.com/services/secret",
    "HF_TOKEN": "hf_machine_secret",
    "OPENAI_API_KEY": "sk-machine-secret",
    "SOME_SERVICE_PASSWORD": "secret",
    "VLLM_API_KEY": "vllm-secret",
}


class _TimeoutsWithCellDeadline(TimeoutSpec):
    """TimeoutSpec with the ``cell_s`` field asked of farm/spec.py's owner;
    the runner reads it with getattr until it lands."""

    cell_s: float | None = None


def _workload(name: str, prompts: list[str], concurrency: int = 2) -> LoadedWorkload:
    return LoadedWorkload(
        spec=WorkloadSpec(name=name, prompts=f"{name}.jsonl", concurrency=concurrency),
        prompts=tuple(Prompt(id=f"{name}-{i}", prompt=p) for i, p in enumerate(prompts)),
    )


def _assert_engine_gone(adapter: FakeEngineAdapter) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{adapter.ports[-1]}/health", timeout=2)


# --- Bad engine output ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("empty-choices", "completion has not the expected shape (IndexError: list index"),
        ("not-json", "completion is not JSON"),
        ("wrong-types", "completion has not the expected shape (TypeError"),
    ],
)
def test_fake_engine_malformed_answer_fails_that_request_with_what_was_wrong(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, reason: str
) -> None:
    adapter = FakeEngineAdapter(mode)
    task = cell_task(tmp_path, [_workload("w", ["good 1", "bad 2", "good 3"])])
    result = run_with_adapter(monkeypatch, adapter, task)
    assert result.status == "ok", result.error
    (variant,) = result.variants
    good, bad, other = variant.requests
    assert good.error is None and good.output_text == "echo: good 1"
    assert other.error is None
    assert bad.prompt_id == "w-1"
    assert bad.error is not None and bad.error.startswith(f"unreadable answer: {reason}"), bad.error
    assert variant.counters.drafts == 12  # the fake drafts 4 per request it answers
    _assert_engine_gone(adapter)


def test_fake_engine_malformed_answers_to_a_whole_variant_fail_the_cell_not_the_task(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Before: IndexError out of run_cell, the cell a bare "Ray task failed".
    adapter = FakeEngineAdapter("empty-choices")
    task = cell_task(tmp_path, [_workload("w1", ["good 1", "good 2"]), _workload("w2", ["bad 1"])])
    result = run_with_adapter(monkeypatch, adapter, task)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith(
        "variant think-on.w2: all 1 requests failed; first, w2-0: unreadable answer: "
        "completion has not the expected shape (IndexError"
    ), result.error
    assert [v.workload for v in result.variants] == ["w1", "w2"]
    assert all(r.error is None for r in result.variants[0].requests)
    assert result.log_tail is not None and "FAKE engine serving" in result.log_tail
    _assert_engine_gone(adapter)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        (
            "nan-counter",
            'metric vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} '
            "is nan, not a count",
        ),
        ("negative-counter", "is -5, not a count"),
        ("text-counter", "metrics are not readable Prometheus text (ValueError: could not convert"),
        (
            "backwards-counter",
            "counters went backwards between the scrapes before and after the "
            "variant (drafts 1000 -> 8, draft_tokens 1000 -> 8",
        ),
    ],
)
def test_fake_engine_bad_counters_are_marked_unusable_and_the_cell_keeps_its_variants(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, reason: str
) -> None:
    # Before: ValueError (int(nan), float('many')) out of run_cell, or a negative delta
    # stored as if measured.
    adapter = FakeEngineAdapter(mode)
    variants = [cell_variant("on", "w"), cell_variant("off", "w")]
    task = cell_task(tmp_path, [_workload("w", ["good 1", "good 2"])], variants)
    result = run_with_adapter(monkeypatch, adapter, task)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("variant think-on.w: counters unusable: ")
    assert reason in result.error, result.error
    assert len(result.variants) == 2
    assert all(r.error is None for v in result.variants for r in v.requests)
    assert result.variants[0].counters == SpecCounters()
    if mode == "backwards-counter":  # only the first variant saw the reset
        assert "think-off.w" not in result.error
        assert result.variants[1].counters.drafts == 8
    assert result.log_tail is not None
    _assert_engine_gone(adapter)


def test_fake_engine_that_never_answers_fails_the_cell_within_one_request_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Before: every request waited its timeout in turn, the cell was stored "ok" with
    # every request failed, and each timeout blocked the event loop 3 s in proc.wait.
    adapter = FakeEngineAdapter("hang")
    prompts = [f"good {i}" for i in range(6)]
    variants = [cell_variant("on", "w"), cell_variant("off", "w")]
    timeouts = TimeoutSpec(startup_s=30, request_s=2, stop_s=2)
    task = cell_task(tmp_path, [_workload("w", prompts, concurrency=2)], variants, timeouts)
    t0 = time.monotonic()
    result = run_with_adapter(monkeypatch, adapter, task)
    assert time.monotonic() - t0 < 15
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith(
        "variant think-on.w: all 6 requests failed; first, w-0: ReadTimeout: no answer "
        "within 2 s (timeouts.request_s)"
    ), result.error
    assert "the cell's remaining variants were not run" in result.error
    (variant,) = result.variants
    unsent = [r.error for r in variant.requests[2:]]
    assert all(
        e
        and e.startswith(
            "not sent: engine stopped answering: the last 2 requests got no answer "
            "within 2 s (timeouts.request_s)"
        )
        for e in unsent
    ), unsent
    _assert_engine_gone(adapter)


def test_cell_deadline_stops_the_engine_and_names_the_deadline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    adapter = FakeEngineAdapter("slow")  # answers, one second each
    timeouts = _TimeoutsWithCellDeadline(startup_s=30, request_s=10, stop_s=2, cell_s=4)
    task = cell_task(
        tmp_path, [_workload("w", [f"good {i}" for i in range(30)], 1)], None, timeouts
    )
    t0 = time.monotonic()
    result = run_with_adapter(monkeypatch, adapter, task)
    assert time.monotonic() - t0 < 12
    assert result.status == "failed"
    assert result.error == (
        "cell deadline of 4 s (timeouts.cell_s) passed during variant think-on.w; "
        "the engine was stopped"
    )
    assert result.log_tail is not None
    _assert_engine_gone(adapter)


def test_default_cell_deadline_is_what_the_other_limits_allow(tmp_path: Path) -> None:
    timeouts = TimeoutSpec(startup_s=900, request_s=600, stop_s=20)
    prompts = [f"p{i}" for i in range(10)]
    task = cell_task(tmp_path, [_workload("w", prompts, concurrency=4)], None, timeouts)
    # start-up, the model listing, two scrapes and 3 rounds of 4 requests at request_s.
    assert cell_deadline_s(task) == 900 + 30 + 60 + 3 * 600
    explicit = _TimeoutsWithCellDeadline(cell_s=1234)
    assert cell_deadline_s(task.model_copy(update={"timeouts": explicit})) == 1234


def test_waiting_for_an_engine_exit_leaves_the_event_loop_running(tmp_path: Path) -> None:
    engine = EngineProcess(ServerLaunch(argv=("sleep", "30"), env={}), 1, tmp_path / "log")
    engine.start()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    async def main() -> bool:
        ticker = asyncio.create_task(tick())
        try:
            return await engine.aexited(within_s=1)
        finally:
            ticker.cancel()

    try:
        assert asyncio.run(main()) is False
        assert ticks >= 10
    finally:
        engine.stop(1)
    assert engine.exited(within_s=0)


# --- Orphaned engine processes --------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigkilled_worker_leaves_no_process_of_its_fake_engine_group(tmp_path: Path) -> None:
    # Before: PR_SET_PDEATHSIG killed the server only; its children ran on under init.
    worker = subprocess.Popen(
        [
            sys.executable,
            str(FAKE_WORKER),
            str(_free_port()),
            str(tmp_path / "engine.log"),
            "spawn-children",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    pgid = None
    try:
        assert worker.stdout is not None
        pgid = int(worker.stdout.readline())
        group = ProcessGroupGone(pgid)
        # The keeper, the server, its multiprocessing child (and that one's resource
        # tracker, when multiprocessing starts one) and its plain child.
        deadline = time.monotonic() + 10
        while len(group.holders()) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(group.holders()) >= 4, group.holders()
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        deadline = time.monotonic() + 5
        while group.holders() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group.holders() == ()
        assert "is gone: killing process group" in (tmp_path / "engine.log").read_text()
    finally:
        worker.kill()
        worker.wait(timeout=10)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ("raise SystemExit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15),
    ],
)
def test_engine_exit_status_comes_through_its_keeper(
    tmp_path: Path, script: str, code: int
) -> None:
    # A SIGKILLed engine once made the keeper exit 1 (signal.signal(SIGKILL) raised).
    launch = ServerLaunch(argv=(sys.executable, "-c", script), env={})
    engine = EngineProcess(launch, 1, tmp_path / "log")
    engine.start()
    assert engine.exited(within_s=10) and engine.returncode == code


def test_engine_that_cannot_start_names_why(tmp_path: Path) -> None:
    missing = EngineProcess(ServerLaunch(argv=("/no/such/python",), env={}), 1, tmp_path / "log2")
    missing.start()
    assert missing.exited(within_s=10) and missing.returncode == 127
    assert "FileNotFoundError: [Errno 2]" in (tmp_path / "log2").read_text()


# --- The environment of untrusted processes (the engine's half) -----------------------


def _env_printed(log: Path, marker: str) -> dict[str, str]:
    line = next(ln for ln in log.read_text().splitlines() if ln.startswith(marker))
    env: dict[str, str] = json.loads(line[len(marker) :])
    return env


def test_fake_engine_sees_none_of_the_drivers_secrets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in DRIVER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", "/models/hf")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    adapter = FakeEngineAdapter("print-env")
    task = cell_task(
        tmp_path,
        [_workload("w", ["good 1"])],
        engine_env={"HF_TOKEN": "hf_job_token", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    result = run_with_adapter(monkeypatch, adapter, task)
    assert result.status == "ok", result.error
    env = _env_printed(Path(result.log_path or ""), "FAKE-ENV ")
    leaked = {k for k, v in env.items() if v in DRIVER_SECRETS.values()}
    assert leaked == set()
    assert not {"FARM_DB_URL", "RAY_AUTH_TOKEN", "GITHUB_TOKEN", "GRAFANA_TOKEN"} & set(env)
    # What the job sets explicitly wins; what engines need comes through.
    assert env["HF_TOKEN"] == "hf_job_token" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HOME"] == "/models/hf" and env["OMP_NUM_THREADS"] == "2"
    assert env["PATH"] == os.environ["PATH"]


def test_real_vllm_start_passes_an_explicit_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The vLLM adapter's real launch and start path, with Popen caught (no engine)."""
    for name, value in DRIVER_SECRETS.items():
        monkeypatch.setenv(name, value)
    task = cell_task(tmp_path, [_workload("w", ["p"])], engine_env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    adapter = VllmAdapter()
    launch = adapter.launch(
        task.cell, task.engine, task.model, task.model_path, "/b/bin/python", 8000, (0, 1)
    )
    engine = adapter.process(launch, 8000, tmp_path / "log", (0, 1))
    started: list[dict[str, object]] = []

    class _Pipe(io.BytesIO):
        def close(self) -> None:  # keep what was written readable
            pass

    class _CaughtPopen:
        def __init__(self, argv: tuple[str, ...], **kwargs: object) -> None:
            self.stdin = _Pipe()
            started.append({**kwargs, "argv": argv, "pipe": self.stdin})

    monkeypatch.setattr("farm.engines.process.subprocess.Popen", _CaughtPopen)
    engine.start()
    (popen,) = started
    env = popen["env"]
    assert isinstance(env, dict) and env == engine.environment()
    assert not set(DRIVER_SECRETS) & set(env)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1" and env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    # The keeper gets vLLM's command line on stdin and runs it.
    pipe = popen["pipe"]
    assert isinstance(pipe, io.BytesIO)
    assert tuple(json.loads(pipe.getvalue())) == launch.argv
    assert launch.argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    assert popen["start_new_session"] is True


def test_harness_subprocess_sees_none_of_the_drivers_secrets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in DRIVER_SECRETS.items():
        monkeypatch.setenv(name, value)
    printer = "import json, os; print('HARNESS-ENV ' + json.dumps(dict(os.environ)))"
    command = HarnessCommand(
        argv=(sys.executable, "-c", printer),
        env={"OPENAI_API_KEY": "EMPTY", "HF_DATASETS_OFFLINE": "1"},
        output_dir=str(tmp_path),
    )
    asyncio.run(run_harness(command, 30, tmp_path / "harness.log"))
    env = _env_printed(tmp_path / "harness.log", "HARNESS-ENV ")
    assert {k for k, v in env.items() if v in DRIVER_SECRETS.values()} == set()
    assert env["OPENAI_API_KEY"] == "EMPTY" and env["HF_DATASETS_OFFLINE"] == "1"


@pytest.mark.parametrize(
    ("name", "inherited"),
    [
        ("PATH", True),
        ("LC_ALL", True),
        ("ASCEND_RT_VISIBLE_DEVICES", True),
        ("CUDA_VISIBLE_DEVICES", True),
        ("HF_HOME", True),
        ("TORCHINDUCTOR_CACHE_DIR", True),
        ("SGLANG_USE_MODELSCOPE", True),
        ("FARM_HOME", False),
        ("FARM_DB_URL", False),
        ("FARM_NOTIFY_SLACK_URL", False),
        ("RAY_AUTH_TOKEN", False),
        ("RAY_ADDRESS", False),
        ("GITHUB_TOKEN", False),
        ("HF_TOKEN", False),
        ("HUGGING_FACE_HUB_TOKEN", False),
        ("VLLM_API_KEY", False),
        ("AWS_SECRET_ACCESS_KEY", False),
        ("PGPASSWORD", False),
        ("UNRELATED", False),
    ],
)
def test_child_environment_rule(name: str, inherited: bool) -> None:
    assert (name in child_environment({}, {name: "v"})) is inherited
    # The job's own env is explicit and always wins.
    assert child_environment({name: "job"}, {name: "machine"})[name] == "job"


def test_secret_looking_names() -> None:
    assert all(map(looks_secret, ["X_TOKEN", "MY_SECRET", "DB_PASSWORD", "SSH_KEY", "FARM_X"]))
    assert not any(map(looks_secret, ["PATH", "HF_HOME", "KEYBOARD", "OMP_NUM_THREADS"]))


def test_an_engine_that_dies_mid_variant_is_named_in_its_own_words_with_the_known_cause(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    adapter = FakeEngineAdapter("die")
    task = cell_task(tmp_path, [_workload("w", ["good 1", "die 2"], concurrency=1)])
    result = run_with_adapter(monkeypatch, adapter, task)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("EngineError: engine exited with code 1"), result.error
    # What the engine said, then what the farm knows of it: the bundled fix.
    assert "TypeError: 'function' object is not subscriptable" in result.error
    assert result.error.endswith("or set prefix_caching: off)"), result.error
    assert "fix-cpu-mamba-align-spec" in result.error
    _assert_engine_gone(adapter)

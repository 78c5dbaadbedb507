"""Real sweeps: the vLLM CPU engine serving the tiny MTP model, placed by Ray, stored in SQL.

These start real engine servers (about a minute each on 2 cores), so the slices
are small; they still run every stage of the pipeline for real.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from farm import store
from farm.analysis import summarize_sweep
from farm.cli.main import app
from farm.records import BuildInfo, SweepRecord
from farm.spec import JobSpec
from farm.sweep import SweepOptions, run_sweep

pytestmark = pytest.mark.engine


def _slice(job: JobSpec, count: int, **axes: tuple[object, ...]) -> JobSpec:
    workload = job.workloads[0].model_copy(update={"count": count})
    return job.model_copy(
        update={"axes": job.axes.model_copy(update=axes), "workloads": (workload,)}
    )


def _load(url: str, sweep_id: int) -> SweepRecord:
    with store.Session(store.open_store(url)) as session:
        return store.load_sweep(session, sweep_id)


def test_local_slice_measures_real_mtp_and_lands_in_sqlite(
    local_job: JobSpec, engine_build: BuildInfo, farm_home: Path, tmp_path: Path, ray_local: None
) -> None:
    job = _slice(
        local_job,
        8,
        graph_mode=("eager", "compiled"),
        mtp_depth=(0, 3),
        sliding_window=("on",),
        thinking=("on", "off"),
    )
    job = job.model_copy(update={"exclude": ({"graph_mode": "compiled", "mtp_depth": 0},)})
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    outcome = run_sweep(job, "name: slice", SweepOptions(db_url=url, home=farm_home))
    assert outcome.failed == ()
    record = _load(url, outcome.sweep_id)
    results = {c.cell.cell_id: c.result for c in record.cells}
    assert len(results) == 3 and all(r is not None and r.status == "ok" for r in results.values())

    compiled = results["vllm-cpu.tiny-mtp.compiled.mtp3.swa-on"]
    assert compiled is not None and compiled.effective is not None
    assert compiled.effective.graph_mode == "compiled"
    assert compiled.effective.speculative_method == "mtp"
    assert compiled.effective.num_speculative_tokens == 3
    assert compiled.effective.engine_version == "0.32.0"
    eager0 = results["vllm-cpu.tiny-mtp.eager.mtp0.swa-on"]
    assert eager0 is not None and eager0.effective is not None
    assert eager0.effective.graph_mode == "eager"

    for cell_id in (
        "vllm-cpu.tiny-mtp.eager.mtp3.swa-on",
        "vllm-cpu.tiny-mtp.compiled.mtp3.swa-on",
    ):
        result = results[cell_id]
        assert result is not None
        for variant in result.variants:
            counters = variant.counters
            assert len(counters.accepted_per_pos) == 3
            assert counters.mean_acceptance_length is not None
            assert counters.mean_acceptance_length > 1.5, (cell_id, counters)
            # Per-request counters (response body) and server counters (Prometheus
            # deltas) are two independent readings of the same steps.
            per_request = [r.counters for r in variant.requests]
            assert all(c is not None for c in per_request)
            assert sum(c.drafts for c in per_request if c) == counters.drafts
            assert sum(c.accepted for c in per_request if c) == counters.accepted

    rows = summarize_sweep(record)
    spec_rows = [r for r in rows if r.mtp_depth == 3]
    assert all(r.greedy_compared == 8 for r in spec_rows if r.graph_mode == "eager")
    thinking_on = [r for r in rows if r.thinking == "on"]
    assert all(r.accuracy is not None and r.accuracy >= 0.75 for r in thinking_on), thinking_on

    shown = CliRunner().invoke(app, ["report", "latest", "--db", url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "compiled" in shown.output and "0.32.0" not in shown.output


def _kill_first_server_mid_variant(home: Path, stop: threading.Event) -> list[str]:
    """Kill the engine API process of the first cell once it is serving requests."""
    killed: list[str] = []

    def server_of(log: Path) -> tuple[int, int] | None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/fd/1") != str(log):
                    continue
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"vllm.entrypoints.openai.api_server" in argv:
                return int(pid), int(argv[argv.index(b"--port") + 1])
        return None

    def busy(port: int) -> bool:
        try:
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return False
        gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
        return any(
            ln.startswith(gauges) and float(ln.split()[-1]) > 0 for ln in metrics.splitlines()
        )

    # Earlier sweeps in this FARM_HOME (farm selftest's, say) left logs of that name.
    earlier = set(home.glob("logs/sweep-*"))

    def watch() -> None:
        # The server is found once; then /metrics is polled without pause, because the
        # tiny model answers a request in a fraction of a second on an idle machine.
        server: tuple[Path, int, int] | None = None  # log, pid, port
        while not stop.is_set() and not killed:
            if server is None:
                logs = [
                    p
                    for d in sorted(set(home.glob("logs/sweep-*")) - earlier)
                    for p in d.glob("*.mtp1.swa-on.log")
                ]
                found = [(log, *pid_port) for log in logs if (pid_port := server_of(log))]
                if not found:
                    time.sleep(0.05)
                    continue
                server = found[0]
            log, pid, port = server
            if not Path(f"/proc/{pid}").exists():
                return
            if busy(port):
                os.kill(pid, signal.SIGKILL)
                killed.append(log.name)

    threading.Thread(target=watch, daemon=True).start()
    return killed


def test_engine_killed_mid_run_fails_only_its_cell_in_postgres(
    local_job: JobSpec, engine_build: BuildInfo, farm_home: Path, pg_url: str, ray_local: None
) -> None:
    job = _slice(
        local_job,
        12,
        graph_mode=("eager",),
        mtp_depth=(1,),
        sliding_window=("on", "off"),
        thinking=("on",),  # long outputs: the watcher sees requests running
    )
    stop = threading.Event()
    killed = _kill_first_server_mid_variant(farm_home, stop)
    try:
        outcome = run_sweep(job, "name: kill", SweepOptions(db_url=pg_url, home=farm_home))
    finally:
        stop.set()
    assert killed == ["vllm-cpu.tiny-mtp.eager.mtp1.swa-on.log"]
    assert outcome.failed == ("vllm-cpu.tiny-mtp.eager.mtp1.swa-on",)
    assert outcome.ok == ("vllm-cpu.tiny-mtp.eager.mtp1.swa-off",)
    record = _load(pg_url, outcome.sweep_id)
    assert record.status == "failed"
    by_id = {c.cell.cell_id: c.result for c in record.cells}
    dead = by_id["vllm-cpu.tiny-mtp.eager.mtp1.swa-on"]
    assert dead is not None and dead.status == "failed"
    assert dead.error is not None and "engine exited with code -9" in dead.error
    assert dead.log_tail
    alive = by_id["vllm-cpu.tiny-mtp.eager.mtp1.swa-off"]
    assert alive is not None and alive.status == "ok" and len(alive.variants[0].requests) == 12
    # Sliding window off kept the context length: no silent cap to the window.
    assert alive.effective is not None and alive.effective.max_model_len == 512

"""Real sweeps: the vLLM CPU engine serving the tiny MTP model, placed by Ray, stored in SQL.

These start real engine servers (about a minute each on 2 cores), so the slices
are small; they still run every stage of the pipeline for real.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from farm import store
from farm.analysis import summarize_sweep
from farm.cli.main import app
from farm.orchestrate.driver import SweepOptions, run_sweep
from farm.records import BuildInfo, SweepRecord
from farm.report.figures import fmt
from farm.spec import JobSpec, WorkloadSpec

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.engine


def _slice(job: JobSpec, count: int, **axes: tuple[object, ...]) -> JobSpec:
    workload = job.workloads[0].model_copy(update={"count": count})
    return job.model_copy(
        update={"axes": job.axes.model_copy(update=axes), "workloads": (workload,)}
    )


def _load(url: str, sweep_id: int) -> SweepRecord:
    with store.Session(store.open_store(url)) as session:
        return store.load_sweep(session, sweep_id)


@dataclass(frozen=True)
class _Slice:
    url: str
    record: SweepRecord


# The field's prompt sets beside the farm's own: samples of MT-Bench's question.jsonl
# and of a prepared SPEED-Bench subset, written here in their formats.
_STANDARD_SETS = (
    WorkloadSpec(
        name="mt-bench",
        prompts=str(REPO / "workloads" / "mt-bench-sample.jsonl"),
        format="mt-bench",
        count=4,
        max_tokens=48,
    ),
    WorkloadSpec(
        name="speed-bench",
        prompts=str(REPO / "workloads" / "speed-bench-sample" / "qualitative.jsonl"),
        format="speed-bench",
        count=7,
        max_tokens=48,
    ),
)


@pytest.fixture(scope="module")
def local_slice(
    local_job: JobSpec,
    engine_build: BuildInfo,
    farm_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_Slice]:
    """One sweep of three server cells (eager and compiled MTP 3, eager MTP 0), each
    serving the arith workload (thinking on and off) and the two standard sets."""

    job = _slice(
        local_job,
        8,
        graph_mode=("eager", "compiled"),
        mtp_depth=(0, 3),
        sliding_window=("on",),
        thinking=("on", "off"),
    )
    job = job.model_copy(
        update={
            "exclude": ({"graph_mode": "compiled", "mtp_depth": 0},),
            "workloads": (*job.workloads, *_STANDARD_SETS),
        }
    )
    url = f"sqlite:///{tmp_path_factory.mktemp('slice') / 'farm.db'}"
    outcome = run_sweep(job, "name: slice", SweepOptions(db_url=url, home=farm_home))
    assert outcome.failed == ()
    yield _Slice(url, _load(url, outcome.sweep_id))


def test_local_slice_measures_real_mtp_and_lands_in_sqlite(local_slice: _Slice) -> None:
    url, record = local_slice.url, local_slice.record
    results = {c.cell.cell_id: c.result for c in record.cells}
    assert len(results) == 3 and all(r is not None and r.status == "ok" for r in results.values())

    compiled = results["vllm-cpu.tiny-step.compiled.mtp3.swa-on"]
    assert compiled is not None and compiled.effective is not None
    assert compiled.effective.graph_mode == "compiled"
    assert compiled.effective.speculative_method == "mtp"
    assert compiled.effective.num_speculative_tokens == 3
    assert compiled.effective.engine_version == "0.32.0"
    eager0 = results["vllm-cpu.tiny-step.eager.mtp0.swa-on"]
    assert eager0 is not None and eager0.effective is not None
    assert eager0.effective.graph_mode == "eager"

    for cell_id in (
        "vllm-cpu.tiny-step.eager.mtp3.swa-on",
        "vllm-cpu.tiny-step.compiled.mtp3.swa-on",
    ):
        result = results[cell_id]
        assert result is not None
        for variant in result.variants:
            if variant.axes["workload"] != "arith":
                continue
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

    rows = [r for r in summarize_sweep(record) if r.axes.get("workload") == "arith"]
    spec_rows = [r for r in rows if r.mtp_depth == 3]
    assert all(r.greedy_compared == 8 for r in spec_rows if r.axes["graph_mode"] == "eager")
    thinking_on = [r for r in rows if r.axes.get("thinking") == "on"]
    assert all(r.accuracy is not None and r.accuracy >= 0.75 for r in thinking_on), thinking_on

    shown = CliRunner().invoke(app, ["report", "latest", "--db", url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "compiled" in shown.output and "0.32.0" not in shown.output


def test_standard_prompt_sets_give_acceptance_by_category(
    local_slice: _Slice, tmp_path: Path
) -> None:
    """MT-Bench's two turns and SPEED-Bench's messages are sent as conversations, each
    request keeps its category through the store, and the per-category figures add up
    to the variant's own per-request counters."""
    rows = summarize_sweep(local_slice.record)
    for workload, requests, categories in (
        ("mt-bench", 8, ["math", "reasoning", "roleplay", "writing"]),
        ("speed-bench", 8, ["coding", "math", "multilingual", "qa", "summarization"]),
    ):
        spec_rows = [r for r in rows if r.axes.get("workload") == workload and r.mtp_depth == 3]
        assert len(spec_rows) == 4  # eager and compiled, thinking on and off
        for row in spec_rows:
            assert row.requests == requests and not row.failed_requests, row
            assert [c.category for c in row.categories] == categories
            assert sum(c.requests for c in row.categories) == requests
            # The tiny model was trained on arithmetic: a prose prompt may be answered
            # in a token or two, with no draft to verify; its math prompts always draft.
            by_name = {c.category: c for c in row.categories}
            assert by_name["math"].drafts > 0
            for c in row.categories:
                if c.drafts:
                    assert c.mean_acceptance_length is not None
                    assert 1.0 <= c.mean_acceptance_length <= 4.0
                    assert len(c.per_position) == 3
                else:
                    assert c.mean_acceptance_length is None and c.per_position == ()
            figures = (
                f"{c.category} AL {fmt(c.mean_acceptance_length, 2)} ({c.drafts} drafts)"
                for c in row.categories
            )
            print(f"{row.label}: " + "; ".join(figures))
    for stored in local_slice.record.cells:
        assert stored.result is not None
        for v in stored.result.variants:
            drafts = sum(r.counters.drafts for r in v.requests if r.counters)
            if v.axes["workload"] == "arith":
                assert all(r.category is None for r in v.requests)
            elif drafts:
                assert {r.category for r in v.requests} >= {"math"}
                assert drafts == v.counters.drafts
    shown = CliRunner().invoke(
        app, ["report", "latest", "--db", local_slice.url], env={"COLUMNS": "80"}
    )
    assert shown.exit_code == 0, shown.output
    assert "acceptance by category" in shown.output and "summarization" in shown.output
    page = tmp_path / "sweep.html"
    written = CliRunner().invoke(
        app, ["report", "latest", "--db", local_slice.url, "--format", "html", "--out", str(page)]
    )
    assert written.exit_code == 0, written.output
    assert "Acceptance by category" in page.read_text()


def _parent(pid: int) -> int | None:
    try:
        # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class _Killer:
    """Kills the engine API process of the first mtp1/swa-on cell once it serves requests.

    Each pass looks the server up again (a start retried on another port is a new
    process) and polls its /metrics; ``seen`` counts, per (pid, port), the polls and
    the busy ones, to say what happened when no kill came.
    """

    def __init__(self, home: Path) -> None:
        # Earlier sweeps in this FARM_HOME (farm selftest's, say) left logs of that name.
        self.earlier = set(home.glob("logs/sweep-*"))
        self.home = home
        self.killed: list[str] = []
        self.seen: dict[tuple[int, int], list[int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _servers(self) -> list[tuple[Path, int, int]]:
        logs = {
            str(p): p
            for d in set(self.home.glob("logs/sweep-*")) - self.earlier
            for p in d.glob("*.mtp1.swa-on.log")
        }
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                log = logs.get(os.readlink(f"/proc/{pid}/fd/1"))
                if log is None:
                    continue
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"vllm.entrypoints.openai.api_server" in argv and b"--port" in argv:
                found.append((log, int(pid), int(argv[argv.index(b"--port") + 1])))
        # A child forked by the server (its engine core) shares its command line and
        # log: the server is the one whose parent is not among them.
        pids = {pid for _, pid, _ in found}
        return [f for f in found if _parent(f[1]) not in pids]

    @staticmethod
    def _busy(port: int) -> bool:
        try:
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return False
        gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
        return any(
            ln.startswith(gauges) and float(ln.split()[-1]) > 0 for ln in metrics.splitlines()
        )

    def _watch(self) -> None:
        # No pause between polls: the tiny model answers a request in a fraction of a
        # second on an idle machine.
        while not self.stop.is_set() and not self.killed:
            servers = self._servers()
            if not servers:
                time.sleep(0.05)
            for log, pid, port in servers:
                busy = self._busy(port)
                counts = self.seen.setdefault((pid, port), [0, 0])
                counts[0] += 1
                counts[1] += busy
                if busy:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        self.killed.append(log.name)
                    break


def test_engine_killed_mid_run_fails_only_its_cell_in_postgres(
    local_job: JobSpec, engine_build: BuildInfo, farm_home: Path, pg_url: str, ray_local: None
) -> None:
    job = _slice(
        local_job,
        24,
        graph_mode=("eager",),
        mtp_depth=(1,),
        sliding_window=("on", "off"),
        thinking=("on",),  # long outputs: the watcher sees requests running
    )
    killer = _Killer(farm_home)
    try:
        outcome = run_sweep(job, "name: kill", SweepOptions(db_url=pg_url, home=farm_home))
    finally:
        killer.stop.set()
    # seen: (pid, port) of each server found -> [polls, busy polls]
    assert killer.killed == ["vllm-cpu.tiny-step.eager.mtp1.swa-on.log"], killer.seen
    assert outcome.failed == ("vllm-cpu.tiny-step.eager.mtp1.swa-on",)
    assert outcome.ok == ("vllm-cpu.tiny-step.eager.mtp1.swa-off",)
    record = _load(pg_url, outcome.sweep_id)
    assert record.status == "failed"
    by_id = {c.cell.cell_id: c.result for c in record.cells}
    dead = by_id["vllm-cpu.tiny-step.eager.mtp1.swa-on"]
    assert dead is not None and dead.status == "failed"
    assert dead.error is not None and "engine exited with code -9" in dead.error
    assert dead.log_tail
    alive = by_id["vllm-cpu.tiny-step.eager.mtp1.swa-off"]
    assert alive is not None and alive.status == "ok" and len(alive.variants[0].requests) == 24
    # Sliding window off kept the context length: no silent cap to the window.
    assert alive.effective is not None and alive.effective.max_model_len == 512

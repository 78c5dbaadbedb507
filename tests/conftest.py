"""Test-run wiring shared by unit and integration tests.

`make test` runs the suite on two pytest-xdist workers. Real-engine tests (marker
``engine``) all go to one worker, one after another: two vLLM servers on two cores
would only slow each other down, while the rest of the suite (mostly waiting on
subprocesses, Ray and databases) runs beside them on the other worker. Each worker
gets its own FARM_HOME below the run's: engine builds, Ray clusters shared per
FARM_HOME and logs then never mix between tests running at the same time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    home = os.environ.get("FARM_HOME")
    if worker and home:
        os.environ["FARM_HOME"] = str(Path(home) / worker)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group("engine"))

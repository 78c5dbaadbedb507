"""Shared fixtures of the integration tests: the real engine build and a Ray cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.builds import ensure_build
from farm.records import BuildInfo
from farm.spec import JobSpec, load_job

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def farm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FARM_HOME of the run (CI sets a fresh one); the engine build is cached there."""
    home = os.environ.get("FARM_HOME")
    return Path(home) if home else tmp_path_factory.mktemp("farm-home")


@pytest.fixture(scope="session")
def local_job() -> JobSpec:
    return load_job(REPO / "jobs" / "local.yaml")


@pytest.fixture(scope="session")
def engine_build(local_job: JobSpec, farm_home: Path) -> BuildInfo:
    """The real vLLM CPU build of jobs/local.yaml, built once per test session."""
    return ensure_build(local_job.engines[0], farm_home / "cache", print)


@pytest.fixture()
def ray_local() -> Iterator[None]:
    import ray

    yield
    if ray.is_initialized():
        ray.shutdown()

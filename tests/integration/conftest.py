"""Shared fixtures of the integration tests: the real engine build and a Ray cluster."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from farm.builds import ensure_build
from farm.records import BuildInfo
from farm.spec import JobSpec, load_job

REPO = Path(__file__).resolve().parents[2]
PG_ADMIN_URL_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    url = os.environ.get("FARM_TEST_PG_URL", PG_ADMIN_URL_DEFAULT)
    try:
        with psycopg.connect(url, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {url} (set FARM_TEST_PG_URL): {exc}")
    return url


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    name = f"farm_store_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = sa.make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            # FORCE: a test that failed mid-way may leave a pooled connection open.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


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


@pytest.fixture(scope="session", autouse=True)
def engine_run_ray(request: pytest.FixtureRequest, farm_home: Path) -> Iterator[bool]:
    """One Ray instance for a run of the engine tests alone (``-m engine``): every sweep
    they start, through the CLI or not, uses it (the farm leaves a Ray its caller set up
    to the caller), instead of starting and stopping the host's cluster each time (about
    7 s a sweep on 2 cores, over thirty sweeps). Their own starting, joining and stopping
    of the host's cluster is the other tests' to prove; a run that mixes the two kinds
    keeps the farm's own way for both."""
    items = request.session.items
    if not items or not all(item.get_closest_marker("engine") for item in items):
        yield False
        return
    import ray

    from farm.orchestrate.worker_lines import settle_worker_lines
    from farm.paths import ray_temp_dir

    settle_worker_lines()
    ray.init(
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        _temp_dir=str(ray_temp_dir(farm_home)),
        log_to_driver=True,
    )
    try:
        yield True
    finally:
        ray.shutdown()


@pytest.fixture()
def ray_local(engine_run_ray: bool) -> Iterator[None]:
    import ray

    yield
    if ray.is_initialized() and not engine_run_ray:
        ray.shutdown()

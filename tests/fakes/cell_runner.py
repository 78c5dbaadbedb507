"""A FAKE cell runner and a FAKE builder for orchestration tests and the scheduling bench.

The runner starts no engine: it sleeps for the cell's ``FAKE_CELL_SECONDS`` (engine
env) and reports where Ray placed it (node, node labels, NPU ids,
ASCEND_RT_VISIBLE_DEVICES, the cluster's CPUs), so placement, retries and scheduling
can be tested on any machine. The builder installs nothing but writes a real build
marker, so the cache sees a finished build. Never used by `farm run`: it lives beside
the tests, and nothing in ``farm/`` imports it (``tests/unit/test_test_imports.py``).
Ray runs it in its workers by module path, as it does ``tests/fakes/engine_worker.py``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import ray
from filelock import FileLock

from farm.builds.cache import write_marker
from farm.errors import BuildError
from farm.records import BuildInfo, CellResult, EffectiveConfig
from farm.runner import CellTask
from farm.spec import EngineSpec

__all__ = ["fake_build", "fake_run_cell"]


def fake_run_cell(task: CellTask, npu_ids: tuple[int, ...], node: str) -> CellResult:
    """Pretend to run ``task``: sleep, then describe the placement in the result's notes."""
    started = datetime.now(UTC)
    if "FAKE_STARTED_DIR" in task.engine.env:  # lets a test act while the cell runs
        marker = Path(task.engine.env["FAKE_STARTED_DIR"], task.cell.cell_id)
        marker.write_text(ray.get_runtime_context().get_node_id())
    if "FAKE_WAIT_FOR" in task.engine.env:  # lets a test hold cells until it is ready
        go = Path(task.engine.env["FAKE_WAIT_FOR"])
        deadline = time.monotonic() + 600
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    time.sleep(float(task.engine.env.get("FAKE_CELL_SECONDS", "0")))
    labels = ray.get_runtime_context().get_node_labels()
    notes = (
        f"node_id={ray.get_runtime_context().get_node_id()}",
        f"pool={labels.get('pool', '')}",
        f"npu_ids={','.join(str(i) for i in npu_ids)}",
        f"ASCEND_RT_VISIBLE_DEVICES={os.environ.get('ASCEND_RT_VISIBLE_DEVICES', '')}",
        f"cluster_cpus={ray.cluster_resources().get('CPU', 0):g}",  # type: ignore[no-untyped-call]
    )
    return CellResult(
        cell_id=task.cell.cell_id,
        status="ok",
        started_at=started,
        finished_at=datetime.now(UTC),
        node=node,
        effective=EffectiveConfig(notes=notes),
        startup_s=0.0,
        generation_s=float(task.engine.env.get("FAKE_CELL_SECONDS", "0")),
    )


def fake_build(engine: EngineSpec, cache_dir: Path, say: Callable[[str], None]) -> BuildInfo:
    """A FAKE build: an empty folder with a marker, made once per cache folder.

    Counts its real builds in ``cache_dir/fake-builds.log`` (one line per build,
    with the node), so tests can check that each node built once. On a node labelled
    ``fake-build: slow`` it first sleeps the engine env's ``FAKE_SLOW_BUILD_SECONDS``;
    on one labelled ``fake-build: broken`` it fails.
    """
    labels = ray.get_runtime_context().get_node_labels() if ray.is_initialized() else {}
    role = str(labels.get("fake-build", ""))  # Ray's stub says list; it is the label's value
    if role == "broken":
        raise BuildError(f"FAKE build of {engine.name} failed on this node, as labelled")
    if role == "slow":
        time.sleep(float(engine.env.get("FAKE_SLOW_BUILD_SECONDS", "0")))
    env_dir = cache_dir / "builds" / f"fake-{engine.name}"
    info = BuildInfo(
        build_id=f"fake-{engine.name}",
        engine=engine.name,
        family=engine.family,
        package=engine.package,
        version=engine.version,
        python=sys.executable,
        env_dir=str(env_dir),
    )
    with FileLock(str(env_dir.with_suffix(".lock"))):
        if not (env_dir / "build.json").exists():
            env_dir.mkdir(parents=True, exist_ok=True)
            say(f"fake build of {engine.name} into {env_dir}")
            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "-"
            with open(cache_dir / "fake-builds.log", "a") as log:
                log.write(f"{engine.name} {node}\n")
            write_marker(env_dir, info)
    return info

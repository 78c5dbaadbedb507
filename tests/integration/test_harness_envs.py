"""The harnesses' own environments, built for real from the package index.

Each is built once per FARM_HOME cache (the engine tests of the same run share it, so
whichever run gets there first builds and the other finds it ready) and must import
its harness with the pins that keep it working: AISBench with the CPU torch and numpy
below 2 beside a pyarrow that loads with it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from farm.workload.harness_envs import ensure_harness_env, harness_env_dir


@pytest.fixture(scope="module")
def cache(farm_home: Path) -> Path:
    return farm_home / "cache"


def _version(python: Path, module: str) -> str:
    probe = f"import {module}; print({module}.__version__)"
    return subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_aisbench_gets_the_cpu_torch_and_a_numpy_1_it_loads_with(cache: Path) -> None:
    python = ensure_harness_env("aisbench", cache, print)
    assert python == harness_env_dir("aisbench", cache) / "bin" / "python"
    assert _version(python, "torch").endswith("+cpu")
    assert _version(python, "numpy").startswith("1.")
    assert _version(python, "pyarrow").startswith("20.")
    assert (python.parent / "ais_bench").exists()
    assert not list(python.parent.parent.glob("lib/python*/site-packages/nvidia"))


def test_evalscope_has_its_cli_and_a_second_ask_builds_nothing(cache: Path) -> None:
    python = ensure_harness_env("evalscope", cache, print)
    assert (python.parent / "evalscope").exists()
    assert _version(python, "numpy").startswith("2.")
    said: list[str] = []
    assert ensure_harness_env("evalscope", cache, said.append) == python
    assert said == []  # found ready: no build step ran

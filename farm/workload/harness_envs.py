"""A virtual environment per eval harness that cannot share the farm's own.

AISBench pins numpy below 2 and pulls torch and transformers; evalscope wants numpy 2
and its own transformers: neither can live in the farm's interpreter nor beside the
other. Each gets a virtual environment under ``FARM_HOME/cache/harnesses``, named by
the hash of what it installs, built once per node (file lock, like the engine builds)
with the builds' pip deadline and environment (no secrets). lm-eval runs in the
farm's own interpreter (its ``harness`` extra).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from farm.builds.cache import removed_on_failure
from farm.builds.environment import run_logged
from farm.errors import BuildError
from farm.spec.parts import HarnessTool

__all__ = ["HARNESS_REQUIREMENTS", "ensure_harness_env", "harness_env_dir"]

# What each harness's environment installs, in one pip command. AISBench requires an
# unpinned torch: the CPU build the engine uses keeps pip from fetching a GPU one
# (3 GiB of CUDA libraries for a harness that only sends HTTP requests); it pins
# numpy below 2, which pyarrow from 21 on no longer loads with.
HARNESS_REQUIREMENTS: dict[HarnessTool, tuple[str, ...]] = {
    "aisbench": ("torch==2.13.0", "ais-bench-benchmark==3.1.20260630", "pyarrow==20.0.0"),
    "evalscope": ("evalscope==1.14.1",),
}
_IMPORT_CHECK = {
    "aisbench": "import ais_bench.benchmark.cli.main",
    "evalscope": "import evalscope.cli.cli",
}
_MARKER = ".farm-harness-ready"


def harness_env_dir(tool: HarnessTool, cache_dir: Path) -> Path:
    """Where ``tool``'s environment lives: named by what it installs and the Python."""
    recipe = {
        "requirements": HARNESS_REQUIREMENTS[tool],
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir / "harnesses" / f"{tool}-{digest}"


def ensure_harness_env(
    tool: HarnessTool, cache_dir: Path, say: Callable[[str], None] | None = None
) -> Path:
    """The Python of ``tool``'s environment, built under ``cache_dir`` when missing.

    Concurrent callers wait on a file lock and build it once. Raises BuildError with
    pip's own output (after one retry) or the import check's.
    """
    if tool not in HARNESS_REQUIREMENTS:
        raise BuildError(f"harness {tool} runs in the farm's own interpreter, not in its own")
    sink = say or (lambda _line: None)
    env_dir = harness_env_dir(tool, cache_dir)
    python = env_dir / "bin" / "python"
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(env_dir.with_suffix(".lock"))):
        if (env_dir / _MARKER).exists() and python.exists():
            return python
        shutil.rmtree(env_dir, ignore_errors=True)
        with removed_on_failure(env_dir):
            sink(f"building the {tool} harness environment into {env_dir}")
            run_logged(
                [sys.executable, "-m", "venv", str(env_dir)],
                f"create the {tool} harness environment",
                sink,
            )
            pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
            run_logged(
                [*pip, "install", *HARNESS_REQUIREMENTS[tool]], f"install {tool}", sink, retry=True
            )
            run_logged([str(python), "-c", _IMPORT_CHECK[tool]], f"import {tool}", sink)
            (env_dir / _MARKER).write_text(" ".join(HARNESS_REQUIREMENTS[tool]) + "\n")
    return python

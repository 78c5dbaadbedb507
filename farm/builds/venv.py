"""Build an engine into its own virtual environment, once per content hash.

Template (after asv's environment classes): check cache -> build -> install ->
verify -> finalize. The finished marker (`build.json`) is written last, so a
build interrupted at any step is rebuilt from scratch next time.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from farm.builds.cache import MARKER, touch_build
from farm.engines import adapter_for
from farm.engines.base import BuildRecipe
from farm.errors import BuildError
from farm.records import BuildInfo
from farm.spec import EngineSpec

__all__ = ["build_id", "ensure_build"]

LineSink = Callable[[str], None]


def build_id(engine: EngineSpec, recipe: BuildRecipe) -> str:
    """Hash of everything that decides the environment's contents."""
    payload = {
        "family": engine.family,
        "recipe": recipe.model_dump(mode="json"),
        "patches": list(engine.patches),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def ensure_build(engine: EngineSpec, cache_dir: Path, on_line: LineSink | None = None) -> BuildInfo:
    """Return the ready build of ``engine``, building it under ``cache_dir`` if needed.

    Concurrent callers (threads or processes) asking for the same build wait on a
    file lock and build it once. Raises BuildError with the installer's own output
    when a step fails twice.
    """
    if engine.patches:
        raise BuildError(
            f"engine {engine.name}: patch series are not supported by this farm version"
        )
    recipe = adapter_for(engine.family).build_recipe(engine)
    bid = build_id(engine, recipe)
    root = cache_dir / "builds"
    root.mkdir(parents=True, exist_ok=True)
    env_dir = root / bid
    info = BuildInfo(
        build_id=bid,
        engine=engine.name,
        family=engine.family,
        package=engine.package,
        version=engine.version,
        pins=engine.pins,
        patches=engine.patches,
        python=str(env_dir / "bin" / "python"),
        env_dir=str(env_dir),
        node=platform.node(),
    )
    with FileLock(str(root / f"{bid}.lock")):
        if (env_dir / MARKER).exists() and Path(info.python).exists():
            touch_build(env_dir)
            return info
        say = on_line or (lambda _line: None)
        shutil.rmtree(env_dir, ignore_errors=True)
        say(f"building {engine.name} ({engine.package}=={engine.version}) into {env_dir}")
        _run([sys.executable, "-m", "venv", str(env_dir)], "create the virtual environment", say)
        pip = [info.python, "-m", "pip", "--disable-pip-version-check"]
        _run_with_retry([*pip, "install", *recipe.requirements], "install the engine", say)
        if recipe.remove:
            _run([*pip, "uninstall", "-y", *recipe.remove], "remove unusable packages", say)
        _run([info.python, "-c", recipe.import_check], "import the engine", say)
        (env_dir / MARKER).write_text(info.model_dump_json(indent=2))
        touch_build(env_dir)
        return info


def _run_with_retry(argv: list[str], what: str, say: LineSink) -> None:
    try:
        _run(argv, what, say)
    except BuildError as first:
        say(f"retrying once: {first}".splitlines()[0])
        _run(argv, what, say)


def _run(argv: list[str], what: str, say: LineSink) -> None:
    tail: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        # pip's find-links warnings repeat per package and say nothing useful.
        if not line or "is ignored: it is neither a file nor a directory" in line:
            continue
        tail = ([*tail, line])[-30:]
        say(line)
    if proc.wait() != 0:
        raise BuildError(
            f"could not {what} (exit {proc.returncode}): {' '.join(argv)}\n" + "\n".join(tail)
        )

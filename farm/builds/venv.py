"""Build an engine into its own virtual environment, once per content hash.

Template (after asv's environment classes): check cache -> build -> install ->
verify -> finalize. The finished marker (`build.json`) is written last, so a build
interrupted at any step is rebuilt from scratch next time.

A patched build is derived from its unpatched base without reinstalling anything:
the base environment is copied as hard links and only the files the patches touch
become new files (the patch engine replaces files, never writes through a link).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from farm.builds.cache import MARKER, touch_build
from farm.builds.patches import apply_patch_series
from farm.builds.series import Patch, Target, bundled_patches_dir, load_series, select_patches
from farm.engines import adapter_for
from farm.engines.base import BuildRecipe
from farm.errors import BuildError
from farm.records import BuildInfo
from farm.spec import EngineSpec

__all__ = ["build_id", "ensure_build", "patches_of"]

LineSink = Callable[[str], None]
_PATCHED = "patched-files.json"


def _hash(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def patches_of(engine: EngineSpec) -> tuple[Patch, ...]:
    """The bundled patches a job names for ``engine`` (``patches/<package>/series.yaml``)."""
    if not engine.patches:
        return ()
    return select_patches(load_series(bundled_patches_dir() / engine.package), engine.patches)


def build_id(engine: EngineSpec, recipe: BuildRecipe, patches: tuple[Patch, ...] = ()) -> str:
    """Hash of everything that decides the environment's contents, patch texts included."""
    base = _hash(
        {
            "family": engine.family,
            "recipe": recipe.model_dump(mode="json"),
            "patches": [],  # kept so that base build ids stay what they were
            "python": platform.python_version(),
            "platform": f"{sys.platform}-{platform.machine()}",
        }
    )
    if not patches:
        return base
    texts = [(p.id, hashlib.sha256(Path(p.diff_path).read_bytes()).hexdigest()) for p in patches]
    return _hash({"base": base, "patches": texts})


def ensure_build(engine: EngineSpec, cache_dir: Path, on_line: LineSink | None = None) -> BuildInfo:
    """Return the ready build of ``engine``, building it under ``cache_dir`` if needed.

    Concurrent callers (threads or processes) asking for the same build wait on a
    file lock and build it once. A patched build whose patched files no longer match
    their recorded hashes is rebuilt. Raises BuildError with the installer's own
    output when a step fails twice, or PatchError with the failing hunk.
    """
    say = on_line or (lambda _line: None)
    patches = patches_of(engine)
    base = _ensure_base(engine.model_copy(update={"patches": ()}), cache_dir, say)
    if not patches:
        return base
    recipe = adapter_for(engine.family).build_recipe(engine)
    env_dir = cache_dir / "builds" / build_id(engine, recipe, patches)
    info = base.model_copy(
        update={
            "build_id": env_dir.name,
            "engine": engine.name,
            "patches": engine.patches,
            "python": str(env_dir / "bin" / "python"),
            "env_dir": str(env_dir),
        }
    )
    with FileLock(str(env_dir.with_suffix(".lock"))):
        if (env_dir / MARKER).exists():
            damage = _damage(env_dir)
            if damage is None:
                touch_build(env_dir)
                return info
            say(f"cached build {env_dir.name} is damaged ({damage}): rebuilding it")
        shutil.rmtree(env_dir, ignore_errors=True)
        say(f"deriving {engine.name} from base build {base.build_id} (hard links)")
        staging = env_dir.with_name(env_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(base.env_dir, staging, symlinks=True, copy_function=os.link)
        (staging / MARKER).unlink(missing_ok=True)
        site = _site_packages(staging)
        target = Target(version=engine.version, tree="package")
        canaries = [p.id for p in patches if p.purpose == "canary"]
        outcomes = apply_patch_series(patches, site, target, canaries=canaries)
        for outcome in outcomes:
            if outcome.state == "not_applicable":
                shutil.rmtree(staging, ignore_errors=True)
                raise BuildError(
                    f"patch {outcome.patch_id} does not apply to "
                    f"{engine.package} {engine.version}: {outcome.detail}"
                )
            say(f"patch {outcome.patch_id}: {outcome.state} {outcome.detail}".rstrip())
        touched = sorted({f for o in outcomes for f in o.files})
        (staging / _PATCHED).write_text(
            json.dumps({f: _sha256(site / f) for f in touched}, indent=1)
        )
        staging.rename(env_dir)
        site = _site_packages(env_dir)
        # The base passed the import check and only these files changed: compiling
        # them catches a broken patch in milliseconds instead of a 10 s engine import.
        py_files = [str(site / f) for f in touched if f.endswith(".py")]
        if py_files:
            _run([info.python, "-m", "py_compile", *py_files], "compile the patched files", say)
        (env_dir / MARKER).write_text(info.model_dump_json(indent=2))
        touch_build(env_dir)
        return info


def _ensure_base(engine: EngineSpec, cache_dir: Path, say: LineSink) -> BuildInfo:
    recipe = adapter_for(engine.family).build_recipe(engine)
    root = cache_dir / "builds"
    root.mkdir(parents=True, exist_ok=True)
    env_dir = root / build_id(engine, recipe)
    info = BuildInfo(
        build_id=env_dir.name,
        engine=engine.name,
        family=engine.family,
        package=engine.package,
        version=engine.version,
        pins=engine.pins,
        python=str(env_dir / "bin" / "python"),
        env_dir=str(env_dir),
        node=platform.node(),
    )
    with FileLock(str(env_dir.with_suffix(".lock"))):
        if (env_dir / MARKER).exists() and Path(info.python).exists():
            touch_build(env_dir)
            return info
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


def _site_packages(env_dir: Path) -> Path:
    version = sysconfig.get_python_version()
    return env_dir / "lib" / f"python{version}" / "site-packages"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _damage(env_dir: Path) -> str | None:
    """Why a patched build's files differ from what was recorded, or None if intact."""
    try:
        recorded: dict[str, str] = json.loads((env_dir / _PATCHED).read_text())
    except (OSError, ValueError):
        return f"{_PATCHED} is missing or unreadable"
    site = _site_packages(env_dir)
    for rel, digest in recorded.items():
        if not (site / rel).is_file() or _sha256(site / rel) != digest:
            return f"{rel} changed since it was patched"
    return None


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
    for raw in proc.stdout:
        line = raw.rstrip()
        # pip's find-links warnings repeat per package and say nothing useful.
        if not line or "is ignored: it is neither a file nor a directory" in line:
            continue
        tail = [*tail, line][-30:]
        say(line)
    if proc.wait() != 0:
        raise BuildError(
            f"could not {what} (exit {proc.returncode}): {' '.join(argv)}\n" + "\n".join(tail)
        )

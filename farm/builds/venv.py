"""Build an engine into its own virtual environment, once per content hash.

Template (after asv's environment classes): check cache -> build -> install ->
verify -> finalize. The finished marker (`build.json`) is written last, so a build
interrupted at any step is rebuilt from scratch next time.

A patched build is derived from its unpatched base without reinstalling anything:
the base environment is copied as hard links and only the files the patches touch
become new files (the patch engine replaces files, never writes through a link).

The engine's source (a PyPI release, a wheel, a tree, a git ref or pull request;
see :mod:`farm.builds.sources`) enters the build id by its content: the wheel's
sha256, the tree's hash or the commit, never a path or a branch name.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

from farm.builds.cache import MARKER, SOURCE_FILE, read_marker, touch_build, write_marker
from farm.builds.environment import (
    StepTimeoutError,
    build_environment,
    mask_argv,
    mask_text,
    run_step,
    stream_step,
)
from farm.builds.patches import apply_patch_series
from farm.builds.series import Patch, Target, bundled_patches_dir, load_series, select_patches
from farm.builds.sources import ResolvedSource, installable, resolve_source
from farm.engines import adapter_for
from farm.engines.base import BuildRecipe
from farm.errors import BuildError, FarmError
from farm.fileformat import UnreadableFileError
from farm.records import BuildInfo
from farm.settings import get_settings
from farm.spec import EngineSpec

__all__ = ["PlannedBuild", "build_id", "ensure_build", "patches_of", "plan_builds"]

LineSink = Callable[[str], None]
_PATCHED = "patched-files.json"


def _hash(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def patches_of(engine: EngineSpec) -> tuple[Patch, ...]:
    """The bundled patches a job names for ``engine`` (``patches/<package>/series.yaml``)."""
    if not engine.patches:
        return ()
    return select_patches(load_series(bundled_patches_dir() / engine.package), engine.patches)


def build_id(
    engine: EngineSpec,
    recipe: BuildRecipe,
    patches: tuple[Patch, ...] = (),
    source: ResolvedSource | None = None,
) -> str:
    """Hash of everything that decides the environment's contents, patch texts included.

    ``source`` (from :func:`resolve_source`) is required unless the engine comes from
    PyPI; its identity replaces the ``package==version`` requirement of the recipe.
    """
    base = _hash(
        {
            "family": engine.family,
            "recipe": _sourced(recipe, engine, source, key=True).model_dump(mode="json"),
            "patches": [],  # kept so that base build ids stay what they were
            "python": platform.python_version(),
            "platform": f"{sys.platform}-{platform.machine()}",
        }
    )
    if not patches:
        return base
    texts = [(p.id, hashlib.sha256(Path(p.diff_path).read_bytes()).hexdigest()) for p in patches]
    return _hash({"base": base, "patches": texts})


class PlannedBuild(BaseModel):
    """What ``farm plan`` shows of one engine's build: its id, or why it has none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str
    build_id: str | None
    source: str
    patches: tuple[str, ...] = ()
    error: str | None = None


def plan_builds(engines: Sequence[EngineSpec]) -> tuple[PlannedBuild, ...]:
    """The build id of each engine, resolving sources without downloading them.

    A source that cannot be resolved (no network, a missing ref) gives a PlannedBuild
    with ``error`` set rather than failing the whole plan.
    """
    planned = []
    for engine in engines:
        try:
            source = resolve_source(engine)
            recipe = adapter_for(engine.family).build_recipe(engine)
            bid = build_id(engine, recipe, patches_of(engine), source)
        except FarmError as exc:
            planned.append(
                PlannedBuild(engine=engine.name, build_id=None, source="?", error=str(exc))
            )
            continue
        planned.append(
            PlannedBuild(
                engine=engine.name, build_id=bid, source=source.label, patches=engine.patches
            )
        )
    return tuple(planned)


def ensure_build(engine: EngineSpec, cache_dir: Path, on_line: LineSink | None = None) -> BuildInfo:
    """Return the ready build of ``engine``, building it under ``cache_dir`` if needed.

    Concurrent callers (threads or processes) asking for the same build wait on a
    file lock and build it once. A patched build whose patched files no longer match
    their recorded hashes is rebuilt. Raises BuildError with the installer's own
    output when a step fails twice, SourceError when the source cannot be found or
    fetched, or PatchError with the failing hunk.
    """
    say = on_line or (lambda _line: None)
    source = resolve_source(engine)
    patches = patches_of(engine)
    base = _ensure_base(engine.model_copy(update={"patches": ()}), source, cache_dir, say)
    if not patches:
        return base
    recipe = adapter_for(engine.family).build_recipe(engine)
    env_dir = cache_dir / "builds" / build_id(engine, recipe, patches, source)
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
        # The declared release, else what pip installed (a git build's own version).
        version = source.version or (base.version if base.version != _UNKNOWN else None)
        target = Target(version=version, commit=source.commit, tree="package")
        canaries = [p.id for p in patches if p.purpose == "canary"]
        outcomes = apply_patch_series(patches, site, target, canaries=canaries)
        for outcome in outcomes:
            if outcome.state == "not_applicable":
                shutil.rmtree(staging, ignore_errors=True)
                raise BuildError(
                    f"patch {outcome.patch_id} does not apply to "
                    f"{engine.package} {target.label} ({source.label}): {outcome.detail}"
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
        write_marker(env_dir, info)
        touch_build(env_dir)
        return info


def _ensure_base(
    engine: EngineSpec, source: ResolvedSource, cache_dir: Path, say: LineSink
) -> BuildInfo:
    recipe = adapter_for(engine.family).build_recipe(engine)
    root = cache_dir / "builds"
    root.mkdir(parents=True, exist_ok=True)
    env_dir = root / build_id(engine, recipe, source=source)
    info = BuildInfo(
        build_id=env_dir.name,
        engine=engine.name,
        family=engine.family,
        package=engine.package,
        version=source.version or _UNKNOWN,
        pins=engine.pins,
        python=str(env_dir / "bin" / "python"),
        env_dir=str(env_dir),
        node=platform.node(),
        source=source.identity,
    )
    with FileLock(str(env_dir.with_suffix(".lock"))):
        if (env_dir / MARKER).exists() and Path(info.python).exists():
            cached = _cached_info(env_dir, info, say)
            if cached is not None:
                touch_build(env_dir)
                return cached
        shutil.rmtree(env_dir, ignore_errors=True)
        say(f"building {engine.name} ({source.label}) into {env_dir}")
        _run([sys.executable, "-m", "venv", str(env_dir)], "create the virtual environment", say)
        pip = [info.python, "-m", "pip", "--disable-pip-version-check"]
        with installable(engine, source, cache_dir, say) as requirement:
            argv = [*pip, "install", *_sourced(recipe, engine, source, requirement).requirements]
            _run_with_retry(argv, "install the engine", say)
        if recipe.remove:
            _run([*pip, "uninstall", "-y", *recipe.remove], "remove unusable packages", say)
        _run([info.python, "-c", recipe.import_check], "import the engine", say)
        if source.kind != "pypi":
            info = info.model_copy(update={"version": _installed_version(info, say)})
        location = mask_text(source.location) if source.location else None
        recorded = source.model_copy(update={"location": location})
        (env_dir / SOURCE_FILE).write_text(recorded.model_dump_json(indent=2))
        write_marker(env_dir, info)
        touch_build(env_dir)
        return info


def _sourced(
    recipe: BuildRecipe,
    engine: EngineSpec,
    source: ResolvedSource | None,
    requirement: str | None = None,
    *,
    key: bool = False,
) -> BuildRecipe:
    """``recipe`` installing ``source`` instead of ``package==version`` from PyPI.

    With ``key`` the requirement is the source's identity (for the build id);
    otherwise ``requirement``, the installable reference. A PyPI source leaves the
    recipe as the adapter wrote it, so PyPI build ids are what they always were.
    """
    if engine.source.kind == "pypi":
        return recipe
    if source is None:
        raise BuildError(f"engine {engine.name}: the build id needs its resolved source")
    adapter_req = f"{engine.package}=={engine.version}"
    if adapter_req not in recipe.requirements:
        raise BuildError(
            f"engine {engine.name}: the {engine.family} recipe does not install "
            f"{adapter_req}, so the {source.kind} source cannot replace it"
        )
    new = source.requirement_key(engine.package) if key else requirement
    assert new is not None
    reqs = tuple(new if r == adapter_req else r for r in recipe.requirements)
    return recipe.model_copy(update={"requirements": reqs})


def _installed_version(info: BuildInfo, say: LineSink) -> str:
    """The version pip installed (a git build's own, e.g. ``0.11.1.dev5+gabc123``)."""
    probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    limits = get_settings().builds
    proc = run_step(
        [info.python, "-c", probe, info.package],
        what=f"read the installed version of {info.package}",
        timeout_s=limits.pip_timeout_s,
        kill_wait_s=limits.kill_wait_s,
        setting="FARM_PIP_TIMEOUT_S",
        env=build_environment(),
    )
    if proc.returncode != 0:
        say(f"cannot read the installed version of {info.package}: {proc.stderr.strip()}")
        return _UNKNOWN
    return proc.stdout.strip()


def _cached_info(env_dir: Path, fresh: BuildInfo, say: LineSink) -> BuildInfo | None:
    """``fresh`` with the version the finished build recorded (what pip installed), or
    None (said why) when its marker cannot be read: the build is then made again."""
    try:
        recorded = read_marker(env_dir / MARKER)
    except UnreadableFileError as exc:
        say(f"{exc}; rebuilding {env_dir.name}")
        return None
    return fresh.model_copy(update={"version": recorded.version})


_UNKNOWN = "unknown"


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
    except StepTimeoutError:
        raise  # a step that ran out of time would only do so again
    except BuildError as first:
        say(f"retrying once: {first}".splitlines()[0])
        _run(argv, what, say)


def _run(argv: list[str], what: str, say: LineSink) -> None:
    """Run one build step with the build environment (no secrets) and the
    FARM_PIP_TIMEOUT_S deadline, its output to ``say``. Raises BuildError with the last
    30 lines on failure, StepTimeoutError on the deadline."""
    tail: list[str] = []

    def line_out(raw: str) -> None:
        nonlocal tail
        line = mask_text(raw.rstrip())
        # pip's find-links warnings repeat per package and say nothing useful.
        if not line or "is ignored: it is neither a file nor a directory" in line:
            return
        tail = [*tail, line][-30:]
        say(line)

    limits = get_settings().builds
    code = stream_step(
        argv,
        line_out,
        what=what,
        timeout_s=limits.pip_timeout_s,
        kill_wait_s=limits.kill_wait_s,
        setting="FARM_PIP_TIMEOUT_S",
        env=build_environment(),
    )
    if code != 0:
        shown = " ".join(mask_argv(argv))
        raise BuildError(f"could not {what} (exit {code}): {shown}\n" + "\n".join(tail))

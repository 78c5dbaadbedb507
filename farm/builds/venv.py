"""Build an engine into its own virtual environment, once per content hash.

Template (after asv's environment classes): check cache -> build -> install ->
verify -> finalize. The finished marker (`build.json`) is written last, so a build
interrupted at any step is rebuilt from scratch next time.

A patched or layered build (overlay packages on top, e.g. vllm-ascend at a commit on a
pinned vLLM) is derived from its cached base without reinstalling it: the base is
copied as hard links and only what the overlays install and the patches touch
becomes new files (:mod:`farm.builds.layers`).

The engine's source (a PyPI release, a wheel, a tree, a git ref or pull request;
see :mod:`farm.builds.sources`) enters the build id by its content: the wheel's
sha256, the tree's hash or the commit, never a path or a branch name.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from filelock import FileLock

from farm.builds.cache import (
    MARKER,
    SOURCE_FILE,
    read_marker,
    removed_on_failure,
    touch_build,
    write_marker,
)
from farm.builds.environment import build_environment, run_logged, run_step
from farm.builds.layers import (
    UNKNOWN_VERSION,
    DerivedBuild,
    ResolvedOverlay,
    check_patch_roots,
    ensure_derived,
    layered_label,
    resolve_overlays,
)
from farm.builds.series import Patch, bundled_patches_dir, load_series, select_patches
from farm.builds.sources import ResolvedSource, installable, resolve_source
from farm.engines import adapter_for
from farm.engines.base import BuildRecipe
from farm.errors import BuildError, FarmError
from farm.fileformat import UnreadableFileError
from farm.frozen import Frozen
from farm.masking import mask_text
from farm.records import BuildInfo
from farm.settings import get_settings
from farm.spec import EngineSpec

__all__ = ["PlannedBuild", "build_id", "ensure_build", "patches_of", "plan_builds"]

LineSink = Callable[[str], None]


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
    overlays: tuple[ResolvedOverlay, ...] = (),
) -> str:
    """Hash of everything that decides the environment's contents, patch texts included.

    ``source`` (from :func:`resolve_source`) is required unless the engine comes from
    PyPI; its identity replaces the ``package==version`` requirement of the recipe.
    A layered build's id hashes the base build's id, each overlay's identity (from
    :func:`resolve_overlays`, in order) and the patch texts.
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
    if not patches and not overlays:
        return base
    texts = [(p.id, hashlib.sha256(Path(p.diff_path).read_bytes()).hexdigest()) for p in patches]
    if not overlays:
        return _hash({"base": base, "patches": texts})  # as patched builds always were
    return _hash({"base": base, "overlays": [o.key for o in overlays], "patches": texts})


class PlannedBuild(Frozen):
    """What ``farm plan`` shows of one engine's build: its id, or why it has none."""

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
            overlays = resolve_overlays(engine)
            patches = patches_of(engine)
            check_patch_roots(engine, patches)
            recipe = adapter_for(engine.family).build_recipe(engine)
            bid = build_id(engine, recipe, patches, source, overlays)
        except FarmError as exc:
            planned.append(
                PlannedBuild(engine=engine.name, build_id=None, source="?", error=str(exc))
            )
            continue
        planned.append(
            PlannedBuild(
                engine=engine.name,
                build_id=bid,
                source=layered_label(source.label, overlays),
                patches=engine.patches,
            )
        )
    return tuple(planned)


def ensure_build(engine: EngineSpec, cache_dir: Path, on_line: LineSink | None = None) -> BuildInfo:
    """Return the ready build of ``engine``, building it under ``cache_dir`` if needed.

    Concurrent callers (threads or processes) asking for the same build wait on a
    file lock and build it once. A build with patches or overlays is derived from the
    cached build of the rest (:func:`farm.builds.layers.ensure_derived`); one whose own
    files no longer match their recorded hashes is rebuilt. Raises BuildError with the
    installer's own output when a step fails twice (naming the overlay and the step
    for an overlay), SourceError when a source cannot be found or fetched, or
    PatchError with the failing hunk or a patch root that names no overlay.
    """
    say = on_line or (lambda _line: None)
    source = resolve_source(engine)
    overlays = resolve_overlays(engine)
    patches = patches_of(engine)
    check_patch_roots(engine, patches)
    plain = engine.model_copy(update={"patches": (), "overlays": ()})
    base = _ensure_base(plain, source, cache_dir, say)
    if not patches and not overlays:
        return base
    recipe = adapter_for(engine.family).build_recipe(engine)
    env_dir = cache_dir / "builds" / build_id(engine, recipe, patches, source, overlays)
    derived = DerivedBuild(engine=engine, source=source, patches=patches, overlays=overlays)
    return ensure_derived(derived, base, recipe, env_dir, cache_dir, say)


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
        version=source.version or UNKNOWN_VERSION,
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
        with removed_on_failure(env_dir):
            say(f"building {engine.name} ({source.label}) into {env_dir}")
            run_logged(
                [sys.executable, "-m", "venv", str(env_dir)], "create the virtual environment", say
            )
            pip = [info.python, "-m", "pip", "--disable-pip-version-check"]
            with installable(engine, source, cache_dir, say) as requirement:
                argv = [
                    *pip,
                    "install",
                    *_sourced(recipe, engine, source, requirement).requirements,
                ]
                run_logged(argv, "install the engine", say, retry=True)
            if recipe.remove:
                run_logged(
                    [*pip, "uninstall", "-y", *recipe.remove], "remove unusable packages", say
                )
            run_logged([info.python, "-c", recipe.import_check], "import the engine", say)
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
        return UNKNOWN_VERSION
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

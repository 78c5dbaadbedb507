"""Where an engine or overlay is built from: PyPI, a wheel, a tree, git, a PR."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from farm.spec.base import _job_path, _Spec

# scheme://... or scp-like user@host:path; anything else is a local path.
_REMOTE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|[\w.-]+@[\w.-]+:)")


_NOT_OPTION = r"^[^-]"  # git would read a leading dash as an option


class PypiSource(_Spec):
    """The release ``package==version`` from the package index (the default source)."""

    kind: Literal["pypi"] = "pypi"


class _LocalSource(_Spec):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str, info: ValidationInfo) -> str:
        return _job_path(value, info)


class WheelSource(_LocalSource):
    """A wheel file on this machine; its sha256 is its identity."""

    kind: Literal["wheel"]

    @field_validator("path")
    @classmethod
    def _wheel_name(cls, value: str) -> str:
        # Imported here: packaging.utils pulls in subprocess (platform tags).
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename

        try:
            parse_wheel_filename(Path(value).name)
        except InvalidWheelFilename as exc:
            raise ValueError(f"{Path(value).name!r} is not a wheel file name ({exc})") from None
        return value

    def distribution(self) -> str:
        """The canonical name of the distribution the wheel's file name says it holds."""
        from packaging.utils import parse_wheel_filename

        return str(parse_wheel_filename(Path(self.path).name)[0])


class TreeSource(_LocalSource):
    """A source tree on this machine, installed with ``pip install <dir>``.

    Its identity is a hash of the files in it (for a git work tree: the files git
    tracks or would track; build artefacts such as ``build/`` never count).
    """

    kind: Literal["tree"]


class _GitSpec(_Spec):
    repo: str | None = Field(
        default=None, pattern=_NOT_OPTION, description="URL or path of the repository"
    )
    mirror: str | None = Field(
        default=None, description="local clone or mirror, used instead of repo when it exists"
    )
    subdirectory: str = Field(
        default="", pattern=r"^$|^[^/-]", description="package folder inside the repository"
    )

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if value is None or _REMOTE.match(value) else _job_path(value, info)

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _job_path(value, info)

    @model_validator(mode="after")
    def _somewhere(self) -> _GitSpec:
        if self.repo is None and self.mirror is None:
            raise ValueError("name repo (a URL or path) and/or mirror (a local path)")
        return self

    def is_remote(self, location: str) -> bool:
        """True when ``location`` is a URL rather than a path on this machine."""
        return bool(_REMOTE.match(location))


class GitSource(_GitSpec):
    """A git repository at a branch, tag or commit; the commit is its identity."""

    kind: Literal["git"]
    ref: str = Field(pattern=_NOT_OPTION, description="branch, tag or commit")


class PullRequestSource(_GitSpec):
    """A pull request's head (``refs/pull/N/head``) of a remote or a local mirror."""

    kind: Literal["pr"]
    number: int = Field(gt=0)

    @property
    def ref(self) -> str:
        return f"refs/pull/{self.number}/head"


BuildSource = Annotated[
    PypiSource | WheelSource | TreeSource | GitSource | PullRequestSource,
    Field(discriminator="kind"),
]


_SOURCE_KINDS = ("pypi", "wheel", "tree", "git", "pr")

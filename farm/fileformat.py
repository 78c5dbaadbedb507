"""Versioned JSON files on disk: spool files, `farm export` output, build markers.

Each file carries ``format_version`` next to its fields (after asv's ``api_version``);
a file without one predates versioning and is read as version 1. A reader meets a file
it cannot read (gone, truncated, not JSON, a newer version, fields that do not
validate) with :class:`UnreadableFileError`, which names the file and the reason,
instead of skipping it without a word.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from farm.errors import FarmError
from farm.yamlfile import ParseError, parse_json

__all__ = [
    "FORMAT_KEY",
    "UnreadableFileError",
    "dump_versioned",
    "read_versioned",
    "write_versioned",
]

FORMAT_KEY = "format_version"
_UNVERSIONED = 1  # files written before the key existed

M = TypeVar("M", bound=BaseModel)
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


class UnreadableFileError(FarmError):
    """A file on disk cannot be read; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: Path, what: str, reason: str, hint: str) -> None:
        super().__init__(f"{path}: unreadable {what}: {reason}; {hint}")
        self.path = path
        self.reason = reason


def dump_versioned(model: BaseModel, version: int, indent: int | None = None) -> str:
    """``model`` as JSON with ``format_version`` as its first key."""
    payload = {FORMAT_KEY: version, **model.model_dump(mode="json")}
    return json.dumps(payload, indent=indent, ensure_ascii=False, allow_nan=False)


def write_versioned(path: Path, model: BaseModel, version: int, indent: int | None = None) -> None:
    """Write ``model`` to ``path`` through a temporary file and a rename, so a process
    killed mid-write leaves the old file or none, never half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(dump_versioned(model, version, indent) + "\n", encoding="utf-8")
    partial.replace(path)


def _load_object(path: Path, what: str) -> dict[str, Any]:
    """The file's JSON object; raises UnreadableFileError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableFileError(
            path, what, f"cannot read it ({exc})", "check that it exists and is readable"
        ) from None
    try:
        data = parse_json(text)
    except ParseError as exc:
        at = f" at line {exc.line}" if exc.line is not None else ""
        if exc.syntax:
            reason = f"not valid JSON{at} column {exc.column}: {exc.reason} (truncated?)"
        else:
            reason = f"not usable JSON{at}: {exc.reason}"
        raise UnreadableFileError(path, what, reason, _hint(what)) from None
    if not isinstance(data, dict):
        reason = f"expected a JSON object, found {type(data).__name__}"
        raise UnreadableFileError(path, what, reason, _hint(what))
    return data


def _hint(what: str) -> str:
    return f"move the file away if it is not a {what}, or write it again"


def read_versioned(
    path: Path,
    model: type[M],
    *,
    version: int,
    what: str,
    upgrades: Mapping[int, Upgrade] | None = None,
) -> M:
    """Read ``path`` as ``model``, the current format being ``version``.

    An older file goes through ``upgrades[v]`` (version v -> v + 1) until it is
    current. Raises UnreadableFileError naming the file and the reason: it cannot be
    read, is not a JSON object (e.g. truncated), is of a newer or unknown version, or
    does not validate as ``what``.
    """
    data = _load_object(path, what)
    found = data.pop(FORMAT_KEY, _UNVERSIONED)
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        reason = f"{FORMAT_KEY} is {found!r}, expected a positive integer"
        raise UnreadableFileError(path, what, reason, _hint(what))
    if found > version:
        reason = f"format version {found} is newer than this mtp-farm reads (up to {version})"
        raise UnreadableFileError(path, what, reason, "upgrade mtp-farm to read it")
    while found < version:
        step = (upgrades or {}).get(found)
        if step is None:
            reason = f"no upgrade from format version {found} to {version}"
            raise UnreadableFileError(path, what, reason, "report this as an mtp-farm bug")
        data, found = step(data), found + 1
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()[:3]
        )
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        reason = f"does not validate as format version {version}: {problems}{more}"
        raise UnreadableFileError(path, what, reason, _hint(what)) from None

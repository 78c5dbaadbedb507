"""YAML files validated by pydantic, with errors that say file, line and key.

Job files and patch series both use it: the text is parsed once for data and once
for node positions, so every validation error points at the line it is about. What
the YAML loader lets through silently is refused here: a key given twice (the last
would win), and aliases that expand into more values than any real file holds.
:func:`read_text` reads the files themselves: a size limit, UTF-8 only, no NUL bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from farm.errors import FarmError

__all__ = [
    "LOCATED",
    "MAX_NODES",
    "duplicate_keys",
    "line_of",
    "load_mapping",
    "read_text",
    "validation_problems",
]

# Values a mapping may expand to, aliases counted each time they are used: far above
# any real job file or series, far below what makes validation take minutes.
MAX_NODES = 100_000
# The context key of a validation error that holds several problems, each at its own
# key: ``((loc, message, first_loc | None), ...)``, locations relative to the error's.
LOCATED = "located"


def read_text(path: Path, what: str, error: type[FarmError], max_bytes: int | None = None) -> str:
    """The text of ``path`` (UTF-8, an initial byte-order mark dropped).

    Raises ``error`` naming the file (and the line, for a bad byte) when it cannot be
    read, is larger than ``max_bytes``, is not UTF-8 or holds a NUL byte (a binary
    file); ``what`` says what the file is for (``job file``, ``prompt file``).
    """
    try:
        if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
            raise error(
                f"{path}: {what} is {size:,} bytes, over the limit of {max_bytes:,}; "
                "is it the right file?"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{path}:{_line_at(data, nul)}: {what} holds a NUL byte; is it a binary file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}:{_line_at(data, exc.start)}: {what} is not UTF-8 text "
            f"(byte 0x{data[exc.start]:02x}); save it as UTF-8"
        ) from None


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (or of its closest existing parent)."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if k.value == key), None)
            if found is None:
                # The key itself may be the culprit (an unknown key): point at it.
                found = next((k for k, _ in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            found = node.value[key]
        else:
            found = None
        if found is None:
            break
        node = found
        line = node.start_mark.line + 1
    return line


def duplicate_keys(root: yaml.Node | None, source: str) -> list[str]:
    """``file:line: key: duplicate key 'k' (first at line N)`` for every key given twice
    in one mapping of the tree (YAML loaders keep the last one without a word)."""
    problems: list[str] = []
    seen: set[int] = set()

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if id(node) in seen:  # an alias: its node was checked where it was defined
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value)
                line = key.start_mark.line + 1
                if name == "<<":  # a merge key may be repeated on purpose
                    continue
                if name in first:
                    problems.append(
                        f"{source}:{line}: {'.'.join((*path, name))}: duplicate key "
                        f"{name!r} (first at line {first[name]})"
                    )
                else:
                    first[name] = line
                walk(value, (*path, name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, str(i)))

    if root is not None:
        walk(root, ())
    return problems


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the tree holds once every alias is expanded (memoized per node)."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a cycle (a recursive alias) counts once
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        sizes[id(node)] = min(total, MAX_NODES + 1)
        return sizes[id(node)]

    return size(root)


def load_mapping(
    text: str, source: str, error: type[FarmError], shape: str
) -> tuple[yaml.Node | None, dict[str, Any]]:
    """The YAML node tree and data of ``text``; ``error`` when it is not a YAML mapping,
    gives a key twice, or expands (through aliases) to more than :data:`MAX_NODES` values."""
    try:
        root = yaml.compose(text)
        if root is not None and _expanded_size(root) > MAX_NODES:
            raise error(
                f"{source}: expands to more than {MAX_NODES:,} values (aliases count each "
                "time they are used); is it the right file?"
            )
        duplicates = duplicate_keys(root, source)
        if duplicates:
            raise error(
                "a key is given twice; YAML would keep the last\n  " + "\n  ".join(duplicates)
            )
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{source}:1: {shape}")
    return root, data


def validation_problems(
    exc: ValidationError | Sequence[ErrorDetails], root: yaml.Node | None, source: str
) -> list[str]:
    """One ``file:line: key: message`` per error of ``exc``.

    An error carrying :data:`LOCATED` problems gives one line per problem, at its own
    key; a problem with a first location says ``(first at line N)``. A list emptied by
    its own invalid items also reports being too short: the items already say why, so
    that error is left out.
    """
    errors = exc.errors() if isinstance(exc, ValidationError) else list(exc)
    problems = []
    for err in errors:
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if err["type"] == "too_short" and any(
            e is not err and e["loc"][: len(loc)] == err["loc"] for e in errors
        ):
            continue
        located = (err.get("ctx") or {}).get(LOCATED) or (((), err["msg"], None),)
        for rel, message, first in located:
            full = (*loc, *rel)
            key = ".".join(str(p) for p in full) or "<root>"
            if first is not None:
                message += f" (first at line {line_of(root, (*loc, *first))})"
            problems.append(f"{source}:{line_of(root, full)}: {key}: {message}")
    return problems

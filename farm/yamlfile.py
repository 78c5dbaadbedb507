"""YAML files validated by pydantic, with errors that say file, line and key.

Job files and patch series both use it: the text is parsed once for data and once
for node positions, so every validation error points at the line it is about.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from farm.errors import FarmError

__all__ = ["line_of", "load_mapping", "validation_problems"]


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


def load_mapping(
    text: str, source: str, error: type[FarmError], shape: str
) -> tuple[yaml.Node | None, dict[str, Any]]:
    """The YAML node tree and data of ``text``; ``error`` when it is not a YAML mapping."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{source}:1: {shape}")
    return root, data


def validation_problems(exc: ValidationError, root: yaml.Node | None, source: str) -> list[str]:
    """One ``file:line: key: message`` per error of ``exc``.

    A list emptied by its own invalid items also reports being too short: the items
    already say why, so that error is left out.
    """
    errors = exc.errors()
    problems = []
    for err in errors:
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if err["type"] == "too_short" and any(
            e is not err and e["loc"][: len(loc)] == err["loc"] for e in errors
        ):
            continue
        key = ".".join(str(p) for p in loc) or "<root>"
        problems.append(f"{source}:{line_of(root, loc)}: {key}: {err['msg']}")
    return problems

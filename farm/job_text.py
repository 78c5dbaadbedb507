"""Values a process cannot take, found in a job before anything runs.

A NUL byte cannot be part of a process argument or an environment value (POSIX
strings end at NUL; Python's ``subprocess.Popen`` raises ``ValueError: embedded null
byte``). A NUL in an engine's ``env``, ``served_name`` or ``extra_args``, or a
harness's ``env``, passed ``farm plan`` and ``--dry-run`` and failed at the engine's
start; :func:`process_text_problems` names each one so the job is refused first.

Pure: no I/O.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["bools_for_numbers", "process_text_problems"]


def _numeric(annotation: Any) -> bool:
    """Whether ``annotation`` takes a number and no bool (``int``, ``float | None``)."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return bool not in args and any(_numeric(a) for a in args)
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    return False


def bools_for_numbers(fields: Mapping[str, Any], data: object) -> list[str]:
    """The names of the number fields (``fields``: a pydantic model's ``model_fields``)
    that ``data`` (its raw input) gives a bool: YAML's ``history: true`` would
    otherwise be read as 1."""
    if not isinstance(data, Mapping):
        return []
    out = []
    for name, info in fields.items():
        key = info.alias or name
        if isinstance(data.get(key), bool) and _numeric(info.annotation):
            out.append(key)
    return out


def process_text_problems(data: object, where: str = "") -> list[str]:
    """``<key path>: holds a NUL byte ...`` for every string (key or value) in ``data``
    (a job's JSON dump) that holds one."""
    problems: list[str] = []
    if isinstance(data, str):
        if "\x00" in data:
            problems.append(
                f"{where or 'a value'}: holds a NUL byte, which no process argument or "
                "environment value can hold; remove it"
            )
    elif isinstance(data, dict):
        for key, value in data.items():
            path = f"{where}.{key}" if where else str(key)
            if "\x00" in str(key):
                problems += process_text_problems(str(key), path)
            problems += process_text_problems(value, path)
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            problems += process_text_problems(value, f"{where}[{i}]")
    return problems

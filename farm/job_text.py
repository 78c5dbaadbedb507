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
from pathlib import Path
from typing import Any

__all__ = ["bools_for_numbers", "not_an_option", "process_text_problems", "user_path"]


def _numeric(annotation: Any, kinds: tuple[type, ...] = (int, float)) -> bool:
    """Whether ``annotation`` takes a number of ``kinds`` and no bool (``int``,
    ``float | None``)."""
    if annotation in kinds:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        # A union that takes text (``int | str``) is no whole-number field for a text.
        takes_text = str in args and float not in kinds
        return bool not in args and not takes_text and any(_numeric(a, kinds) for a in args)
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0], kinds)
    return False


def bools_for_numbers(
    fields: Mapping[str, Any], data: object, kind: type | tuple[type, ...] = bool
) -> list[str]:
    """The names of the number fields (``fields``: a pydantic model's ``model_fields``)
    that ``data`` (its raw input) gives a bool: YAML's ``history: true`` would
    otherwise be read as 1. With ``kind=str``: the whole-number fields given a text
    (``count: '32'``, which pydantic would read as 32). Float fields take text: YAML
    1.1 reads ``1e12`` as one."""
    if not isinstance(data, Mapping):
        return []
    kinds: tuple[type, ...] = (int, float) if kind is bool else (int,)
    out = []
    for name, info in fields.items():
        key = info.alias or name
        if isinstance(data.get(key), kind) and _numeric(info.annotation, kinds):
            out.append(key)
    return out


def user_path(text: str | Path) -> Path:
    """``text`` as a path, ``~`` and ``~user`` expanded. ValueError (what pydantic and
    the settings report with the field or variable) when it holds a NUL byte or names
    a user this machine does not have: ``Path.expanduser`` raises RuntimeError."""
    if "\x00" in str(text):
        raise ValueError("the path holds a NUL byte, which no path can hold")
    try:
        return Path(text).expanduser()
    except RuntimeError:
        user = str(text).partition("/")[0]
        raise ValueError(
            f"{user}: no such user on this machine, so the path cannot be found"
        ) from None


def not_an_option(value: str) -> str:
    """``value`` unchanged; ValueError when it holds a NUL byte or begins with ``-``: it goes into a
    command line as an option's value or an operand, where it would be read as an
    option (``served_name: --trust-remote-code``)."""
    if "\x00" in value:
        raise ValueError("holds a NUL byte, which no command line or path can hold")
    if value.startswith("-"):
        raise ValueError(
            f"{value!r} begins with '-', so a command line would read it as an option; "
            "give a name or a path (write a relative path as ./-x)"
        )
    return value


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

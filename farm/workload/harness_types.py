"""What every eval harness of the farm gives and takes: how to start it for one variant,
what it measured, and its error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from farm.errors import CellError
from farm.frozen import Frozen
from farm.spec.parts import HarnessTool
from farm.yamlfile import ParseError, json_lines, parse_json, read_json, read_text

__all__ = [
    "HarnessCommand",
    "HarnessError",
    "HarnessOutcome",
    "HarnessSample",
    "read_output",
    "read_output_lines",
    "reading_output",
]


class HarnessError(CellError):
    """The harness could not run or its output could not be read."""


def read_output(path: Path, tool: str) -> Any:
    """The JSON of a harness's output file; HarnessError naming it and the line when
    it cannot be read or parsed (:func:`farm.yamlfile.read_json`). ``NaN`` passes: a
    harness may write it for a figure it could not compute."""
    return read_json(path, f"{tool} output", HarnessError, finite=False)


def read_output_lines(path: Path, tool: str) -> list[Any]:
    """The JSON value of each line of a harness's JSON-lines output file."""
    values = []
    for number, line in json_lines(read_text(path, f"{tool} output", HarnessError)):
        try:
            values.append(parse_json(line, finite=False))
        except ParseError as exc:
            raise HarnessError(f"{path}:{number}: {tool} output: {exc.reason}") from None
    return values


@contextlib.contextmanager
def reading_output(tool: str, *where: Path) -> Iterator[None]:
    """Turn what reading a harness output of an unexpected shape raises (a list where
    an object was expected, a missing key, a word where a number was) into a
    HarnessError naming the output; HarnessErrors pass as they are."""
    try:
        yield
    except HarnessError:
        raise
    except (OSError, LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        detail = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise HarnessError(
            f"{tool}'s output {' or '.join(map(str, where))} is unreadable: "
            f"{type(exc).__name__}: {detail}"
        ) from None


class _Finite(Frozen):
    """:class:`Frozen`, and refusing NaN and infinities in float fields."""

    # A NaN accuracy or score is no figure: the store and `farm export` refuse it.
    model_config = ConfigDict(allow_inf_nan=False)


class HarnessCommand(_Finite):
    """How to start the harness for one variant; ``env`` is what the job and the farm
    set explicitly (the rest of its environment: ``farm.engines.environment``);
    ``model`` the served name it asks for (some harnesses name their outputs by it)."""

    tool: HarnessTool = "lm-eval"
    argv: tuple[str, ...]
    env: dict[str, str]
    task: str = ""  # the task name the results are keyed by
    output_dir: str
    model: str = ""


class HarnessSample(_Finite):
    """One scored document of the harness's sample log."""

    doc_id: int
    prompt_id: str
    prompt_key: str | None
    score: float | None


class HarnessOutcome(_Finite):
    """What the harness measured: its accuracy figure and the per-document scores."""

    task: str
    metric: str
    accuracy: float | None
    samples: tuple[HarnessSample, ...]
    results_path: str

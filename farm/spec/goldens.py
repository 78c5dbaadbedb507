"""Goldens the teams already keep: vllm-ascend's spec-decode gates, held to stored sweeps.

vllm-ascend keeps its nightly gates as case files
(``tests/e2e/nightly/single_node/models/configs/*.yaml`` in vllm-project/vllm-ascend,
e.g. ``GLM-5.2-W4A8-MTP-A3.yaml``): a list of ``test_cases``,
each with a ``model``, the server's ``server_cmd`` (whose ``--speculative-config`` JSON
names the ``method`` and ``num_speculative_tokens``) and ``benchmarks``; a benchmark
with ``case_type: spec_decode`` is a per-position acceptance golden::

    benchmarks:
      spec_decode:
        case_type: spec_decode
        dataset_path: vllm-ascend/gsm8k-lite
        batch_size: 32
        baseline: [0.86, 0.63, 0.42]   # acceptance at draft positions 0, 1, 2
        threshold: 0.05                # absolute, per position

:func:`read_goldens` reads one such file or a folder of them into :class:`Golden`
records (other case types and keys are vllm-ascend's business and are left alone);
a malformed spec-decode case is refused with ``file:line: key: problem``.

Matching (:func:`bind_goldens`): a golden is held against a variant when

- the variant's MTP depth is the golden's ``k`` (``num_speculative_tokens``);
- the variant's model is one the golden names: the golden's ``model`` (a hub id such
  as ``Eco-Tech/GLM-5.2-w4a8``) or its last path part (``GLM-5.2-w4a8``) equals, case
  aside, one of the job model's names: its ``name``, its ``served_name``, or the last
  part of its ``path`` (a model folder named as the hub id is); a job's
  ``goldens: [{path, model: NAME}]`` (``farm goldens check --model NAME``) says so
  instead, for every golden of that file;
- and, when the job's entry names a ``workload``, the variant is of that workload.

The method, dataset and batch size are shown with each finding, not matched: the
variant's workload is the job's. The threshold is absolute, as vllm-ascend's own
accuracy gates read theirs (``abs(result - baseline) <= threshold``,
``tests/e2e/nightly/single_node/models/scripts/test_single_node.py``). The check
itself is :func:`farm.analysis.golden_check.check_goldens`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from farm.errors import GoldenError
from farm.frozen import Frozen
from farm.inert import UntrustedText
from farm.plan import ServerCell
from farm.records import VariantResult
from farm.spec import JobFile, JobSpec
from farm.yamlfile import (
    ParseError,
    line_of,
    load_mapping,
    parse_json,
    read_text,
    validation_problems,
)

__all__ = [
    "GOLDEN_CHECK",
    "Golden",
    "GoldenCheck",
    "bind_goldens",
    "golden_problems",
    "job_goldens",
    "job_model_names",
    "model_names",
    "parse_goldens",
    "read_goldens",
]

# The check (and finding source) of a variant below a golden.
GOLDEN_CHECK: Final = "golden"
# A case file is a few kilobytes (as a job file is).
_MAX_BYTES = 1 << 20
_SPEC_FLAGS = ("--speculative-config", "--speculative_config")
_SHAPE = (
    "a golden case file is a mapping with test_cases: [{name, model, server_cmd, "
    "benchmarks}] (vllm-ascend's nightly case format)"
)


def _number(value: Any) -> Any:
    # `threshold: yes` is a slip, not the number 1 (farm.job_text).
    if isinstance(value, bool):
        raise ValueError("a yes/no where a number is expected")
    return value


class _TestCase(Frozen):
    """What a spec-decode golden needs of its test case; other keys are left alone."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    server_cmd: list[str]

    @field_validator("server_cmd", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        # vllm-ascend's loader takes the command as a list or as one string.
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot be split into arguments: {exc}") from None
        return value


class _SpecDecodeCase(Frozen):
    """One ``case_type: spec_decode`` benchmark (aisbench's other keys are ignored)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    case_type: Literal["spec_decode"]
    dataset_path: str = Field(min_length=1)
    batch_size: Annotated[int, BeforeValidator(_number), Field(ge=1, le=1_000_000)]
    baseline: tuple[Annotated[float, BeforeValidator(_number)], ...] = Field(
        min_length=1, max_length=64
    )
    threshold: Annotated[float, BeforeValidator(_number)]

    @field_validator("baseline")
    @classmethod
    def _rates(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        bad = [f"{v:g} (position {i})" for i, v in enumerate(value) if not 0.0 <= v <= 1.0]
        if bad:
            raise ValueError(
                f"{', '.join(bad)}: acceptance per position is a share of drafts, 0 to 1"
            )
        return value

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(
                f"{value:g}: the threshold is the drop below the baseline each position "
                "may take, absolute (0 to 1), never negative"
            )
        return value


class Golden(Frozen):
    """One spec-decode gate: at MTP depth ``k``, acceptance at draft position ``i`` must
    not fall below ``baseline[i] - threshold`` (absolute, per position).

    ``name`` is the test case's, ``case`` the benchmark's key, ``method`` and ``k`` the
    case's ``--speculative-config``, ``dataset`` its ``dataset_path``; ``source`` and
    ``line`` where the benchmark is written.
    """

    # From a case file (vllm-ascend's YAML is not the farm's): held as outside text;
    # every channel shows it through its own function (farm.inert.CHANNELS).
    name: UntrustedText
    case: UntrustedText
    model: str
    method: str | None = None
    k: int = Field(ge=1)
    baseline: tuple[float, ...]
    threshold: float
    dataset: UntrustedText
    batch_size: int
    source: str
    line: int | None = None

    @property
    def label(self) -> str:
        """``GLM-5.2-W4A8-MTP-A3`` (``.case`` when the benchmark is not ``spec_decode``)."""
        return self.name if self.case == "spec_decode" else f"{self.name}.{self.case}"

    @property
    def where(self) -> str:
        """``configs/GLM-5.2.yaml:47``: the benchmark's file and line."""
        return f"{self.source}:{self.line}" if self.line else self.source

    def floor(self, position: int) -> float:
        """The lowest acceptance position ``position`` may measure."""
        return self.baseline[position] - self.threshold


class GoldenCheck(Frozen):
    """A golden and the variants it is held against: of the job models ``models``, at
    MTP depth ``golden.k``, of ``workload`` (None: every workload)."""

    golden: Golden
    models: tuple[str, ...]
    workload: str | None = None

    def applies(self, cell: ServerCell, variant: VariantResult) -> bool:
        return (
            cell.model in self.models
            and cell.mtp_depth == self.golden.k
            and (self.workload is None or variant.workload == self.workload)
        )


def _speculative_config(cmd: Sequence[str]) -> tuple[int, str | None] | None:
    """(index, text) of the ``--speculative-config`` value in ``cmd``, or None."""
    for i, arg in enumerate(cmd):
        for flag in _SPEC_FLAGS:
            if arg == flag:
                return (i + 1, cmd[i + 1]) if i + 1 < len(cmd) else (i, None)
            if arg.startswith(flag + "="):
                return i, arg[len(flag) + 1 :]
    return None


Problem = tuple[tuple[int | str, ...], str]


def _speculation(
    case: _TestCase, at: tuple[int | str, ...]
) -> tuple[int | None, str | None, tuple[int | str, ...], list[Problem]]:
    """(k, method, where they are written, problems) from the test case's
    ``--speculative-config``."""
    found = _speculative_config(case.server_cmd)
    if found is None:
        why = "no --speculative-config: a spec_decode case needs its method and k"
        return None, None, (*at, "server_cmd"), [((*at, "server_cmd"), why)]
    index, text = found
    where = (*at, "server_cmd", index)
    try:
        config = parse_json(text) if text is not None else None
    except ParseError as exc:
        return None, None, where, [(where, f"--speculative-config is not JSON: {exc}")]
    if not isinstance(config, dict):
        return None, None, where, [(where, "--speculative-config is not a JSON object")]
    k, method = config.get("num_speculative_tokens"), config.get("method")
    problems: list[Problem] = []
    good = isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 64
    if k is None:
        problems.append((where, "--speculative-config names no num_speculative_tokens (k)"))
    elif not good:
        problems.append((where, f"num_speculative_tokens {k!r} is not a count of 1 to 64"))
    if method is not None and not isinstance(method, str):
        problems.append((where, f"--speculative-config method {method!r} is not a name"))
    return (k if good else None), (method if isinstance(method, str) else None), where, problems


def _errors(exc: ValidationError, at: tuple[int | str, ...]) -> list[ErrorDetails]:
    """``exc``'s errors at their place in the file, without pydantic's prefix."""
    return [
        e | {"loc": (*at, *e["loc"]), "msg": e["msg"].removeprefix("Value error, ")}
        for e in exc.errors()
    ]


class _NotCases(Exception):
    """A YAML file without ``test_cases``: skipped in a folder, refused when named."""


def _spec_decode(benchmarks: Any) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(benchmarks, dict):
        return []
    return [
        (str(key), b)
        for key, b in benchmarks.items()
        if isinstance(b, dict) and b.get("case_type") == "spec_decode"
    ]


def _parse(text: str, source: str) -> tuple[Golden, ...]:
    root, data = load_mapping(text, source, GoldenError, _SHAPE)
    if "test_cases" not in data:
        raise _NotCases(f"{source}:1: no test_cases: {_SHAPE}")
    cases = data["test_cases"]
    if not isinstance(cases, list):
        line = line_of(root, ("test_cases",))
        raise GoldenError(f"{source}:{line}: test_cases: {_SHAPE}")
    goldens: list[Golden] = []
    errors: list[ErrorDetails] = []
    problems: list[str] = []

    def problem(loc: tuple[int | str, ...], message: str) -> None:
        problems.append(f"{source}:{line_of(root, loc)}: {'.'.join(map(str, loc))}: {message}")

    for i, raw in enumerate(cases):
        benches = _spec_decode(raw.get("benchmarks")) if isinstance(raw, dict) else []
        if not benches:
            continue  # not a spec-decode gate: vllm-ascend's, not ours
        at: tuple[int | str, ...] = ("test_cases", i)
        try:
            case = _TestCase.model_validate(raw)
        except ValidationError as exc:
            errors += _errors(exc, at)
            continue
        k, method, k_at, found = _speculation(case, at)
        for loc, message in found:
            problem(loc, message)
        for key, bench in benches:
            loc = (*at, "benchmarks", key)
            try:
                gate = _SpecDecodeCase.model_validate(bench)
            except ValidationError as exc:
                errors += _errors(exc, loc)
                continue
            if k is None:
                continue
            if len(gate.baseline) > k:
                problem(
                    (*loc, "baseline"),
                    f"{len(gate.baseline)} positions, but num_speculative_tokens is {k} "
                    f"(line {line_of(root, k_at)}): the engine drafts only k positions",
                )
                continue
            goldens.append(
                Golden(
                    name=case.name,
                    case=key,
                    model=case.model,
                    method=method,
                    k=k,
                    baseline=gate.baseline,
                    threshold=gate.threshold,
                    dataset=gate.dataset_path,
                    batch_size=gate.batch_size,
                    source=source,
                    line=line_of(root, loc),
                )
            )
    problems = validation_problems(errors, root, source) + problems
    if problems:
        raise GoldenError("invalid golden case file\n  " + "\n  ".join(problems))
    return tuple(goldens)


def parse_goldens(text: str, source: str = "<string>") -> tuple[Golden, ...]:
    """The spec-decode goldens of case file text (none when it gates no spec_decode
    benchmark). Raises GoldenError naming ``source``, line and key of every problem:
    not YAML, no ``test_cases``, a key missing or of the wrong type, a baseline longer
    than k, a rate outside 0..1, a negative threshold."""
    try:
        return _parse(text, source)
    except _NotCases as exc:
        raise GoldenError(str(exc)) from None


def read_goldens(path: str | Path) -> tuple[Golden, ...]:
    """The goldens of a case file, or of every ``*.yaml`` / ``*.yml`` file of a folder
    (in name order; files without ``test_cases`` are not case files and are skipped).
    Raises GoldenError when the path cannot be read, a case file is malformed, or it
    holds no spec_decode golden at all."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in (".yaml", ".yml") and f.is_file())
        goldens: list[Golden] = []
        for f in files:
            try:
                goldens += _parse(read_text(f, "golden case file", GoldenError, _MAX_BYTES), str(f))
            except _NotCases:
                continue
        if not goldens:
            raise GoldenError(
                f"{p}: no case file of this folder gates a spec_decode benchmark "
                f"({len(files)} YAML file(s) read)"
            )
        return tuple(goldens)
    found = parse_goldens(read_text(p, "golden case file", GoldenError, _MAX_BYTES), str(p))
    if not found:
        raise GoldenError(f"{p}: no test case has a benchmark with case_type: spec_decode")
    return found


def model_names(model: str) -> frozenset[str]:
    """The names a model answers to, case aside: ``Eco-Tech/GLM-5.2-w4a8`` is also
    ``GLM-5.2-w4a8`` (a hub id and the folder it is saved in)."""
    text = model.strip().rstrip("/")
    names = {text, PurePosixPath(text).name} if text else set()
    return frozenset(n.casefold() for n in names if n)


def job_model_names(job: JobSpec) -> dict[str, frozenset[str]]:
    """Each job model's name -> the names it answers to: its name, served name, and
    the last part of its path."""
    return {
        m.name: frozenset().union(
            *(model_names(n) for n in (m.name, m.served_name, Path(m.path).name) if n)
        )
        for m in job.models
    }


def bind_goldens(
    goldens: Iterable[Golden],
    models: Mapping[str, Iterable[str]],
    *,
    model: str | None = None,
    workload: str | None = None,
) -> tuple[GoldenCheck, ...]:
    """The goldens held against the models of ``models`` (model name -> the names it
    answers to, :func:`job_model_names`), by name (:func:`model_names`), or against
    ``model`` when given; goldens for none of them are left out."""
    out = []
    for g in goldens:
        held: tuple[str, ...]
        if model is not None:
            held = (model,)
        else:
            wanted = model_names(g.model)
            held = tuple(
                name for name, aliases in models.items() if wanted & {a.casefold() for a in aliases}
            )
        if held:
            out.append(GoldenCheck(golden=g, models=held, workload=workload))
    return tuple(out)


def _bound(job: JobFile) -> tuple[list[GoldenCheck], list[str]]:
    names = job_model_names(job.spec)
    checks: list[GoldenCheck] = []
    problems: list[str] = []
    for i, ref in enumerate(job.spec.goldens):
        if not Path(ref.path).exists():
            continue  # farm.spec.check_job_paths says so
        try:
            goldens = read_goldens(ref.path)
        except GoldenError as exc:
            problems.append(f"{job.where('goldens', i)}: {exc}")
            continue
        bound = bind_goldens(goldens, names, model=ref.model, workload=ref.workload)
        if not bound:
            for_models = ", ".join(sorted({g.model for g in goldens}))
            known = "; ".join(f"{n}: {', '.join(sorted(a))}" for n, a in names.items())
            problems.append(
                f"{job.where('goldens', i)}: none of the {len(goldens)} golden(s) of "
                f"{ref.path} is for a model of this job (they are for {for_models}; the "
                f"job's models answer to {known}); name the job model with "
                "`{path: ..., model: NAME}`"
            )
        checks += bound
    return checks, problems


def golden_problems(job: JobFile) -> list[str]:
    """``file:line: goldens.N: problem`` for each golden file of ``job`` that cannot be
    read or is for none of its models (a missing path is :func:`check_job_paths`'s)."""
    return _bound(job)[1]


def job_goldens(job: JobFile) -> tuple[GoldenCheck, ...]:
    """The goldens ``job`` names, each bound to the job models it is for. Raises
    GoldenError listing every problem (:func:`golden_problems`, a missing file)."""
    checks, problems = _bound(job)
    problems += [
        f"{job.where('goldens', i, 'path')}: {ref.path} does not exist"
        for i, ref in enumerate(job.spec.goldens)
        if not Path(ref.path).exists()
    ]
    if problems:
        raise GoldenError(f"{job.source}: goldens\n  " + "\n  ".join(problems))
    return tuple(checks)

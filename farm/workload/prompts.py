"""Prompt sets (JSON lines) and the scorers that check their answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from farm.errors import SpecError
from farm.frozen import Frozen
from farm.spec import JobFile, WorkloadSpec
from farm.spec.parts import PromptFormat
from farm.workload.formats import Prompt, Turn, parse_record, select_prompts
from farm.yamlfile import ParseError, json_lines, parse_json, read_text

__all__ = [
    "LoadedWorkload",
    "Prompt",
    "Turn",
    "check_prompts",
    "load_prompts",
    "load_workload",
    "read_prompt_file",
    "scorer_for",
]

# Problems shown per prompt file; the rest are counted.
_SHOWN = 10

Scorer = Callable[[str, str], bool]


class LoadedWorkload(Frozen):
    """A workload spec with its prompts read, ready to ship to a worker."""

    spec: WorkloadSpec
    prompts: tuple[Prompt, ...]
    # The text of the workload's context document (``context.document``), if any.
    context_document: str = ""


def load_workload(spec: WorkloadSpec, resolve: Callable[[str], Path]) -> LoadedWorkload:
    """``spec`` with its prompts and context document read (no prompts for a harness
    workload: the harness reads its own dataset); ``resolve`` makes a job-file path
    absolute."""
    if spec.prompts is None:
        return LoadedWorkload(spec=spec, prompts=())
    prompts = load_prompts(resolve(spec.prompts), spec.count, spec.format)
    document = spec.context.document
    text = read_text(resolve(document), "context document", SpecError) if document else ""
    return LoadedWorkload(spec=spec, prompts=prompts, context_document=text)


def _record(line: str, fmt: PromptFormat, number: int) -> Prompt | str:
    """The prompt record on one line of a JSON-lines file, or what is wrong with it."""
    try:
        data = parse_json(line)
    except ParseError as exc:
        return f"not JSON: {exc.reason} (column {exc.column})" if exc.syntax else exc.reason
    return parse_record(data, fmt, number)


def read_prompt_file(
    path: Path, fmt: PromptFormat = "farm"
) -> tuple[tuple[Prompt, ...], list[str]]:
    """Every prompt record of a JSON-lines file written in format ``fmt``
    (:mod:`farm.workload.formats`), and ``file:line: problem`` for each line that is
    not one (or whose id an earlier line has). Raises SpecError when the file cannot be
    read or is not UTF-8 text."""
    text = read_text(path, "prompt file", SpecError)
    prompts: list[Prompt] = []
    problems: list[str] = []
    # Every request id (a turn k >= 2 is ``{id}#{k}``) with the line that gave it: a
    # record ``a#2`` beside a two-turn ``a`` would send two requests of one id.
    first: dict[str, int] = {}
    for number, line in json_lines(text):
        record = _record(line, fmt, number)
        if isinstance(record, str):
            problems.append(f"{path}:{number}: {record}")
            continue
        ids = [request_id for request_id, _ in record.conversation()]
        again = next((i for i in ids if i in first), None)
        if again == record.id:
            problems.append(
                f"{path}:{number}: id {record.id!r} again (first at line {first[record.id]})"
            )
        elif again is not None:
            problems.append(
                f"{path}:{number}: request id {again!r} again (first at line {first[again]}): "
                "a turn k >= 2 of a record is sent as request <id>#<k>; give the record "
                "another id"
            )
        else:
            first.update(dict.fromkeys(ids, number))
            prompts.append(record)
    return tuple(prompts), problems


def load_prompts(path: Path, count: int, fmt: PromptFormat = "farm") -> tuple[Prompt, ...]:
    """``count`` prompts of a JSON-lines file: the first ones, or round-robin across
    the records' categories where they have them (:func:`select_prompts`).

    Raises SpecError naming the file and line of every malformed record, or the file
    when it cannot be read or holds fewer than ``count`` prompts.
    """
    prompts, problems = read_prompt_file(path, fmt)
    if problems:
        raise SpecError(_summary(path, problems))
    if len(prompts) < count:
        raise SpecError(_too_few(path, count, len(prompts)))
    return select_prompts(prompts, count)


def _summary(path: Path, problems: list[str]) -> str:
    shown = problems[:_SHOWN]
    more = len(problems) - len(shown)
    tail = [f"... and {more} more"] if more else []
    return f"{path}: malformed prompt file\n  " + "\n  ".join(shown + tail)


def _too_few(path: Path, count: int, found: int) -> str:
    if not found:
        return f"{path}: the prompt file holds no prompt record; the workload needs {count}"
    return f"{path}: the workload asks for {count} prompts, the file holds {found}"


def check_prompts(job: JobFile) -> list[str]:
    """What a run would refuse in the job's prompt files: a file that is missing or
    unreadable, a malformed record, too few records for the workload's ``count``.
    Each problem names the job file's line, or the prompt file's line."""
    problems: list[str] = []
    for i, workload in enumerate(job.spec.workloads):
        if workload.prompts is None:
            continue
        where = job.where("workloads", i, "prompts")
        path = job.spec.resolve(workload.prompts)
        if not path.is_file():
            problem = "is not a file" if path.exists() else "does not exist"
            problems.append(f"{where}: {path} {problem}")
            continue
        try:
            prompts, bad = read_prompt_file(path, workload.format)
        except SpecError as exc:
            problems.append(f"{where}: {exc}")
            continue
        problems += bad[:_SHOWN]
        if len(bad) > _SHOWN:
            problems.append(f"{path}: ... and {len(bad) - _SHOWN} more malformed records")
        if not bad and len(prompts) < workload.count:
            count = job.where("workloads", i, "count")
            problems.append(f"{count}: {_too_few(path, workload.count, len(prompts))}")
    return problems


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

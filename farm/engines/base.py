"""The contract every engine family adapter implements.

An adapter turns a planned cell into the exact argv, environment and request
bodies of its engine, and reads the engine's answers (metrics, responses, logs)
back into the farm's records. It holds all engine-specific knowledge. Its server runs
as an :class:`farm.engines.process.EngineProcess` of the family's own subclass.

What an engine answers is read through ``EngineAdapter.completion_from_response``
and ``counters_from_metrics``: whatever an adapter cannot read (malformed JSON,
wrong types, a counter that is not a count) becomes an ``EngineOutputError`` that
names what was wrong, never an IndexError out of the runner.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
from pydantic import Field

from farm.engines.process import EngineProcess, PdSide, ServerLaunch
from farm.errors import EngineError
from farm.frozen import Frozen
from farm.plan import Capabilities, ServerCell, Variant
from farm.records import EffectiveConfig, SpecCounters
from farm.spec import EngineSpec, ModelSpec, WorkloadSpec

__all__ = [
    "BuildRecipe",
    "Completion",
    "EngineAdapter",
    "EngineOutputError",
    "chat_messages",
    "chat_template_kwargs",
    "count_value",
    "pd_device_groups",
    "read_completion",
]


class EngineOutputError(EngineError):
    """An engine answered something its adapter cannot read: a body that is not
    JSON or not shaped as a completion, a metric that is not a count."""


# A folder of each build where its engine keeps what it makes while serving (compiled
# graphs): the build's own, never carried into a build derived from it.
RUN_CACHE = "run-cache"


class BuildRecipe(Frozen):
    """How to install an engine into an empty virtual environment.

    ``plugin_groups``: the entry-point groups through which the engine loads plugin
    packages; a layered build loads each overlay's entry points of these groups as its
    import check. Not part of the build id (it changes no file of the build).
    """

    requirements: tuple[str, ...]
    remove: tuple[str, ...] = ()
    import_check: str
    plugin_groups: tuple[str, ...] = Field(default=(), exclude=True)


class Completion(Frozen):
    """One parsed chat completion."""

    text: str
    completion_tokens: int
    finish_reason: str | None
    counters: SpecCounters | None = None
    request_id: str | None = None


class EngineAdapter(ABC):
    """One engine family (vLLM and its plugins, sglang, ...)."""

    family: ClassVar[str]
    # The family's engine process: its fatal log lines and device release checks.
    process_type: ClassVar[type[EngineProcess]]

    def process(
        self, launch: ServerLaunch, port: int, log_path: Path, npu_ids: tuple[int, ...] = ()
    ) -> EngineProcess:
        """The engine process serving ``launch`` on ``port``, not started yet (``start``)."""
        return self.process_type(launch, port, log_path, npu_ids)

    @abstractmethod
    def build_recipe(self, engine: EngineSpec) -> BuildRecipe:
        """Packages to install for ``engine`` and a Python statement proving it imports."""

    @abstractmethod
    def capabilities(self, engine: EngineSpec) -> Capabilities:
        """What this engine build can express (pure data; used by the planner)."""

    @abstractmethod
    def launch(
        self,
        cell: ServerCell,
        engine: EngineSpec,
        model: ModelSpec,
        model_path: str,
        python: str,
        port: int,
        npu_ids: tuple[int, ...] = (),
        pd: PdSide | None = None,
    ) -> ServerLaunch:
        """The server command line and environment for ``cell``; with ``pd``, that of
        one side of a disaggregated cell (:meth:`pd_launches` makes both)."""

    def pd_launches(
        self,
        cell: ServerCell,
        engine: EngineSpec,
        model: ModelSpec,
        model_path: str,
        python: str,
        ports: tuple[int, int],
        kv_ports: tuple[int, int],
        npu_ids: tuple[int, ...] = (),
        cpu_threads: int = 0,
    ) -> tuple[ServerLaunch, ServerLaunch]:
        """The prefill and the decode server of a disaggregated cell (deployment pd):
        ``ports`` their HTTP ports, ``kv_ports`` their KV side-channel ports, the
        cell's devices split in two groups (the first half prefills), and its
        ``cpu_threads`` (0: not known) in two halves."""
        groups = pd_device_groups(model, npu_ids)
        half = cpu_threads // 2
        threads = (max(1, half), max(1, cpu_threads - half)) if cpu_threads else (0, 0)
        sides = [
            PdSide(
                role=role,
                kv_port=kv_port,
                prefill_npus=len(groups[0]),
                decode_npus=len(groups[1]),
                cpu_threads=side_threads,
            )
            for role, kv_port, side_threads in zip(
                ("prefill", "decode"), kv_ports, threads, strict=True
            )
        ]
        prefill, decode = (
            self.launch(cell, engine, model, model_path, python, port, ids, side)
            for port, ids, side in zip(ports, groups, sides, strict=True)
        )
        return prefill, decode

    async def pd_request(
        self,
        client: httpx.AsyncClient,
        prefill_url: str,
        decode_url: str,
        prefill: ServerLaunch,
        path: str,
        body: dict[str, Any],
    ) -> httpx.Response:
        """One completion request through a disaggregated pair, as the engine's own
        router sends it; the decode server's response is the answer (its per-request
        counters are the decode side's). Default: the family has no such protocol."""
        raise EngineError(f"the {self.family} adapter has no disaggregated request protocol")

    @abstractmethod
    def chat_request(
        self,
        served_name: str,
        prompt: str,
        variant: Variant,
        workload: WorkloadSpec,
        history: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """The JSON body of one chat request for ``variant``; ``history`` holds the
        conversation's earlier (user, assistant) turns (:func:`chat_messages`)."""

    def tokenize_request(self, chat: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """The path and body that count the prompt tokens of chat request ``chat`` as
        the engine's chat template renders them (the answer holds ``count``); None
        when the family has no such endpoint."""
        return None

    @abstractmethod
    def parse_completion(self, body: dict[str, Any]) -> Completion:
        """Text, token count, finish reason and per-request counters of a response."""

    @abstractmethod
    def read_counters(self, metrics_text: str) -> SpecCounters:
        """Server-wide cumulative speculative counters from a metrics scrape
        (read each sample's value with ``count_value``)."""

    def completion_from_response(self, raw: bytes | str) -> Completion:
        """``parse_completion`` of a raw response body; EngineOutputError when it
        cannot be read (see ``read_completion``)."""
        return read_completion(self.parse_completion, raw)

    def counters_from_metrics(self, metrics_text: str) -> SpecCounters:
        """``read_counters`` of a metrics scrape; EngineOutputError (naming the sample)
        when the text is not Prometheus exposition or a counter is not a count."""
        try:
            counters = self.read_counters(metrics_text)
        except _SHAPE_ERRORS as exc:
            raise EngineOutputError(
                f"metrics are not readable Prometheus text ({_reason(exc)}): "
                f"{_excerpt(metrics_text)}"
            ) from None
        _check_counts(counters, "metrics counters")
        return counters

    def request_counters_from_log(self, log_text: str) -> dict[str, SpecCounters]:
        """Per-request counters the engine wrote to its log, keyed by response id.

        For engines whose responses carry no counters (sglang before 0.5.13); the
        runner matches them with ``Completion.request_id``. Default: none.
        """
        return {}

    @abstractmethod
    def effective_config(
        self, cell: ServerCell, log_text: str, models: dict[str, Any], hf_config: dict[str, Any]
    ) -> EffectiveConfig:
        """What the engine really runs, from its start-up log, model listing and config."""


# What a parser meets in a body of the wrong shape (pydantic's ValidationError is a
# ValueError): a missing key, an empty list, a string where a mapping was expected.
_SHAPE_ERRORS = (LookupError, TypeError, ValueError, AttributeError, ArithmeticError)
_EXCERPT = 200


def _excerpt(raw: bytes | str) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return repr(text[:_EXCERPT]) + ("..." if len(text) > _EXCERPT else "")


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def pd_device_groups(
    model: ModelSpec, npu_ids: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The prefill and the decode server's devices of a disaggregated cell: the
    model's share of ``npu_ids`` (its ``npus``, else all) in two groups, the first half
    prefilling. On CPU both are empty."""
    npu_ids = npu_ids[: model.npus] if model.npus else npu_ids
    half = len(npu_ids) // 2
    return npu_ids[:half], npu_ids[half:]


def read_completion(parse: Callable[[dict[str, Any]], Completion], raw: bytes | str) -> Completion:
    """``parse`` (an adapter's ``parse_completion``) of a raw response body.

    Raises EngineOutputError (what was wrong, with an excerpt of the body) when the
    body is not a JSON object, lacks what ``parse`` reads, has values of the wrong
    type, or carries negative per-request counters.
    """
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise EngineOutputError(f"completion is not JSON ({exc}): {_excerpt(raw)}") from None
    if not isinstance(body, dict):
        raise EngineOutputError(f"completion is not a JSON object: {_excerpt(raw)}")
    try:
        done = parse(body)
    except _SHAPE_ERRORS as exc:
        raise EngineOutputError(
            f"completion has not the expected shape ({_reason(exc)}): {_excerpt(raw)}"
        ) from None
    if done.counters is not None:
        _check_counts(done.counters, "per-request counters")
    return done


def chat_messages(
    prompt: str, history: Sequence[tuple[str, str]] = (), system: str | None = None
) -> list[dict[str, str]]:
    """OpenAI chat messages: the system message, the earlier turns, then ``prompt``.
    An earlier answer goes back as the engine gave it, thinking included: whether the
    chat template keeps it in the context is the model's own rule."""
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in history:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*messages, {"role": "user", "content": prompt}]


def chat_template_kwargs(variant: Variant, workload: WorkloadSpec) -> dict[str, Any]:
    """The chat template's switches of a request: the workload's own, and the thinking
    axis's ``enable_thinking`` (the workload may not set it: the axis owns it)."""
    return {**workload.chat_template_kwargs, "enable_thinking": variant.thinking == "on"}


def count_value(name: str, labels: dict[str, str], value: float) -> int:
    """A Prometheus sample's value as a count; EngineOutputError naming the sample
    when it is NaN, infinite or negative (counters only ever grow from 0)."""
    if not math.isfinite(value) or value < 0:
        shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        raise EngineOutputError(f"metric {name}{{{shown}}} is {value}, not a count")
    return int(value)


def _check_counts(counters: SpecCounters, what: str) -> None:
    negative = {k: v for k, v in counters.counts().items() if v < 0}
    if negative:
        raise EngineOutputError(f"{what} are negative: {negative}")

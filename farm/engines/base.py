"""The contract every engine family adapter implements.

An adapter turns a planned cell into the exact argv, environment and request
bodies of its engine, and reads the engine's answers (metrics, responses, logs)
back into the farm's records. It holds all engine-specific knowledge; it starts
nothing itself (the runner does the I/O).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from farm.plan import Capabilities, ServerCell, Variant
from farm.records import EffectiveConfig, SpecCounters
from farm.spec import EngineSpec, ModelSpec, WorkloadSpec

__all__ = ["BuildRecipe", "Completion", "EngineAdapter", "ServerLaunch"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BuildRecipe(_Frozen):
    """How to install an engine into an empty virtual environment."""

    requirements: tuple[str, ...]
    remove: tuple[str, ...] = ()
    import_check: str


class ServerLaunch(_Frozen):
    """Everything needed to start one engine server."""

    argv: tuple[str, ...]
    env: dict[str, str]
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    chat_path: str = "/v1/chat/completions"


class Completion(_Frozen):
    """One parsed chat completion."""

    text: str
    completion_tokens: int
    finish_reason: str | None
    counters: SpecCounters | None = None
    request_id: str | None = None


class EngineAdapter(ABC):
    """One engine family (vLLM and its plugins, sglang, ...)."""

    family: ClassVar[str]

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
    ) -> ServerLaunch:
        """The server command line and environment for ``cell``."""

    @abstractmethod
    def chat_request(
        self, served_name: str, prompt: str, variant: Variant, workload: WorkloadSpec
    ) -> dict[str, Any]:
        """The JSON body of one chat request for ``variant``."""

    @abstractmethod
    def parse_completion(self, body: dict[str, Any]) -> Completion:
        """Text, token count, finish reason and per-request counters of a response."""

    @abstractmethod
    def read_counters(self, metrics_text: str) -> SpecCounters:
        """Server-wide cumulative speculative counters from a metrics scrape."""

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

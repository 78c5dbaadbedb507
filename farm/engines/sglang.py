"""sglang's HTTP server (``python -m sglang.launch_server``), on Ascend NPUs or elsewhere.

Flags, request fields and metric names change across sglang releases; every
version-dependent choice is a row of :mod:`farm.engines.dialects`. Facts without a
dialect (the same in every supported release) cite the file they were read from.
"""

from __future__ import annotations

import ast
import asyncio
import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import httpx
from packaging.utils import canonicalize_name
from prometheus_client.parser import text_string_to_metric_families

from farm.engines.base import (
    BuildRecipe,
    Completion,
    EngineAdapter,
    chat_messages,
    chat_template_kwargs,
    count_value,
)
from farm.engines.dialects import (
    SGLANG_GRAPH,
    SGLANG_REQUEST,
    SglangGraphFlags,
    pick,
)
from farm.engines.process import COMMON_FATAL_PATTERNS, EngineProcess, PdSide, ServerLaunch
from farm.plan import Capabilities, ServerCell, Variant
from farm.records import EffectiveConfig, SpecCounters
from farm.spec import EngineSpec, ModelSpec, WorkloadSpec

__all__ = [
    "SglangAdapter",
    "SglangProcess",
    "accept_length_from_server_info",
    "counters_from_meta_info",
    "read_window_gauges",
]

# The farm's speculative methods as sglang's --speculative-algorithm values.
_ALGORITHM = {
    "mtp": "NEXTN",
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
    "draft_model": "STANDALONE",
    "ngram": "NGRAM",
}
_METHOD = {v: k for k, v in _ALGORITHM.items()}
# A build that can drive an Ascend NPU carries torch_npu; that decides the device.
_NPU_PACKAGES = frozenset({"torch-npu", "sgl-kernel-npu"})
_PIN_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# meta_info names, newest first: each release uses one of each (dialects.SGLANG_SPEC_FIELDS).
_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
_SERVER_ARGS_LINE = re.compile(r"server_args=(?:ServerArgs\(|\{)(?P<body>.*)$")
_VALUE = r"(?P<v>'[^']*'|\"[^\"]*\"|[^,)}\s]+)"
_DECODE_BACKEND = re.compile(r"decode(?:=PhaseConfig\(|': \{')backend(?:=|': )'(\w+)'")
_PREFILL_BACKEND = re.compile(r"prefill(?:=PhaseConfig\(|': \{')backend(?:=|': )'(\w+)'")


def is_npu_engine(engine: EngineSpec) -> bool:
    """True when the engine's build installs Ascend's torch adapter (``torch-npu``)."""
    names = {_PIN_NAME.match(p) for p in engine.pins}
    return any(m and canonicalize_name(m[1]) in _NPU_PACKAGES for m in names)


def _serve_argv(python: str, model_path: str, model: ModelSpec, port: int) -> list[str]:
    """The server command line every cell starts with: the model, where to listen, its
    context length, a fixed seed and the metrics endpoint."""
    return [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--served-model-name",
        model.served_name or model.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--context-length",
        str(model.max_model_len),
        "--random-seed",
        "0",
        "--enable-metrics",
    ]


def _request_log_args(engine: EngineSpec) -> list[str]:
    """The request log of a speculative cell, for releases whose chat responses carry no
    per-request counters but whose log can (none otherwise)."""
    fields = pick(SGLANG_REQUEST, engine.version, f"sglang engine {engine.name}").value
    if not fields.json_request_log or fields.meta_info_in_chat:
        return []
    # Level 0 logs meta_info without prompts or outputs: the only source of
    # per-request counters while the chat API hides meta_info.
    return ["--log-requests", "--log-requests-level", "0", "--log-requests-format", "json"]


def _disaggregation_args(engine: EngineSpec, pd: PdSide) -> list[str]:
    """One side of sglang's own disaggregation (python/sglang/srt/disaggregation).

    Both sides run the same speculative arguments (the prefill side hands the decode
    side the draft's first input), the prefill side serves the bootstrap the decode side
    connects to; on Ascend the transfer backend is "ascend" (its memfabric transfer
    engine), elsewhere mooncake.
    """
    backend = "ascend" if is_npu_engine(engine) else "mooncake"
    argv = ["--disaggregation-mode", pd.role, "--disaggregation-transfer-backend", backend]
    if pd.role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(pd.kv_port)]
    return argv


class SglangProcess(EngineProcess):
    """An sglang server process (``sglang.launch_server``)."""

    fatal_patterns: ClassVar[tuple[re.Pattern[str], ...]] = (
        *COMMON_FATAL_PATTERNS,
        # python/sglang/srt/model_executor/model_runner.py, cuda/npu graph runner.
        re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
        re.compile(r"Capture (?:cuda|npu) graph failed"),
    )
    wrapper_patterns: ClassVar[tuple[re.Pattern[str], ...]] = (
        # managers/scheduler.py, entrypoints/http_server.py.
        re.compile(r"Scheduler hit an exception"),
        re.compile(r"Initialization failed\. warmup error"),
    )


class SglangAdapter(EngineAdapter):
    """sglang's OpenAI-compatible server with NEXTN (MTP) speculative decoding."""

    family: ClassVar[str] = "sglang"
    process_type: ClassVar[type[EngineProcess]] = SglangProcess

    def build_recipe(self, engine: EngineSpec) -> BuildRecipe:
        # The PyPI wheel depends on CUDA torch, flashinfer and sgl-kernel. On Ascend
        # the job pins torch, torch-npu (and the rest of the CANN stack the users'
        # images hold) next to it, as the sglang Ascend install guide does.
        return BuildRecipe(
            requirements=(*engine.pins, f"{engine.package}=={engine.version}"),
            import_check=("import sglang, sglang.srt.server_args; print(sglang.__version__)"),
        )

    def capabilities(self, engine: EngineSpec) -> Capabilities:
        graph = self._graph(engine)
        npu = is_npu_engine(engine)
        piecewise = (
            "sglang disables its piecewise (prefill) graphs on NPU "
            "(server_args._handle_piecewise_cuda_graph: is_npu())"
            if npu
            else "sglang's piecewise graphs cover prefill only, beside the full decode graph; "
            "no piecewise-only decode mode exists"
        )
        return Capabilities(
            graph_modes={
                "eager": "eager",
                "full_decode_only": "full_decode_only",
                "piecewise": None,
                "full": None,
                "compiled": None,
            },
            graph_mode_reasons={
                "piecewise": piecewise,
                "full": "sglang captures no full-graph prefill; its decode graph is "
                "full_decode_only",
                "compiled": "sglang's --enable-torch-compile compiles inside the decode "
                f"graph capture, not as a mode of its own (graph flags: {graph.name})",
            },
            speculative_methods=tuple(_ALGORITHM),
            # EAGLEWorker captures the draft graph whenever the target's decode graph
            # is captured; no server argument the adapter knows turns off the draft's
            # alone (vLLM's speculative enforce_eager has no sglang counterpart).
            eager_drafter_reason="sglang runs the drafter in the target's graph mode: no "
            "server argument runs it eager beside a captured decode graph",
            capture_sizes_reason="sglang captures decode graphs per batch size "
            "(--cuda-graph-bs), not per token count: give them in extra_args",
        )

    def _graph(self, engine: EngineSpec) -> SglangGraphFlags:
        return pick(SGLANG_GRAPH, engine.version, f"sglang engine {engine.name}").value

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
        # A model that names its NPU count uses that many of the devices it was given.
        npu_ids = npu_ids[: model.npus] if model.npus else npu_ids
        argv = _serve_argv(python, model_path, model, port)
        graph = self._graph(engine)
        argv += graph.eager if cell.planned_graph_mode == "eager" else graph.decode_only
        if cell.speculative:
            argv += self._speculative_args(cell.mtp_depth, model)
            argv += _request_log_args(engine)
        if model.thinking:
            argv += ["--reasoning-parser", "qwen3"]
        if cell.sliding_window == "off":
            argv += [
                "--json-model-override-args",
                json.dumps({"use_sliding_window": False, "sliding_window": None}),
            ]
        if cell.prefix_caching == "off":
            argv.append("--disable-radix-cache")  # the radix cache is on by default
        if len(npu_ids) > 1:
            argv += ["--tp-size", str(len(npu_ids))]
        env = {}
        if is_npu_engine(engine):
            argv += ["--device", "npu", "--attention-backend", "ascend"]
            # FIA attention kernels (ascend_backend.py reads ASCEND_USE_FIA); the NPU
            # tests of sglang run with it.
            env["ASCEND_USE_FIA"] = "1"
        if pd is not None:
            argv += _disaggregation_args(engine, pd)
        argv += list(engine.extra_args)
        env.update(engine.env)
        if npu_ids:
            env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(str(i) for i in npu_ids)
        # /health_generate runs a one-token generation when the server is idle: ready
        # means the scheduler answers, not only the HTTP process (http_server.py). A
        # server of a disaggregated pair cannot generate alone: /health.
        health = "/health_generate" if pd is None else "/health"
        return ServerLaunch(argv=tuple(argv), env=env, health_path=health, pd=pd)

    async def pd_request(
        self,
        client: httpx.AsyncClient,
        prefill_url: str,
        decode_url: str,
        prefill: ServerLaunch,
        path: str,
        body: dict[str, Any],
    ) -> httpx.Response:
        """sglang's router protocol (sglang_router's mini load balancer): the same
        request to both servers at once, naming the prefill server's bootstrap and a
        random room that pairs the two; the decode server's answer is the response."""
        assert prefill.pd is not None
        paired = {
            **body,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill.pd.kv_port,
            "bootstrap_room": random.randint(0, 2**63 - 1),
        }
        prefilled, decoded = await asyncio.gather(
            client.post(prefill_url + path, json=paired),
            client.post(decode_url + path, json=paired),
        )
        return decoded if prefilled.status_code == 200 else prefilled

    def _speculative_args(self, depth: int, model: ModelSpec) -> list[str]:
        algorithm = _ALGORITHM[model.speculative_method]
        if algorithm == "NGRAM":
            return [
                "--speculative-algorithm",
                algorithm,
                "--speculative-num-draft-tokens",
                str(depth + 1),
            ]
        args = [
            "--speculative-algorithm",
            algorithm,
            "--speculative-num-steps",
            str(depth),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(depth + 1),
        ]
        if model.draft_model:
            args += ["--speculative-draft-model-path", model.draft_model]
        return args

    def chat_request(
        self,
        served_name: str,
        prompt: str,
        variant: Variant,
        workload: WorkloadSpec,
        history: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        # Both return_* fields are read by the releases that know them (dialects.
        # SGLANG_REQUEST); older ChatCompletionRequest models ignore unknown fields
        # (pydantic's default extra="ignore" in entrypoints/openai/protocol.py).
        return {
            "model": served_name,
            "messages": chat_messages(prompt, history, workload.system_prompt),
            "max_tokens": workload.max_tokens,
            "temperature": workload.temperature,
            "seed": workload.seed,
            "chat_template_kwargs": chat_template_kwargs(variant, workload),
            "return_meta_info": True,
            "return_spec_tokens_details": True,
        }

    def parse_completion(self, body: dict[str, Any]) -> Completion:
        choice = body["choices"][0]
        message = choice.get("message") or {}
        # --reasoning-parser moves the thinking part into reasoning_content.
        text = (message.get("reasoning_content") or "") + (message.get("content") or "")
        meta = choice.get("meta_info") or {}
        details = (body.get("sglext") or {}).get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
        counters = counters_from_meta_info(meta) or counters_from_meta_info(details or {})
        usage = body.get("usage") or {}
        return Completion(
            text=text,
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason"),
            counters=counters,
            request_id=body.get("id"),
        )

    def request_counters_from_log(self, log_text: str) -> dict[str, SpecCounters]:
        """Per-request counters from ``request.finished`` JSON lines of the server log.

        sglang before 0.5.13 returns no meta_info through the chat API; the JSON
        request log (``--log-requests-format json``, from 0.5.7) has it, keyed by the
        request id that the chat response carries as ``id``.
        """
        found: dict[str, SpecCounters] = {}
        for line in log_text.splitlines():
            start = line.find('{"timestamp"')
            if start < 0 or '"request.finished"' not in line:
                continue
            try:
                record = json.loads(line[start:])
            except ValueError:
                continue
            meta = (record.get("out") or {}).get("meta_info") or {}
            counters = counters_from_meta_info(meta)
            rid = record.get("rid") or meta.get("id")
            if counters is not None and isinstance(rid, str):
                found[rid] = counters
        return found

    def read_counters(self, metrics_text: str) -> SpecCounters:
        """Cumulative counters derived from sglang's Prometheus counters.

        From 0.5.14 (dialects.SGLANG_METRICS): drafts = ``spec_verify_calls_total``;
        draft tokens = drafts x (``spec_num_draft_tokens`` - 1); accepted =
        ``generation_tokens_total`` - ``num_requests_total`` - drafts, since each
        finished request emits one token from prefill and (accepted + 1) per verify
        step. Approximate: tokens trimmed after a stop string are not counted. No
        per-position counts. Before 0.5.14 only gauges of the last log window exist
        and all counters are 0: use per-request counters instead.
        """
        totals: dict[str, float] = {}
        width = 0.0
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name in (
                    "sglang:spec_verify_calls_total",
                    "sglang:generation_tokens_total",
                    "sglang:num_requests_total",
                ):
                    value = count_value(sample.name, sample.labels, sample.value)
                    totals[sample.name] = totals.get(sample.name, 0.0) + value
                elif sample.name == "sglang:spec_num_draft_tokens":
                    width = max(width, count_value(sample.name, sample.labels, sample.value))
        drafts = int(totals.get("sglang:spec_verify_calls_total", 0))
        if not drafts:
            return SpecCounters()
        generated = int(totals.get("sglang:generation_tokens_total", 0))
        requests = int(totals.get("sglang:num_requests_total", 0))
        return SpecCounters(
            drafts=drafts,
            draft_tokens=drafts * max(int(width) - 1, 0),
            accepted=max(generated - requests - drafts, 0),
        )

    def effective_config(
        self, cell: ServerCell, log_text: str, models: dict[str, Any], hf_config: dict[str, Any]
    ) -> EffectiveConfig:
        settings = _settings_from_log(log_text)
        if not settings:
            return EffectiveConfig(notes=("server_args line not found in the log",))
        return _effective(cell, settings, models, hf_config)

    def effective_config_from_server_info(
        self, cell: ServerCell, info: Mapping[str, Any], hf_config: dict[str, Any]
    ) -> EffectiveConfig:
        """The same read-back from ``GET /server_info`` (``/get_server_info`` before 0.5.8).

        The body holds the resolved server arguments and ``version``.
        """
        settings = {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))}
        for phase in ("decode", "prefill"):
            config = (info.get("cuda_graph_config") or {}).get(phase) or {}
            if isinstance(config, dict) and "backend" in config:
                settings[f"{phase}_backend"] = config["backend"]
        return _effective(cell, settings, {}, hf_config, version=info.get("version"))


def counters_from_meta_info(meta: Mapping[str, Any]) -> SpecCounters | None:
    """Counters of one request from sglang's ``meta_info`` (or ``SpecTokensDetails``).

    ``None`` when the request ran no verify step (speculation off). Every release's
    field names are tried (dialects.SGLANG_SPEC_FIELDS); per-position counts come
    from the acceptance histogram (``hist[j]`` = verify steps that accepted exactly
    ``j`` drafts, so position ``i`` was accepted in every step with more than ``i``).
    Releases before 0.5.6 report only rates; counts are then rebuilt from
    ``spec_accept_length`` = completion tokens / verify steps.
    """
    verify = int(meta.get("spec_verify_ct") or 0)
    if verify <= 0:
        return None
    accepted = _first(meta, _ACCEPTED)
    proposed = _first(meta, _PROPOSED)
    hist = next((meta[k] for k in _HISTOGRAM if meta.get(k)), None)
    if accepted is None and hist:
        accepted = sum(j * int(n) for j, n in enumerate(hist))
    if accepted is None:
        completion = int(meta.get("completion_tokens") or 0)
        accepted = max(completion - 1 - verify, 0)
    depth = proposed // verify if proposed else (len(hist) - 1 if hist else 0)
    per_pos: tuple[int, ...] = ()
    if hist:
        counts = [int(n) for n in hist]
        per_pos = tuple(sum(counts[i + 1 :]) for i in range(max(depth, len(counts) - 1)))
    return SpecCounters(
        drafts=verify,
        draft_tokens=proposed if proposed is not None else 0,
        accepted=accepted,
        accepted_per_pos=per_pos,
    )


def accept_length_from_server_info(info: Mapping[str, Any]) -> float | None:
    """Server-wide mean acceptance length from ``/server_info`` (fallback only).

    Mean of ``internal_states[i].avg_spec_accept_length`` over data-parallel ranks.
    Caveats: the scheduler updates it only every ``--decode-log-interval`` (40)
    decode iterations, it averages the last window rather than the variant, and
    ``/flush_cache`` resets it. It includes the bonus token (AL, not accepted/step).
    """
    values = [
        float(s["avg_spec_accept_length"])
        for s in info.get("internal_states") or []
        if isinstance(s, Mapping) and s.get("avg_spec_accept_length") is not None
    ]
    return sum(values) / len(values) if values else None


def read_window_gauges(metrics_text: str) -> dict[str, float]:
    """``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` gauges, averaged.

    Gauges of the scheduler's last log window: they describe the latest few dozen
    decode steps, cannot be differenced and say nothing about one variant.
    """
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in ("sglang:spec_accept_length", "sglang:spec_accept_rate"):
                values.setdefault(sample.name.split(":", 1)[1], []).append(sample.value)
    return {k: sum(v) / len(v) for k, v in values.items()}


def _first(meta: Mapping[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        if meta.get(name) is not None:
            return int(meta[name])
    return None


def _literal(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _settings_from_log(log_text: str) -> dict[str, Any]:
    """Server arguments from the last ``server_args=`` line sglang logs at start.

    Releases up to 0.5.19 log the dataclass repr (``server_args=ServerArgs(a=1, ...)``),
    later ones the resolved dict (``server_args={'a': 1, ...}``); both are read.
    """
    body = None
    for line in log_text.splitlines():
        match = _SERVER_ARGS_LINE.search(line)
        if match:
            body = match["body"]
    if body is None:
        return {}
    settings: dict[str, Any] = {}
    for key in (
        "disable_cuda_graph",
        "disable_piecewise_cuda_graph",
        "enable_piecewise_cuda_graph",
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "context_length",
        "device",
        "attention_backend",
        "tp_size",
    ):
        found = re.search(rf"(?:\b|')({key})(?:'?: |=){_VALUE}", body)
        if found:
            settings[key] = _literal(found["v"])
    for phase, pattern in (("decode", _DECODE_BACKEND), ("prefill", _PREFILL_BACKEND)):
        found = pattern.search(body)
        if found:
            settings[f"{phase}_backend"] = found[1]
    return settings


def _graph_mode(settings: Mapping[str, Any]) -> str | None:
    decode = settings.get("decode_backend")
    if decode is not None:
        if decode == "disabled":
            return "eager"
        prefill = settings.get("prefill_backend", "disabled")
        return "full_decode_only" if prefill == "disabled" else f"{decode}+{prefill}-prefill"
    if settings.get("disable_cuda_graph") is True:
        return "eager"
    if settings.get("disable_cuda_graph") is None:
        return None
    piecewise = settings.get("disable_piecewise_cuda_graph") is False or (
        "disable_piecewise_cuda_graph" not in settings
        and settings.get("enable_piecewise_cuda_graph") is True
    )
    return "full+piecewise-prefill" if piecewise else "full_decode_only"


def _effective(
    cell: ServerCell,
    settings: Mapping[str, Any],
    models: dict[str, Any],
    hf_config: dict[str, Any],
    version: Any = None,
) -> EffectiveConfig:
    notes: list[str] = []
    graph_mode = _graph_mode(settings)
    if graph_mode is not None and graph_mode != cell.planned_graph_mode:
        notes.append(f"engine runs graph mode {graph_mode}, planned {cell.planned_graph_mode}")
    algorithm = settings.get("speculative_algorithm")
    method = _METHOD.get(str(algorithm).upper()) if algorithm else None
    if method == "eagle" and cell.speculative:
        # Some releases rewrite NEXTN to EAGLE in ServerArgs.__post_init__ (0.5.9):
        # the same MTP drafter run through the EAGLE worker.
        notes.append("speculative algorithm reported as EAGLE (sglang's NEXTN alias)")
        method = "mtp"
    steps = settings.get("speculative_num_steps") if algorithm else None
    window = hf_config.get("sliding_window")
    if window and cell.sliding_window == "off":
        notes.append(f"sliding window {window} turned off by --json-model-override-args")
        window = None
    disabled = settings.get("disable_radix_cache")
    prefix_caching = not disabled if isinstance(disabled, bool) else None
    if prefix_caching is not None and prefix_caching != (cell.prefix_caching == "on"):
        notes.append(
            f"engine runs the radix cache {'on' if prefix_caching else 'off'}, "
            f"planned {cell.prefix_caching}"
        )
    served = (models.get("data") or [{}])[0]
    max_len = served.get("max_model_len") or settings.get("context_length")
    return EffectiveConfig(
        engine_version=str(version) if version else None,
        graph_mode=graph_mode,
        speculative_method=method,
        num_speculative_tokens=int(steps) if isinstance(steps, int) else 0,
        sliding_window=window,
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
        prefix_caching=prefix_caching,
        notes=tuple(notes),
    )

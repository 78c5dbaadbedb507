"""Version dialects of the engines, as data: one table per concern, keyed by version range.

Each row says which releases it covers (a PEP 440 specifier) and where the fact was
read. Boundaries were found by reading each released wheel's source (``pip download
sglang==X --no-deps``; vllm-ascend's git tags); the contract test parses the argv of
several versions with the engine's own parser. Adapters look rows up with
:func:`pick`; nothing else in the farm branches on an engine version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from farm.errors import PlanError
from farm.frozen import Frozen

__all__ = [
    "SGLANG_GRAPH",
    "SGLANG_METRICS",
    "SGLANG_REQUEST",
    "SGLANG_SPEC_FIELDS",
    "VLLM_ASCEND_GRAPH",
    "Dialect",
    "SglangGraphFlags",
    "SglangMetrics",
    "SglangRequestFields",
    "SglangSpecFields",
    "VllmAscendGraph",
    "pick",
]

T = TypeVar("T", bound=BaseModel)


class Dialect(Frozen, Generic[T]):
    """One row: the releases in ``versions`` speak ``value``; ``source`` says where it was read."""

    versions: str
    value: T
    source: str

    def covers(self, version: Version) -> bool:
        # Release candidates and dev builds (vllm-ascend v0.21.0rc1, a PR's
        # 0.17.0rc2.dev307) must match their range like any release.
        return SpecifierSet(self.versions).contains(version, prereleases=True)


def pick(table: Sequence[Dialect[T]], version: str | None, what: str) -> Dialect[T]:
    """The row of ``table`` covering ``version``; PlanError naming ``what`` if none does."""
    if version is None:
        raise PlanError(f"{what}: the engine names no version, so its dialect is unknown")
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise PlanError(f"{what}: {version!r} is not a PEP 440 version") from None
    for row in table:
        if row.covers(parsed):
            return row
    ranges = ", ".join(r.versions for r in table)
    raise PlanError(f"{what}: no dialect covers version {version} (known: {ranges})")


# --- sglang ---------------------------------------------------------------------


class SglangGraphFlags(Frozen):
    """Server flags for sglang's graph modes in one dialect.

    sglang's graph is a decode-phase graph ("cuda graph", an ACL graph on Ascend;
    target-verify batches of speculative decoding replay it too) plus, from 0.5.10,
    an optional piecewise graph for prefill/extend. ``eager`` turns both off;
    ``decode_only`` keeps the full decode graph and runs prefill eagerly, i.e. the
    farm's ``full_decode_only``. ``removed`` lists graph flags this dialect rejects.
    """

    name: str
    eager: tuple[str, ...]
    decode_only: tuple[str, ...]
    removed: tuple[str, ...] = ()
    deprecated: tuple[str, ...] = ()


SGLANG_GRAPH: tuple[Dialect[SglangGraphFlags], ...] = (
    Dialect(
        versions="<0.5.10",
        value=SglangGraphFlags(
            name="opt-in piecewise",
            eager=("--disable-cuda-graph",),
            decode_only=(),  # piecewise prefill graphs are opt-in here
            removed=(
                "--disable-piecewise-cuda-graph",
                "--cuda-graph-backend-decode",
                "--cuda-graph-backend-prefill",
            ),
        ),
        source="python/sglang/srt/server_args.py (0.5.9): --disable-cuda-graph, "
        "--cuda-graph-bs, --cuda-graph-max-bs, opt-in --enable-piecewise-cuda-graph",
    ),
    Dialect(
        versions=">=0.5.10,<0.5.14",
        value=SglangGraphFlags(
            name="piecewise by default",
            eager=("--disable-cuda-graph",),
            decode_only=("--disable-piecewise-cuda-graph",),
            removed=("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill"),
            deprecated=("--enable-piecewise-cuda-graph",),
        ),
        source="python/sglang/srt/server_args.py (0.5.10, 0.5.12.post1, 0.5.13.post1): "
        "--disable-piecewise-cuda-graph; --enable-piecewise-cuda-graph is a DeprecatedAction",
    ),
    Dialect(
        versions=">=0.5.14,<0.5.20",
        value=SglangGraphFlags(
            name="per-phase backends, legacy aliases",
            eager=(
                "--cuda-graph-backend-decode",
                "disabled",
                "--cuda-graph-backend-prefill",
                "disabled",
            ),
            decode_only=(
                "--cuda-graph-backend-decode",
                "full",
                "--cuda-graph-backend-prefill",
                "disabled",
            ),
            deprecated=(
                "--disable-cuda-graph",
                "--disable-piecewise-cuda-graph",
                "--cuda-graph-bs",
                "--cuda-graph-max-bs",
            ),
        ),
        source="python/sglang/srt/server_args.py (0.5.14-0.5.19): cuda_graph_backend_decode/"
        "_prefill fields; --cuda-graph-bs and --cuda-graph-max-bs are DeprecatedAliasStoreAction",
    ),
    Dialect(
        versions=">=0.5.20",
        value=SglangGraphFlags(
            name="per-phase backends",
            eager=(
                "--cuda-graph-backend-decode",
                "disabled",
                "--cuda-graph-backend-prefill",
                "disabled",
            ),
            decode_only=(
                "--cuda-graph-backend-decode",
                "full",
                "--cuda-graph-backend-prefill",
                "disabled",
            ),
            removed=("--cuda-graph-bs", "--cuda-graph-max-bs", "--disable-piecewise-cuda-graph"),
            deprecated=("--disable-cuda-graph",),
        ),
        source="python/sglang/srt/server_args.py + arg_groups/ (0.5.20-0.5.23): "
        "--cuda-graph-bs-decode, --cuda-graph-max-bs-decode; --cuda-graph-bs is gone",
    ),
)


class SglangSpecFields(Frozen):
    """Names of the per-request speculative fields sglang puts in ``meta_info``.

    ``accepted``/``proposed`` count draft tokens (the bonus token excluded);
    ``histogram[j]`` counts verify steps that accepted exactly ``j`` drafts.
    ``None``: the dialect does not report it.
    """

    accepted: str | None
    proposed: str | None
    histogram: str | None


SGLANG_SPEC_FIELDS: tuple[Dialect[SglangSpecFields], ...] = (
    Dialect(
        versions="<0.5.6",
        value=SglangSpecFields(accepted=None, proposed=None, histogram=None),
        source="tokenizer_manager.py _calculate_spec_decoding_metrics (0.5.5): only "
        "spec_verify_ct, spec_accept_rate, spec_accept_length",
    ),
    Dialect(
        versions=">=0.5.6,<0.5.9",
        value=SglangSpecFields(
            accepted="spec_accept_token_num", proposed="spec_draft_token_num", histogram=None
        ),
        source="tokenizer_manager.py _calculate_spec_decoding_metrics (0.5.6-0.5.8)",
    ),
    Dialect(
        versions=">=0.5.9,<0.5.11",
        value=SglangSpecFields(
            accepted="spec_accept_token_num",
            proposed="spec_draft_token_num",
            histogram="spec_accept_histogram",
        ),
        source="tokenizer_manager.py _calculate_spec_decoding_metrics (0.5.9, 0.5.10)",
    ),
    Dialect(
        versions=">=0.5.11,<0.5.12",
        value=SglangSpecFields(
            accepted="spec_accepted_drafts",
            proposed="spec_proposed_drafts",
            histogram="spec_accept_histogram",
        ),
        source="tokenizer_manager.py _calculate_spec_decoding_metrics (0.5.11)",
    ),
    Dialect(
        versions=">=0.5.12",
        value=SglangSpecFields(
            accepted="spec_num_correct_drafts",
            proposed="spec_num_proposed_drafts",
            histogram="spec_correct_drafts_histogram",
        ),
        source="tokenizer_manager.py _calculate_spec_decoding_metrics (0.5.12-0.5.23; "
        "0.5.12-0.5.20 also send the old names spec_accepted_drafts/spec_proposed_drafts/"
        "spec_accept_histogram as aliases)",
    ),
)


class SglangRequestFields(Frozen):
    """Where one sglang release puts a request's ``meta_info`` for an OpenAI chat call.

    ``meta_info_in_chat``: ``return_meta_info: true`` copies it into
    ``choices[i].meta_info``. ``spec_details_in_chat``: ``return_spec_tokens_details:
    true`` adds ``sglext.spec_tokens_details``. ``json_request_log``: ``--log-requests
    --log-requests-format json`` writes a ``request.finished`` line per request with
    ``rid`` (the chat response id) and ``out.meta_info`` to the server log.
    """

    meta_info_in_chat: bool
    spec_details_in_chat: bool
    json_request_log: bool


SGLANG_REQUEST: tuple[Dialect[SglangRequestFields], ...] = (
    Dialect(
        versions="<0.5.7",
        value=SglangRequestFields(
            meta_info_in_chat=False, spec_details_in_chat=False, json_request_log=False
        ),
        source="no per-request speculative fields reach an OpenAI client before 0.5.7",
    ),
    Dialect(
        versions=">=0.5.7,<0.5.13",
        value=SglangRequestFields(
            meta_info_in_chat=False, spec_details_in_chat=False, json_request_log=True
        ),
        source="utils/request_logger.py log_finished_request (0.5.7-0.5.12.post1): "
        "log_json(..., 'request.finished', {'rid', 'obj', 'out'})",
    ),
    Dialect(
        versions=">=0.5.13,<0.5.19",
        value=SglangRequestFields(
            meta_info_in_chat=True, spec_details_in_chat=False, json_request_log=True
        ),
        source="entrypoints/openai/protocol.py ChatCompletionRequest.return_meta_info (0.5.13)",
    ),
    Dialect(
        versions=">=0.5.19",
        value=SglangRequestFields(
            meta_info_in_chat=True, spec_details_in_chat=True, json_request_log=True
        ),
        source="entrypoints/openai/protocol.py return_spec_tokens_details, SpecTokensDetails "
        "(0.5.19-0.5.23)",
    ),
)


class SglangMetrics(Frozen):
    """What sglang's Prometheus endpoint (``--enable-metrics``) can give the farm.

    ``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` are gauges of the
    scheduler's last decode-log window in every release: no deltas can be taken.
    ``verify_counter``: ``sglang:spec_verify_calls_total`` (a counter, increased by
    a request's ``spec_verify_ct`` when it finishes) and the ``sglang:spec_num_draft_tokens``
    gauge exist, so drafts and draft tokens of an interval can be derived.
    """

    verify_counter: bool


SGLANG_METRICS: tuple[Dialect[SglangMetrics], ...] = (
    Dialect(
        versions="<0.5.14",
        value=SglangMetrics(verify_counter=False),
        source="metrics/collector.py (0.5.5-0.5.13.post1): only the two spec gauges",
    ),
    Dialect(
        versions=">=0.5.14",
        value=SglangMetrics(verify_counter=True),
        source="metrics/collector.py (0.5.14-0.5.23): Counter sglang:spec_verify_calls_total, "
        "Gauge sglang:spec_num_draft_tokens",
    ),
)


# --- vllm-ascend ----------------------------------------------------------------


class VllmAscendGraph(Frozen):
    """What vllm-ascend does with the graph mode it is given, in one dialect.

    ``default``: the mode a server runs without ``--enforce-eager`` or an explicit
    ``cudagraph_mode`` (vLLM's default FULL_AND_PIECEWISE, as the platform leaves it).
    """

    default: str


VLLM_ASCEND_GRAPH: tuple[Dialect[VllmAscendGraph], ...] = (
    Dialect(
        versions="<0.21.0rc1",
        value=VllmAscendGraph(default="piecewise"),
        source="vllm_ascend/platform.py check_and_update_config (v0.18.0-v0.20.2rc1, "
        "PR #8210's base): FULL_AND_PIECEWISE is rewritten to PIECEWISE",
    ),
    Dialect(
        versions=">=0.21.0rc1",
        value=VllmAscendGraph(default="full_and_piecewise"),
        source="vllm-ascend PR #9572 (first in v0.21.0rc1): the rewrite is gone, "
        "FULL_AND_PIECEWISE is the default",
    ),
)

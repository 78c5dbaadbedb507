"""Expand a job into server-level cells and request-level variants. Pure: no I/O.

A server-level cell (engine x model x graph mode x MTP depth x sliding window x ...)
gets one engine server (two in a disaggregated prefill/decode cell, deployment pd);
thinking mode and workloads are variants served by that server.
Cells an engine cannot express exactly are remapped (the remap is recorded) or
excluded with a reason, never silently dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, cast

from pydantic import Field, model_validator

from farm.axes import (
    AXIS_NAMES,
    REQUEST_AXES,
    SERVER_AXES,
    Axis,
    AxisValue,
    Deployment,
    DraftGraphMode,
    GraphMode,
    OnOff,
    axes_text,
    explicit,
    fold_axis_values,
    parse_axis_value,
    speculates,
    variant_label,
)
from farm.comparable import ComparableKey
from farm.errors import PlanError
from farm.frozen import Frozen
from farm.spec import JobSpec, ModelSpec, WorkloadSpec

__all__ = [
    "FULL_GRAPH_MODES",
    "Capabilities",
    "CaptureFit",
    "ExcludedCell",
    "Plan",
    "ServerCell",
    "Variant",
    "capture_fit",
    "cell_model",
    "expand_matrix",
    "parse_only",
    "select",
    "workload_identity",
]


# Graph modes that capture the decode step whole: its shapes are fixed at capture time.
FULL_GRAPH_MODES = frozenset({"full_decode_only", "full", "full_and_piecewise"})


class CaptureFit(Frozen):
    """How one cell's verify batches meet its decode graph's capture sizes.

    A decode round of ``r`` requests at MTP depth ``k`` verifies ``r * (k + 1)``
    tokens. ``exact``: request counts whose round is a capture size; ``padded``:
    request count -> the request count its round is padded to (the next capture size
    that holds whole requests); ``eager``: request counts no capture size holds (past
    the largest, or no larger size is a multiple of ``k + 1``): those rounds run
    without the full graph.
    """

    depth: int
    exact: tuple[int, ...]
    padded: dict[int, int]
    eager: tuple[int, ...]

    def describe(self) -> str:
        k1 = self.depth + 1
        parts = []
        if self.exact:
            parts.append(f"captured {_requests(self.exact, k1)}")
        if self.padded:
            pads = ", ".join(f"{r}->{p}" for r, p in self.padded.items())
            parts.append(f"padded (requests) {pads}")
        if self.eager:
            parts.append(f"no full graph for {_requests(self.eager, k1)}")
        return f"verify rounds of {k1} tokens a request: " + "; ".join(parts)


def _requests(counts: Sequence[int], tokens: int) -> str:
    return ", ".join(f"{r} ({r * tokens})" for r in counts) + " request(s) (tokens)"


def capture_fit(depth: int, max_num_seqs: int, sizes: Sequence[int]) -> CaptureFit:
    """Which of the decode rounds of 1..``max_num_seqs`` requests at MTP ``depth`` the
    capture ``sizes`` (tokens) capture exactly, pad to whole requests, or leave
    without the full graph (:class:`CaptureFit`)."""
    k1 = depth + 1
    whole = sorted(s // k1 for s in set(sizes) if s % k1 == 0)
    exact, padded, eager = [], {}, []
    for r in range(1, max_num_seqs + 1):
        if r in whole:
            exact.append(r)
        elif (up := next((w for w in whole if w > r), None)) is not None:
            padded[r] = up
        else:
            eager.append(r)
    return CaptureFit(depth=depth, exact=tuple(exact), padded=padded, eager=tuple(eager))


class Capabilities(Frozen):
    """What an engine build can express, declared by its adapter.

    ``graph_modes`` maps a requested mode to the mode the engine will really run,
    or to ``None`` with a reason in ``graph_mode_reasons`` when it cannot run it.
    """

    graph_modes: dict[str, str | None]
    graph_mode_reasons: dict[str, str] = Field(default_factory=dict)
    speculative_methods: tuple[str, ...]
    # Why the drafter cannot run eager beside a graph-mode target (None: it can).
    eager_drafter_reason: str | None = None
    sliding_window_toggle: bool = True
    # Tokens one request may verify per decode round in a full (captured) graph:
    # MTP depth + 1 must fit. None: no such limit.
    full_graph_decode_tokens: int | None = None
    # Requests a full decode graph serves when the model names none (max_num_seqs).
    default_graph_seqs: int = 16
    # Why the job's capture sizes do not reach this engine (None: they do).
    capture_sizes_reason: str | None = None
    # Why this build cannot run a disaggregated prefill/decode cell (deployment pd:
    # a prefill server and a decode server joined by a KV connector); None: it can.
    pd_reason: str | None = None


class Variant(Frozen):
    """One request-level variant of a server cell: a value of every request axis.

    ``workload_identity`` is :func:`workload_identity` of its workload.
    """

    axes: dict[str, AxisValue]
    workload_identity: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: Any) -> Any:
        return fold_axis_values(data, "request")

    @model_validator(mode="after")
    def _complete(self) -> Variant:
        _require_axes(self.axes, REQUEST_AXES, "variant")
        return self

    def __hash__(self) -> int:
        return hash((tuple(self.axes.items()), self.workload_identity))

    @property
    def thinking(self) -> OnOff:
        return cast(OnOff, self.axes["thinking"])

    @property
    def workload(self) -> str:
        return str(self.axes["workload"])

    @property
    def key(self) -> str:
        """``think-on.arith``: the variant's part of a label."""
        return axes_text(self.axes)


def _require_axes(values: dict[str, AxisValue], wanted: tuple[Axis, ...], what: str) -> None:
    missing = [a.name for a in wanted if a.name not in values]
    unknown = set(values) - {a.name for a in wanted}
    if missing or unknown:
        raise ValueError(f"{what} axes: missing {missing}, unknown {sorted(unknown)}")


class ServerCell(Frozen):
    """One engine server's worth of work.

    ``axes`` holds the value of every server axis as requested; ``planned_graph_mode``
    is the mode the engine will really run (its adapter's remap).
    """

    family: str
    axes: dict[str, AxisValue]
    planned_graph_mode: str
    remaps: tuple[str, ...] = ()
    variants: tuple[Variant, ...]

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != "fingerprint"}  # pre-key rows
        return fold_axis_values(data, "server")

    @model_validator(mode="after")
    def _complete(self) -> ServerCell:
        _require_axes(self.axes, SERVER_AXES, "server cell")
        return self

    def __hash__(self) -> int:
        return hash((self.cell_id, self.planned_graph_mode, self.variants))

    @property
    def engine(self) -> str:
        return str(self.axes["engine"])

    @property
    def model(self) -> str:
        return str(self.axes["model"])

    @property
    def graph_mode(self) -> GraphMode:
        return cast(GraphMode, self.axes["graph_mode"])

    @property
    def draft_graph_mode(self) -> DraftGraphMode:
        return cast(DraftGraphMode, self.axes["draft_graph_mode"])

    @property
    def mtp_depth(self) -> int:
        return int(self.axes["mtp_depth"])

    @property
    def speculative(self) -> bool:
        """Whether this cell drafts tokens (:func:`farm.axes.speculates`)."""
        return speculates(self.mtp_depth)

    @property
    def sliding_window(self) -> OnOff:
        return cast(OnOff, self.axes["sliding_window"])

    @property
    def prefix_caching(self) -> OnOff:
        return cast(OnOff, self.axes["prefix_caching"])

    @property
    def deployment(self) -> Deployment:
        return cast(Deployment, self.axes["deployment"])

    @property
    def disaggregated(self) -> bool:
        """Whether the cell runs a prefill and a decode server (deployment pd)."""
        return self.deployment == "pd"

    @property
    def longest_context(self) -> int:
        """The most context tokens any of its variants places before a prompt."""
        return max((int(v.axes["context"]) for v in self.variants), default=0)

    @property
    def cell_id(self) -> str:
        return axes_text(self.axes)

    @property
    def key(self) -> ComparableKey:
        """The server-level comparable key (what schedule estimates match on)."""
        values = {
            a.name: self.planned_graph_mode if a.name == "graph_mode" else self.axes[a.name]
            for a in SERVER_AXES
            if a.name not in ("engine", "model")
        }
        return ComparableKey(
            family=self.family,
            engine=self.engine,
            model=self.model,
            axes=tuple(explicit(values).items()),
        )

    def variant_key(self, axes: Mapping[str, AxisValue]) -> ComparableKey:
        """The comparable key of the variant with request-axis values ``axes`` (a
        planned :class:`Variant`'s or a result's); its workload identity is the planned
        variant's, empty when the cell planned no such variant."""
        planned = next((v for v in self.variants if v.axes == dict(axes)), None)
        variant = planned or Variant(axes=dict(axes))
        server = self.key
        return server.model_copy(
            update={
                "axes": server.axes + tuple(explicit(variant.axes).items()),
                "workload_identity": variant.workload_identity,
            }
        )

    def variant_label(self, axes: Mapping[str, AxisValue]) -> str:
        """``cell_id[think-on.arith]``: how reports and findings name a variant."""
        return variant_label(self.cell_id, axes)


class ExcludedCell(Frozen):
    axes: dict[str, Any]
    reason: str

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.axes.items())


class Plan(Frozen):
    job: str
    cells: tuple[ServerCell, ...]
    excluded: tuple[ExcludedCell, ...] = ()

    @property
    def variant_count(self) -> int:
        return sum(len(c.variants) for c in self.cells)


def _matches(rule: dict[str, Any], combo: dict[str, Any]) -> bool:
    return all(k in combo and combo[k] == v for k, v in rule.items())


def _server_key(combo: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(combo[a.name] for a in SERVER_AXES)


def expand_matrix(job: JobSpec, capabilities: dict[str, Capabilities]) -> Plan:
    """Expand ``job`` into cells, applying include/exclude rules and capabilities.

    ``capabilities`` maps engine name to what that engine declares. Exclude rules
    drop combinations that match all their keys (GitHub Actions semantics); include
    rules add combinations that the axes do not produce. A rule that names only
    request-level keys (thinking, workload) drops or adds variants.
    """
    missing = [e.name for e in job.engines if e.name not in capabilities]
    if missing:
        raise PlanError(f"no capabilities declared for engine(s) {missing}")
    values = job.axis_values()
    combos = [
        dict(zip(AXIS_NAMES, combo, strict=True))
        for combo in itertools.product(*(values[name] for name in AXIS_NAMES))
    ]
    excluded: list[ExcludedCell] = []
    kept = []
    dropped_by: dict[tuple[Any, ...], dict[str, Any]] = {}
    for combo in combos:
        rule = next((r for r in job.exclude if _matches(r, combo)), None)
        if rule is None:
            kept.append(combo)
        else:
            dropped_by.setdefault(_server_key(combo), rule)
    for rule in job.include:
        _check_include(rule)
        defaults = {a.name: a.implicit for a in SERVER_AXES if a.implicit is not None}
        combo = defaults | {a.name: values[a.name][0] for a in REQUEST_AXES} | rule
        if combo not in kept:
            kept.append(combo)

    identities = {w.name: workload_identity(w) for w in job.workloads}
    grouped: dict[tuple[Any, ...], list[Variant]] = {}
    for combo in kept:
        variant = Variant(
            axes={a.name: combo[a.name] for a in REQUEST_AXES},
            workload_identity=identities[str(combo["workload"])],
        )
        if variant not in grouped.setdefault(_server_key(combo), []):
            grouped[_server_key(combo)].append(variant)
    for key, rule in dropped_by.items():
        if key not in grouped:
            excluded.append(ExcludedCell(axes=_server_axes(key), reason=f"job exclude rule {rule}"))

    cells: list[ServerCell] = []
    seen_effective: dict[ComparableKey, str] = {}
    for key, variants in grouped.items():
        cell_or_reason = _apply_capabilities(job, _server_axes(key), variants, capabilities)
        if isinstance(cell_or_reason, str):
            excluded.append(ExcludedCell(axes=_server_axes(key), reason=cell_or_reason))
            continue
        cell = cell_or_reason
        if cell.key in seen_effective:
            excluded.append(
                ExcludedCell(
                    axes=_server_axes(key),
                    reason=f"runs the same server as {seen_effective[cell.key]} here",
                )
            )
            continue
        seen_effective[cell.key] = cell.cell_id
        cells.append(cell)
    return Plan(job=job.name, cells=tuple(cells), excluded=tuple(excluded))


def _server_axes(key: tuple[Any, ...]) -> dict[str, Any]:
    return {a.name: v for a, v in zip(SERVER_AXES, key, strict=True)}


def _check_include(rule: dict[str, Any]) -> None:
    # Names and value types are checked with the job file (farm.spec); only the rule's
    # completeness is the planner's business.
    absent = [a.name for a in SERVER_AXES if a.name not in rule and a.implicit is None]
    if absent:
        raise PlanError(f"include rule {rule} must name every server axis; missing {absent}")


def _apply_capabilities(
    job: JobSpec,
    axes: dict[str, Any],
    variants: list[Variant],
    capabilities: dict[str, Capabilities],
) -> ServerCell | str:
    engine = next(e for e in job.engines if e.name == axes["engine"])
    model = next(m for m in job.models if m.name == axes["model"])
    caps = capabilities[engine.name]
    remaps: list[str] = []

    requested = axes["graph_mode"]
    planned = caps.graph_modes.get(requested)
    if planned is None:
        return caps.graph_mode_reasons.get(
            requested, f"{engine.name} cannot run graph mode {requested}"
        )
    if planned != requested:
        remaps.append(
            f"graph_mode {requested} -> {planned}: "
            + caps.graph_mode_reasons.get(requested, "engine's effective mode")
        )
    depth = axes["mtp_depth"]
    limit = caps.full_graph_decode_tokens
    if limit is not None and planned in FULL_GRAPH_MODES and depth + 1 > limit:
        return (
            f"{engine.name} verifies at most {limit} tokens per request in a {planned} "
            f"decode round; MTP depth {depth} needs {depth + 1}"
        )
    if depth > 0 and model.speculative_method not in caps.speculative_methods:
        return f"{engine.name} does not support speculative method {model.speculative_method}"
    if axes["draft_graph_mode"] == "eager":
        if depth == 0:
            return "draft_graph_mode eager: MTP depth 0 runs no drafter"
        if planned == "eager":
            return (
                "draft_graph_mode eager: an eager target's drafter is eager, the same "
                "server as draft_graph_mode target"
            )
        if caps.eager_drafter_reason is not None:
            return caps.eager_drafter_reason
    if model.capture_sizes and planned in FULL_GRAPH_MODES and depth > 0:
        if caps.capture_sizes_reason is not None:
            remaps.append(f"capture_sizes not passed: {caps.capture_sizes_reason}")
        else:
            seqs = model.max_num_seqs or caps.default_graph_seqs
            remaps.append(capture_fit(depth, seqs, model.capture_sizes).describe())
    if axes["deployment"] == "pd" and caps.pd_reason is not None:
        return caps.pd_reason
    if axes["sliding_window"] == "off" and not caps.sliding_window_toggle:
        return f"{engine.name} cannot switch the sliding window off"
    harnesses = {w.name for w in job.workloads if w.harness is not None}
    framed = [v for v in variants if v.axes["context"] and v.workload in harnesses]
    if framed:
        remaps.append(
            f"context {sorted({int(v.axes['context']) for v in framed})} dropped for "
            f"{', '.join(sorted({v.workload for v in framed}))}: a harness writes its own requests"
        )
        variants = [v for v in variants if v not in framed]
    if not model.thinking:
        on = [v for v in variants if v.thinking == "on"]
        if on:
            remaps.append("thinking=on dropped: the model's chat template ignores enable_thinking")
            variants = [v for v in variants if v.thinking == "off"]
    if not variants:
        return "no request-level variant left"
    return ServerCell(
        family=engine.family,
        axes=axes,
        planned_graph_mode=planned,
        remaps=tuple(remaps),
        variants=tuple(variants),
    )


def cell_model(model: ModelSpec, cell: ServerCell) -> ModelSpec:
    """``model`` as ``cell`` serves it: its ``max_model_len`` holds a prompt and its
    answer, and the longest context of the cell's variants comes on top of it."""
    if not cell.longest_context:
        return model
    return model.model_copy(update={"max_model_len": model.max_model_len + cell.longest_context})


def select(plan: Plan, only: dict[str, AxisValue]) -> Plan:
    """Keep the slice of ``plan`` where every axis value in ``only`` holds.

    ``only`` comes from :func:`parse_only`, which checks names and values.
    """
    unknown = set(only) - set(AXIS_NAMES)
    if unknown:
        raise PlanError(f"--only: unknown axis {sorted(unknown)}; axes: {', '.join(AXIS_NAMES)}")

    def keep(values: dict[str, AxisValue]) -> bool:
        return all(values[k] == v for k, v in only.items() if k in values)

    cells = []
    for cell in plan.cells:
        if not keep(cell.axes):
            continue
        variants = tuple(v for v in cell.variants if keep(v.axes))
        if variants:
            cells.append(cell.model_copy(update={"variants": variants}))
    return plan.model_copy(update={"cells": tuple(cells)})


def parse_only(job: JobSpec, only: Mapping[str, str]) -> dict[str, AxisValue]:
    """``--only`` text (axis name -> value) as axis values, checked against the job.

    Raises PlanError naming the axis and the values the job has for it.
    """
    known = job.axis_values()
    out: dict[str, AxisValue] = {}
    for name, text in only.items():
        try:
            out[name] = parse_axis_value(name, text, known)
        except (KeyError, ValueError) as exc:
            raise PlanError(f"--only {name}={text}: {exc.args[0]}") from None
    return out


def workload_identity(workload: WorkloadSpec) -> str:
    """12 hex digits naming what a workload measures (not how fast it is sent)."""
    harness = workload.harness
    payload: dict[str, object] = {
        "prompts": PurePath(workload.prompts).name if workload.prompts else None,
        "harness": (
            None
            if harness is None
            else {
                "task": harness.task,
                "dataset": PurePath(harness.dataset_path).name if harness.dataset_path else None,
                "limit": harness.limit,
                "num_fewshot": harness.num_fewshot,
                "metric": harness.metric,
            }
        ),
        "count": workload.count,
        "max_tokens": workload.max_tokens,
        "temperature": workload.temperature,
        "seed": workload.seed,
        "scorer": workload.scorer,
    }
    if workload.system_prompt is not None:  # absent before it existed: identities kept
        payload["system_prompt"] = hashlib.sha256(workload.system_prompt.encode()).hexdigest()
    if workload.chat_template_kwargs:  # likewise
        payload["chat_template_kwargs"] = dict(workload.chat_template_kwargs)
    if workload.context.source != "history":  # likewise
        document = workload.context.document
        payload["context"] = {
            "source": workload.context.source,
            "document": PurePath(document).name if document else None,
        }
    blob = json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]

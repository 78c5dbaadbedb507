"""Expand a job into server-level cells and request-level variants. Pure: no I/O.

A server-level cell (engine x model x graph mode x MTP depth x sliding window) gets
one engine server; thinking mode and workloads are variants served by that server.
Cells an engine cannot express exactly are remapped (the remap is recorded) or
excluded with a reason, never silently dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import PlanError
from farm.spec import GraphMode, JobSpec, OnOff

__all__ = [
    "FULL_GRAPH_MODES",
    "Capabilities",
    "ExcludedCell",
    "Plan",
    "ServerCell",
    "Variant",
    "expand_matrix",
    "select",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Graph modes that capture the decode step whole: its shapes are fixed at capture time.
FULL_GRAPH_MODES = frozenset({"full_decode_only", "full", "full_and_piecewise"})


class Capabilities(_Frozen):
    """What an engine build can express, declared by its adapter.

    ``graph_modes`` maps a requested mode to the mode the engine will really run,
    or to ``None`` with a reason in ``graph_mode_reasons`` when it cannot run it.
    """

    graph_modes: dict[str, str | None]
    graph_mode_reasons: dict[str, str] = Field(default_factory=dict)
    speculative_methods: tuple[str, ...]
    drafter_eager_when_compiled: bool = False
    sliding_window_toggle: bool = True
    # Tokens one request may verify per decode round in a full (captured) graph:
    # MTP depth + 1 must fit. None: no such limit.
    full_graph_decode_tokens: int | None = None


class Variant(_Frozen):
    thinking: OnOff
    workload: str

    @property
    def key(self) -> str:
        return f"think-{self.thinking}.{self.workload}"


class ServerCell(_Frozen):
    """One engine server's worth of work."""

    engine: str
    family: str
    model: str
    graph_mode: GraphMode
    planned_graph_mode: str
    mtp_depth: int
    sliding_window: OnOff
    remaps: tuple[str, ...] = ()
    variants: tuple[Variant, ...]
    fingerprint: str

    @property
    def cell_id(self) -> str:
        return (
            f"{self.engine}.{self.model}.{self.graph_mode}"
            f".mtp{self.mtp_depth}.swa-{self.sliding_window}"
        )

    @property
    def axes(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "model": self.model,
            "graph_mode": self.graph_mode,
            "mtp_depth": self.mtp_depth,
            "sliding_window": self.sliding_window,
        }


class ExcludedCell(_Frozen):
    axes: dict[str, Any]
    reason: str

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.axes.items())


class Plan(_Frozen):
    job: str
    cells: tuple[ServerCell, ...]
    excluded: tuple[ExcludedCell, ...] = ()

    @property
    def variant_count(self) -> int:
        return sum(len(c.variants) for c in self.cells)


def _matches(rule: dict[str, Any], combo: dict[str, Any]) -> bool:
    return all(k in combo and combo[k] == v for k, v in rule.items())


def _fingerprint(job: JobSpec, axes: dict[str, Any]) -> str:
    """Hash of what decides comparability: engine identity, model, server axes."""
    engine = next(e for e in job.engines if e.name == axes["engine"])
    model = next(m for m in job.models if m.name == axes["model"])
    payload = {
        "engine": engine.model_dump(mode="json", exclude={"name"}),
        "model": model.model_dump(mode="json", exclude={"name", "path"}),
        "axes": {k: v for k, v in axes.items() if k not in ("engine", "model")},
    }
    blob = json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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
    axes = job.axes
    combos: list[dict[str, Any]] = [
        {
            "engine": e.name,
            "model": m.name,
            "graph_mode": g,
            "mtp_depth": d,
            "sliding_window": s,
            "thinking": t,
            "workload": w.name,
        }
        for e, m, g, d, s, t, w in itertools.product(
            job.engines,
            job.models,
            axes.graph_mode,
            axes.mtp_depth,
            axes.sliding_window,
            axes.thinking,
            job.workloads,
        )
    ]
    server_keys = ("engine", "model", "graph_mode", "mtp_depth", "sliding_window")
    excluded: list[ExcludedCell] = []
    kept = []
    dropped_by: dict[tuple[Any, ...], dict[str, Any]] = {}
    for combo in combos:
        rule = next((r for r in job.exclude if _matches(r, combo)), None)
        if rule is None:
            kept.append(combo)
        else:
            dropped_by.setdefault(tuple(combo[k] for k in server_keys), rule)
    for rule in job.include:
        _check_include(job, rule)
        base = {"thinking": axes.thinking[0], "workload": job.workloads[0].name}
        combo = {**base, **rule}
        if combo not in kept:
            kept.append(combo)

    grouped: dict[tuple[Any, ...], list[Variant]] = {}
    for combo in kept:
        key = tuple(combo[k] for k in server_keys)
        variant = Variant(thinking=combo["thinking"], workload=combo["workload"])
        if variant not in grouped.setdefault(key, []):
            grouped[key].append(variant)
    for key, rule in dropped_by.items():
        if key not in grouped:
            excluded.append(
                ExcludedCell(
                    axes=dict(zip(server_keys, key, strict=True)), reason=f"job exclude rule {rule}"
                )
            )

    cells: list[ServerCell] = []
    seen_effective: dict[tuple[Any, ...], str] = {}
    for key, variants in grouped.items():
        server_axes = dict(zip(server_keys, key, strict=True))
        cell_or_reason = _apply_capabilities(job, server_axes, variants, capabilities)
        if isinstance(cell_or_reason, str):
            excluded.append(ExcludedCell(axes=server_axes, reason=cell_or_reason))
            continue
        cell = cell_or_reason
        effective_key = (
            cell.engine,
            cell.model,
            cell.planned_graph_mode,
            cell.mtp_depth,
            cell.sliding_window,
        )
        if effective_key in seen_effective:
            excluded.append(
                ExcludedCell(
                    axes=server_axes,
                    reason=f"runs the same server as {seen_effective[effective_key]} here",
                )
            )
            continue
        seen_effective[effective_key] = cell.cell_id
        cells.append(cell)
    return Plan(job=job.name, cells=tuple(cells), excluded=tuple(excluded))


def _check_include(job: JobSpec, rule: dict[str, Any]) -> None:
    required = ("engine", "model", "graph_mode", "mtp_depth", "sliding_window")
    absent = [k for k in required if k not in rule]
    if absent:
        raise PlanError(f"include rule {rule} must name every server axis; missing {absent}")
    if rule["engine"] not in {e.name for e in job.engines}:
        raise PlanError(f"include rule {rule}: unknown engine {rule['engine']!r}")
    if rule["model"] not in {m.name for m in job.models}:
        raise PlanError(f"include rule {rule}: unknown model {rule['model']!r}")


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
    if depth > 0 and planned != "eager" and caps.drafter_eager_when_compiled:
        remaps.append(
            "drafter runs eager (enforce_eager in speculative config): "
            "the compiled drafter fails to start on this engine"
        )
    if axes["sliding_window"] == "off" and not caps.sliding_window_toggle:
        return f"{engine.name} cannot switch the sliding window off"
    if not model.thinking:
        on = [v for v in variants if v.thinking == "on"]
        if on:
            remaps.append("thinking=on dropped: the model's chat template ignores enable_thinking")
            variants = [v for v in variants if v.thinking == "off"]
    if not variants:
        return "no request-level variant left"
    return ServerCell(
        engine=engine.name,
        family=engine.family,
        model=model.name,
        graph_mode=requested,
        planned_graph_mode=planned,
        mtp_depth=depth,
        sliding_window=axes["sliding_window"],
        remaps=tuple(remaps),
        variants=tuple(variants),
        fingerprint=_fingerprint(job, {**axes, "graph_mode": planned}),
    )


def select(plan: Plan, only: dict[str, str]) -> Plan:
    """Keep the slice of ``plan`` where every ``AXIS=VALUE`` in ``only`` holds."""

    def keep_cell(cell: ServerCell) -> bool:
        return all(str(cell.axes[k]) == v for k, v in only.items() if k in cell.axes)

    def keep_variant(v: Variant) -> bool:
        return all(
            str(getattr(v, k)) == val for k, val in only.items() if k in ("thinking", "workload")
        )

    unknown = set(only) - {
        "engine",
        "model",
        "graph_mode",
        "mtp_depth",
        "sliding_window",
        "thinking",
        "workload",
    }
    if unknown:
        raise PlanError(f"--only: unknown axis {sorted(unknown)}")
    cells = []
    for cell in plan.cells:
        if not keep_cell(cell):
            continue
        variants = tuple(v for v in cell.variants if keep_variant(v))
        if variants:
            cells.append(cell.model_copy(update={"variants": variants}))
    return plan.model_copy(update={"cells": tuple(cells)})

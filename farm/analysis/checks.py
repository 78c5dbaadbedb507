"""Within-sweep differential checks: graph modes vs eager, patches vs base, depths.

Each check compares two variants of one sweep that should agree and returns a typed
:class:`CheckVerdict` per comparison; those that regressed are the report's
:attr:`~CheckReport.regressions`.
A comparison fails only when it is both *significant* (the request-level bootstrap
interval of the difference excludes 0, see :mod:`farm.analysis.stats`) and *large*
(the point difference reaches a minimum effect). The minimum effect keeps a large
sweep from alerting on differences too small to matter (Perfherder likewise requires
>= 2% on top of its t-test).

- ``graph_vs_eager``: for the same engine, model, MTP depth, sliding window and
  request variant, every non-eager graph mode must match eager in AL (two-sided:
  a causality bug can raise acceptance as well as lower it) and must not diverge
  from the greedy spec-off output more often than eager does (each side against
  the spec-off run of its own graph mode when there is one, else eager spec-off).
- ``patch_vs_base``: a patched build (``base_of[engine] = base engine``) must not
  lower AL or accuracy against its base, all other axes equal, nor diverge from the
  base's greedy spec-off output more often than the base does (where that ran).
- ``depth_invariance``: acceptance at draft position i is P(first i+1 drafts
  accepted), which does not depend on how many drafts follow; compare depth d with
  the smallest depth that has position i (two-sided).

Failed or missing cells produce a :class:`Note`, never a finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from farm.analysis.check_rules import (
    CheckConfig,
    CheckKind,
    CheckReport,
    CheckVerdict,
    Direction,
    Metric,
    Note,
    VariantRef,
    classify_difference,
    control_false_discoveries,
    p_value,
)
from farm.analysis.stats import (
    AcceptanceSample,
    Interval,
    compare_acceptance,
    compare_proportions,
    correctness_sample,
    divergence_sample,
)
from farm.axes import speculates
from farm.records import SweepRecord, VariantResult

__all__ = [
    "check_depth_invariance",
    "check_graph_modes",
    "check_patches",
    "check_sweep",
]


@dataclass
class _Unit:
    ref: VariantRef
    variant: VariantResult
    _acceptance: AcceptanceSample | None = field(default=None, repr=False)

    @property
    def acceptance(self) -> AcceptanceSample:
        if self._acceptance is None:
            self._acceptance = AcceptanceSample.from_requests(self.variant.requests)
        return self._acceptance


@dataclass
class _Context:
    config: CheckConfig
    units: list[_Unit]
    notes: list[Note]
    verdicts: list[CheckVerdict] = field(default_factory=list)

    def rng(self, *parts: str) -> np.random.Generator:
        return self.config.rng("|".join(parts))


def _units(sweep: SweepRecord) -> tuple[list[_Unit], list[Note]]:
    units: list[_Unit] = []
    notes: list[Note] = []
    for stored in sweep.cells:
        result = stored.result
        if result is None or result.status != "ok":
            status = result.status if result else "not run"
            why = f": {result.error}" if result and result.error else ""
            notes.append(
                Note(
                    check="input",
                    cells=(stored.cell.cell_id,),
                    message=f"{stored.cell.cell_id} {status}{why}; not compared",
                )
            )
            continue
        units.extend(
            _Unit(ref=VariantRef.of(stored.cell, v.axes), variant=v) for v in result.variants
        )
    return units, notes


def _has_counters(ctx: _Context, check: CheckKind, *units: _Unit) -> bool:
    missing = [u for u in units if len(u.acceptance) == 0 or u.acceptance.drafts.sum() <= 0]
    for u in missing:
        ctx.notes.append(
            Note(
                check=check,
                cells=(u.ref.cell_id,),
                message=f"{u.ref.label}: no per-request speculative counters; "
                "acceptance not compared",
            )
        )
    return not missing


def _add(
    ctx: _Context,
    check: CheckKind,
    metric: Metric,
    cand: _Unit,
    ref: _Unit,
    cand_value: Interval,
    ref_value: Interval,
    diff: Interval,
    paired: bool,
    pairs: int,
    min_effect: float,
    worse: Direction,
    position: int | None = None,
    baseline: str | None = None,
) -> None:
    significant, regressed = classify_difference(diff, min_effect, worse)
    ctx.verdicts.append(
        CheckVerdict(
            check=check,
            metric=metric,
            position=position,
            candidate=cand.ref,
            reference=ref.ref,
            candidate_value=cand_value,
            reference_value=ref_value,
            difference=diff,
            paired=paired,
            pairs=pairs,
            min_effect=min_effect,
            direction=worse,
            significant=significant,
            regressed=regressed,
            p_value=p_value(diff),
            baseline=baseline,
        )
    )


def _compare_al(ctx: _Context, check: CheckKind, cand: _Unit, ref: _Unit, worse: Direction) -> None:
    if not _has_counters(ctx, check, cand, ref):
        return
    cfg = ctx.config
    d = compare_acceptance(
        ref.acceptance,
        cand.acceptance,
        rng=ctx.rng(check, ref.ref.label, cand.ref.label, "al"),
        resamples=cfg.resamples,
        level=cfg.level,
    )
    min_effect = cfg.min_al_effect(d.reference_al.estimate)
    _add(
        ctx,
        check,
        "mean_acceptance_length",
        cand,
        ref,
        d.candidate_al,
        d.reference_al,
        d.mean_acceptance_length,
        d.paired,
        d.pairs,
        min_effect,
        worse,
    )


def _group(units: Iterable[_Unit], *drop: str) -> dict[tuple[str | int, ...], list[_Unit]]:
    groups: dict[tuple[str | int, ...], list[_Unit]] = {}
    for u in units:
        key = tuple(v for k, v in u.ref.axes().items() if k not in drop)
        groups.setdefault(key, []).append(u)
    return groups


def _spec_off(ctx: _Context, u: _Unit) -> _Unit | None:
    """The spec-off variant to judge ``u``'s greedy output against: same graph mode
    when it ran (isolates speculation from graph numerics, as in summary.py), else eager."""
    for graph in (u.ref.graph_mode, "eager"):
        wanted = {**u.ref.axes(), "graph_mode": graph, "mtp_depth": 0}
        for other in ctx.units:
            if other.ref.axes() == wanted:
                return other
    return None


def _compare_divergence(
    ctx: _Context,
    check: CheckKind,
    cand: _Unit,
    ref: _Unit,
    cand_base: _Unit | None,
    ref_base: _Unit | None,
) -> None:
    """``cand`` must not diverge from its greedy spec-off output (``cand_base``) more
    often than ``ref`` does from its own (``ref_base``)."""
    if cand_base is None or ref_base is None:
        ctx.notes.append(
            Note(
                check=check,
                cells=(cand.ref.cell_id,),
                message=f"{cand.ref.label}: no spec-off run to compare greedy outputs with",
            )
        )
        return
    c = divergence_sample(cand.variant.requests, cand_base.variant.requests)
    r = divergence_sample(ref.variant.requests, ref_base.variant.requests)
    if not c.prompt_ids or not r.prompt_ids:
        return
    cfg = ctx.config
    d = compare_proportions(
        r,
        c,
        rng=ctx.rng("div", ref.ref.label, cand.ref.label),
        resamples=cfg.resamples,
        level=cfg.level,
    )
    _add(
        ctx,
        check,
        "greedy_divergence",
        cand,
        ref,
        d.candidate.interval,
        d.reference.interval,
        d.difference,
        d.paired,
        d.pairs,
        cfg.min_divergence_increase,
        "higher",
        baseline=f"{cand_base.ref.cell_id} / {ref_base.ref.cell_id}",
    )


def check_graph_modes(sweep: SweepRecord, config: CheckConfig | None = None) -> CheckReport:
    """Each non-eager graph mode vs eager at the same other axes (spec-on cells only)."""
    ctx = _context(sweep, config)
    _graph_modes(ctx)
    return _report(sweep, ctx)


def _graph_modes(ctx: _Context) -> None:
    for group in _group(
        (u for u in ctx.units if speculates(u.ref.mtp_depth)), "graph_mode"
    ).values():
        eager = [u for u in group if u.ref.graph_mode == "eager"]
        others = [u for u in group if u.ref.graph_mode != "eager"]
        if not others:
            continue
        if not eager:
            ctx.notes.append(
                Note(
                    check="graph_vs_eager",
                    cells=tuple(u.ref.cell_id for u in others),
                    message=f"no eager reference for {others[0].ref.label}",
                )
            )
            continue
        for cand in others:
            _compare_al(ctx, "graph_vs_eager", cand, eager[0], "either")
            ref = eager[0]
            _compare_divergence(
                ctx, "graph_vs_eager", cand, ref, _spec_off(ctx, cand), _spec_off(ctx, ref)
            )


def check_patches(
    sweep: SweepRecord, base_of: Mapping[str, str], config: CheckConfig | None = None
) -> CheckReport:
    """Each patched engine vs its base engine (``base_of``): AL and accuracy must not drop."""
    ctx = _context(sweep, config)
    _patches(ctx, base_of)
    return _report(sweep, ctx)


def _patches(ctx: _Context, base_of: Mapping[str, str]) -> None:
    cfg = ctx.config
    by_key = {(u.ref.engine, *_rest(u)): u for u in ctx.units}
    for cand in ctx.units:
        base_engine = base_of.get(cand.ref.engine)
        if base_engine is None:
            continue
        ref = by_key.get((base_engine, *_rest(cand)))
        if ref is None:
            ctx.notes.append(
                Note(
                    check="patch_vs_base",
                    cells=(cand.ref.cell_id,),
                    message=f"{cand.ref.label}: base {base_engine} has no matching run",
                )
            )
            continue
        if speculates(cand.ref.mtp_depth):
            _compare_al(ctx, "patch_vs_base", cand, ref, "lower")
            # Greedy speculation is lossless, so both sides are held to the base's greedy
            # spec-off output: a patch that breaks only the speculative path (a canary of
            # #27202's prefix-state class) changes outputs while AL and a weak model's
            # accuracy stay put. Only where the job ran the base with speculation off.
            if (clean := _spec_off(ctx, ref)) is not None:
                _compare_divergence(ctx, "patch_vs_base", cand, ref, clean, clean)
        c, r = correctness_sample(cand.variant.requests), correctness_sample(ref.variant.requests)
        if c.prompt_ids and r.prompt_ids:
            d = compare_proportions(
                r,
                c,
                rng=ctx.rng("acc", ref.ref.label, cand.ref.label),
                resamples=cfg.resamples,
                level=cfg.level,
            )
            _add(
                ctx,
                "patch_vs_base",
                "accuracy",
                cand,
                ref,
                d.candidate.interval,
                d.reference.interval,
                d.difference,
                d.paired,
                d.pairs,
                cfg.min_accuracy_drop,
                "lower",
            )


def _rest(u: _Unit) -> tuple[str | int, ...]:
    """Every axis value but the engine's: a patched engine's run and its base's match."""
    return tuple(v for k, v in u.ref.axes().items() if k != "engine")


def check_depth_invariance(sweep: SweepRecord, config: CheckConfig | None = None) -> CheckReport:
    """Acceptance at position i of depth d vs the smallest depth that has position i."""
    ctx = _context(sweep, config)
    _depths(ctx)
    return _report(sweep, ctx)


def _depths(ctx: _Context) -> None:
    cfg = ctx.config
    spec_on = (u for u in ctx.units if speculates(u.ref.mtp_depth))
    for group in _group(spec_on, "mtp_depth").values():
        by_depth = {u.ref.mtp_depth: u for u in group}
        depths = sorted(by_depth)
        for d in depths:
            refs = _position_refs(d, depths)
            for ref_depth in sorted({r for _, r in refs}):
                cand, ref = by_depth[d], by_depth[ref_depth]
                if not _has_counters(ctx, "depth_invariance", cand, ref):
                    break
                diff = compare_acceptance(
                    ref.acceptance,
                    cand.acceptance,
                    rng=ctx.rng("depth", ref.ref.label, cand.ref.label),
                    resamples=cfg.resamples,
                    level=cfg.level,
                )
                for pos in (p for p, r in refs if r == ref_depth):
                    _add(
                        ctx,
                        "depth_invariance",
                        "acceptance_at_position",
                        cand,
                        ref,
                        diff.candidate_per_position[pos],
                        diff.reference_per_position[pos],
                        diff.per_position[pos],
                        diff.paired,
                        diff.pairs,
                        cfg.min_position_diff,
                        "either",
                        position=pos,
                    )


def _position_refs(d: int, depths: list[int]) -> list[tuple[int, int]]:
    """(position, reference depth) for the positions of depth ``d`` that a smaller depth
    also has; the reference is the smallest depth with that position."""
    pairs = [(i, next(r for r in depths if r > i)) for i in range(d)]
    return [(i, r) for i, r in pairs if r < d]


def _context(sweep: SweepRecord, config: CheckConfig | None) -> _Context:
    units, notes = _units(sweep)
    return _Context(config=config or CheckConfig(), units=units, notes=notes)


def _report(sweep: SweepRecord, ctx: _Context) -> CheckReport:
    verdicts = _control_fdr(ctx.verdicts, ctx.config)
    return CheckReport(
        sweep_id=sweep.sweep_id,
        verdicts=verdicts,
        notes=tuple(dict.fromkeys(ctx.notes)),  # one note per cause, first-seen order
    )


def _control_fdr(verdicts: list[CheckVerdict], config: CheckConfig) -> tuple[CheckVerdict, ...]:
    if not config.control_fdr:
        return tuple(verdicts)
    rejected = control_false_discoveries([v.p_value for v in verdicts], 1.0 - config.level)
    out = []
    for v, reject in zip(verdicts, rejected, strict=True):
        significant, regressed = classify_difference(
            v.difference, v.min_effect, v.direction, reject
        )
        out.append(v.model_copy(update={"significant": significant, "regressed": regressed}))
    return tuple(out)


def check_sweep(
    sweep: SweepRecord,
    base_of: Mapping[str, str] | None = None,
    config: CheckConfig | None = None,
    *,
    graph_modes: bool = True,
    depth_invariance: bool = False,
) -> CheckReport:
    """Run the within-sweep checks; ``base_of`` maps patched engine -> base engine
    (``graph_modes``: each graph mode against eager too).

    The depth-invariance check is off by default: on the clean CPU build it flagged
    position-0 acceptance 0.65 at depth 3 vs 0.74 at depth 1 (thinking off, 32 prompts).
    Verify steps start at different tokens at different depths, so per-step rates are
    not exchangeable across depths when hard tokens cluster; the check needs a
    token-aligned comparison before it can alert.
    """
    ctx = _context(sweep, config)
    if graph_modes:
        _graph_modes(ctx)
    _patches(ctx, base_of or {})
    if depth_invariance:
        _depths(ctx)
    return _report(sweep, ctx)

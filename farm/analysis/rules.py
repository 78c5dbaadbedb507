"""The rules factory: every use's :class:`~farm.analysis.judgement.JudgeRules`, made here
and nowhere else. Pure.

A verdict is only as consistent as the rules it is judged by: the nightly's early
per-cell check, its end-of-night verdict, a PR's fail-fast and its verdict, a
bisection's steps and its ends, ``farm compare``, ``farm goldens check`` and
``farm selftest`` all pass through :func:`farm.analysis.judgement.judge`, each with the
rules one function below makes from the job (patched engines' bases, goldens), the
keys' history (calibration, quarantine: both known before a night starts) and the
command's options. Two checks of one sweep with one use's rules cannot disagree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from farm.analysis.check_rules import CheckConfig
from farm.analysis.history import HistoryConfig
from farm.analysis.judgement import PR_CHECK, JudgeRules
from farm.analysis.noise import KeyNoise, NoiseRule
from farm.analysis.over_run import CollapseRule
from farm.analysis.pooling import PoolRule
from farm.analysis.prefix_cache import PrefixRule
from farm.analysis.sustained import SustainedRule
from farm.comparable import ComparableKey
from farm.spec.goldens import GoldenCheck

__all__ = [
    "bisect_rules",
    "compare_rules",
    "golden_rules",
    "night_rules",
    "pr_rules",
    "selftest_rules",
]

_DEFAULT_CHECK = CheckConfig()
_DEFAULT_NOISE = NoiseRule()
_DEFAULT_COLLAPSE = CollapseRule()
_DEFAULT_POOLING = PoolRule()
_DEFAULT_SUSTAINED = SustainedRule()


def night_rules(
    *,
    base_of: Mapping[str, str] | None = None,
    quarantine: Mapping[str, float] | None = None,
    goldens: Sequence[GoldenCheck] = (),
    history: HistoryConfig | None = None,
    noise: NoiseRule | None = _DEFAULT_NOISE,
    check: CheckConfig = _DEFAULT_CHECK,
    hybrid_models: Collection[str] = (),
    sustained: SustainedRule | None = _DEFAULT_SUSTAINED,
) -> JudgeRules:
    """A nightly's rules, for its early per-cell checks and its verdict alike: within the
    sweep (each patched engine against ``base_of``), against the last good night with
    each key's AL threshold calibrated from its earlier nights (``noise``; None: the
    fixed rule), change points over the job's history, the job's ``goldens``, and the
    flaky keys of ``quarantine`` (label -> verdict flip rate) shown but not alerted.
    Inside each spec-on variant, acceptance over its run (a collapse); prefix-cache hit
    rates, MTP on against MTP off and against the last good night, ``hybrid_models``
    (the job's hybrid model names) by the hybrid rule. The keys compared with the last
    good night are also pooled over conjunctions of axis values (a drop several cells
    share, each inside its own threshold), and each key's recent nights are searched
    for a small drop that persists (``sustained``; None: not looked for)."""
    return JudgeRules(
        check=check,
        history=history,
        base_of=dict(base_of or {}),
        noise=noise,
        quarantine=dict(quarantine or {}),
        goldens=tuple(goldens),
        over_run=_DEFAULT_COLLAPSE,
        prefix_cache=PrefixRule(hybrid_models=frozenset(hybrid_models)),
        pooling=_DEFAULT_POOLING,
        sustained=sustained,
    )


def pr_rules(
    *,
    candidate: str,
    base: str,
    goldens: Sequence[GoldenCheck] = (),
    quarantine: Mapping[str, float] | None = None,
    check: CheckConfig = _DEFAULT_CHECK,
    hybrid_models: Collection[str] = (),
    calibration: Mapping[ComparableKey, KeyNoise] | None = None,
    noise: NoiseRule = _DEFAULT_NOISE,
) -> JudgeRules:
    """A PR's rules, for its fail-fast and its verdict alike: each ``candidate`` cell
    against the same cell of ``base`` (no within-sweep or history checks), failed cells
    of both sides as findings, nothing compared an error rather than a pass, and the
    nightly's flaky keys (``quarantine``) shown but failing no PR. The candidate's
    variants are looked at over their runs (a collapse fails the PR), and their
    prefix-cache hit rates held to the base's (not MTP on against off: that is the
    nightly's, and a PR is judged by what it changed). The keys compared with the base
    are pooled over conjunctions of axis values, as the nightly's are.

    ``calibration``: each key's run-to-run noise over the job's nights (by its base
    key). When some key has a run-level spread over enough nights, its AL threshold is
    calibrated by ``noise`` as the nightly's, and a suspicious first run is confirmed
    by reruns of head and base (``noise.confirm``); a deterministic engine (no spread)
    keeps the fixed rule and is never confirmed."""
    noisy = any(n.al_sd > 0 and n.nights >= noise.min_nights for n in (calibration or {}).values())
    return JudgeRules(
        noise=noise if noisy else None,
        calibration=dict(calibration or {}) if noisy else {},
        check=check,
        within=False,
        baseline_check=PR_CHECK,
        baseline_sweep=False,
        engine_map={candidate: base},
        candidate_side="candidate",
        baseline_side="baseline",
        require_comparison=True,
        goldens=tuple(goldens),
        quarantine=dict(quarantine or {}),
        over_run=_DEFAULT_COLLAPSE,
        prefix_cache=PrefixRule(twins=False, hybrid_models=frozenset(hybrid_models)),
        pooling=_DEFAULT_POOLING,
    )


def bisect_rules(check: CheckConfig = _DEFAULT_CHECK) -> JudgeRules:
    """A bisection's rules: a step (or an end) against one end, variant by variant.
    Neither acceptance over a run nor prefix-cache hits: a step is good or bad by the
    drop the bisection hunts, and a finding the ends share would make every step bad."""
    return JudgeRules(check=check, within=False)


def compare_rules(engine_map: Mapping[str, str] | None = None) -> JudgeRules:
    """``farm compare``'s rules: the candidate against the baseline (engines renamed by
    ``engine_map``); a comparison that compared nothing is a finding, not a pass."""
    return JudgeRules(within=False, engine_map=dict(engine_map or {}), require_comparison=True)


def golden_rules(goldens: Sequence[GoldenCheck]) -> JudgeRules:
    """``farm goldens check``'s rules: the sweep against the goldens, nothing else."""
    return JudgeRules(within=False, goldens=tuple(goldens))


def selftest_rules(base_of: Mapping[str, str], check: CheckConfig = _DEFAULT_CHECK) -> JudgeRules:
    """``farm selftest``'s rules: each canary (and the clean repeat) against the clean
    reference (``base_of``), the patch check alone: its false-discovery family is the
    engines' cells, so the graph-mode checks of the reduced matrix do not dilute it.
    Inside each engine's own cells, as a night looks: acceptance over each run, and
    prefix-cache hits MTP on against MTP off (hybrids known from the cells' configs)."""
    return JudgeRules(
        check=check,
        base_of=dict(base_of),
        graph_modes=False,
        over_run=_DEFAULT_COLLAPSE,
        prefix_cache=PrefixRule(baseline=False),
    )

"""When a comparison is a verdict at all: a gate that cannot pass by accident.

A comparison where no variant was compared (every key unmatched, failed or without
data: a ``--map-engine`` to a name no sweep has, two sweeps of different jobs) says
nothing about a regression, so it is never a pass. Neither is a sweep compared with
itself (the interval is zero by construction), nor an engine map naming an engine
that neither sweep ran. Pure: the CLI and the PR verdict call these.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from farm.analysis.compare import SweepComparison, VariantOutcome

__all__ = ["compared", "engine_map_problems", "nothing_compared", "same_sweep"]

_JUDGED: tuple[VariantOutcome, ...] = ("pass", "regress", "improve")
_NOT_JUDGED: tuple[VariantOutcome, ...] = ("unmatched", "failed", "no_data")


def compared(comparison: SweepComparison) -> int:
    """How many variants were compared (passed, regressed or improved)."""
    return sum(comparison.count(o) for o in _JUDGED)


def nothing_compared(comparison: SweepComparison) -> str | None:
    """Why ``comparison`` is no verdict (nothing was compared), or None."""
    if compared(comparison):
        return None
    rest = ", ".join(f"{comparison.count(o)} {o}" for o in _NOT_JUDGED if comparison.count(o))
    return (
        f"nothing was compared between sweep {comparison.baseline_id} and sweep "
        f"{comparison.candidate_id} ({rest or 'no cells'}): no variant of one has a "
        "comparable variant with data in the other"
    )


def same_sweep(baseline_id: int, candidate_id: int) -> str | None:
    """Why comparing ``baseline_id`` with ``candidate_id`` is no comparison, or None."""
    if baseline_id != candidate_id:
        return None
    return f"sweep {baseline_id} compared with itself always passes; give two sweeps"


def engine_map_problems(
    engine_map: Mapping[str, str],
    baseline_engines: Collection[str],
    candidate_engines: Collection[str],
) -> list[str]:
    """What is wrong with ``engine_map`` (CANDIDATE=BASELINE): each name that the
    sweep it belongs to did not run."""
    problems = []
    for cand, base in engine_map.items():
        if cand not in candidate_engines:
            problems.append(
                f"{cand}={base}: the candidate sweep ran no engine {cand!r} "
                f"(it ran {', '.join(sorted(candidate_engines)) or 'none'})"
            )
        if base not in baseline_engines:
            problems.append(
                f"{cand}={base}: the baseline sweep ran no engine {base!r} "
                f"(it ran {', '.join(sorted(baseline_engines)) or 'none'})"
            )
    return problems

"""`farm compare`'s decision: a candidate sweep judged against a baseline sweep, cell by
cell, by :func:`farm.analysis.judgement.judge` with the rules of
:func:`farm.analysis.rules.compare_rules`. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from farm.analysis.gate import engine_map_problems
from farm.analysis.judgement import NOTHING_COMPARED, Judgement, judge
from farm.analysis.rules import compare_rules
from farm.errors import FarmError
from farm.records import SweepRecord

__all__ = ["judge_comparison", "nothing_compared"]


def judge_comparison(
    base: SweepRecord, cand: SweepRecord, engine_map: Mapping[str, str]
) -> Judgement:
    """``cand`` against ``base`` (``engine_map``: CANDIDATE=BASELINE engine names); its
    ``comparison`` is set. FarmError when the map names an engine a sweep did not run."""
    engines = ({c.cell.engine for c in base.cells}, {c.cell.engine for c in cand.cells})
    if problems := engine_map_problems(engine_map, *engines):
        raise FarmError("--map-engine " + "; ".join(problems))
    judgement = judge(cand, base, None, compare_rules(engine_map))
    assert judgement.comparison is not None
    return judgement


def nothing_compared(judgement: Judgement) -> str | None:
    """Why the comparison is no pass because it compared nothing, or None: a gate never
    passes by accident."""
    for nothing in (f for f in judgement.findings if f.check == NOTHING_COMPARED):
        return f"{nothing.summary}; not a pass"
    return None

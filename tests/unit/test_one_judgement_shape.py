"""Every verdict through `judge`, with rules from the one factory; no sweep judged
against itself."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from farm.analysis.check_rules import CheckConfig
from farm.analysis.judgement import judge
from farm.analysis.rules import night_rules, pr_rules
from farm.errors import FarmError
from tests.fakes.simulate import simulate_sweep

FARM = Path(__file__).resolve().parents[2] / "farm"
# Only the judgement module and the rules factory may call these.
JUDGING_ONLY = {"compare_sweeps", "check_patches", "check_sweep", "JudgeRules"}
HOMES = {FARM / "analysis" / "judgement.py", FARM / "analysis" / "rules.py"}


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            names.add(name)
    return names


def test_only_the_judgement_and_the_rules_factory_make_rules_or_compare() -> None:
    offenders = {
        f"{path.relative_to(FARM.parent)}: {name}"
        for path in FARM.rglob("*.py")
        if path not in HOMES and "migrations" not in path.parts
        for name in _calls(path) & JUDGING_ONLY
    }
    assert not offenders, sorted(offenders)


def _sweep(seed: int) -> object:
    return simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=16,
    )


def test_a_sweep_is_never_judged_against_itself() -> None:
    sweep = _sweep(1)
    with pytest.raises(FarmError, match="cannot be judged against itself"):
        judge(sweep, sweep, None, night_rules(check=CheckConfig(resamples=200)))


def test_a_pr_baseline_of_the_same_sweep_with_other_cells_is_judged() -> None:
    # A PR's baseline is its own sweep's base-engine cells: same id, other cells.
    sweep = simulate_sweep(
        rng=np.random.default_rng(2),
        engines=("base", "cand"),
        graph_modes=("eager",),
        depths=(3,),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=16,
    )
    cand = sweep.model_copy(
        update={"cells": tuple(c for c in sweep.cells if c.cell.engine == "cand")}
    )
    base = sweep.model_copy(
        update={"cells": tuple(c for c in sweep.cells if c.cell.engine == "base")}
    )
    judgement = judge(cand, base, None, pr_rules(candidate="cand", base="base"))
    assert judgement.comparisons == 1

"""Attribution of regressions to the axis values that explain them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np

from farm.analysis.attribution import (
    AxisValue,
    LabeledCell,
    attribute,
    branch_table,
    labels_from_report,
)
from farm.analysis.check_rules import CheckConfig
from farm.analysis.checks import check_sweep
from farm.plan import ServerCell, Variant
from tests.fakes.simulate import simulate_sweep

Rule = Callable[[Mapping[str, AxisValue]], bool]


def _grid(rule: Rule) -> list[LabeledCell]:
    cells = []
    for g, d, s, t in itertools.product(
        ("eager", "piecewise", "full_decode_only"), (0, 1, 2, 3), ("on", "off"), ("on", "off")
    ):
        axes: dict[str, AxisValue] = {
            "graph_mode": g,
            "mtp_depth": d,
            "sliding_window": s,
            "thinking": t,
        }
        cells.append(LabeledCell(axes=axes, regressed=rule(axes)))
    return cells


def _seed_bug_1(a: Mapping[str, AxisValue]) -> bool:
    # The first seed bug (vllm-ascend PR #8210): SWA + full-graph FIA + MTP >= 2.
    return (
        a["graph_mode"] == "full_decode_only"
        and int(a["mtp_depth"]) >= 2
        and a["sliding_window"] == "on"
    )


def _terms(cells: list[LabeledCell]) -> set[str]:
    result = attribute(cells)
    assert result is not None
    return {str(t) for t in result.terms}


def test_seed_bug_1_conjunction_is_recovered_exactly() -> None:
    cells = _grid(_seed_bug_1)
    result = attribute(cells)
    assert result is not None and result.exact
    assert {str(t) for t in result.terms} == {
        "graph_mode=full_decode_only",
        "mtp_depth>=2",
        "sliding_window=on",
    }
    assert (result.regressed_covered, result.clean_covered) == (4, 0)


def test_single_term_rules() -> None:
    assert _terms(_grid(lambda a: a["graph_mode"] == "piecewise")) == {"graph_mode=piecewise"}
    assert _terms(_grid(lambda a: int(a["mtp_depth"]) >= 2)) == {"mtp_depth>=2"}
    assert _terms(_grid(lambda a: a["graph_mode"] != "eager")) == {"graph_mode!=eager"}
    assert _terms(_grid(lambda a: True)) == set()


def test_a_stray_false_positive_does_not_change_the_answer() -> None:
    cells = _grid(_seed_bug_1)
    cells[0] = cells[0].model_copy(update={"regressed": True})  # eager, depth 0: noise
    result = attribute(cells)
    assert result is not None and not result.exact
    assert {str(t) for t in result.terms} == {
        "graph_mode=full_decode_only",
        "mtp_depth>=2",
        "sliding_window=on",
    }
    assert (result.regressed_covered, result.clean_covered) == (4, 0)


def test_a_missed_cell_makes_the_rule_no_wider_than_the_evidence() -> None:
    """Tie between 'cover all, one clean inside' and 'miss one': fewest clean wins."""
    cells = _grid(_seed_bug_1)
    missed = next(i for i, c in enumerate(cells) if c.regressed and c.axes["mtp_depth"] == 2)
    cells[missed] = cells[missed].model_copy(update={"regressed": False})
    result = attribute(cells)
    assert result is not None
    # fdo AND depth>=2 AND swa=on would cover 3/3 with 1 clean: one error either way.
    assert (result.regressed_covered, result.clean_covered) == (2, 0)
    assert {str(t) for t in result.terms} == {
        "graph_mode=full_decode_only",
        "mtp_depth=3",
        "sliding_window=on",
    }


def test_nothing_regressed_means_no_attribution() -> None:
    assert attribute(_grid(lambda a: False)) is None


def test_branch_table_renders_rows_and_verdicts() -> None:
    cells = _grid(_seed_bug_1)
    rule = attribute(cells)
    table = branch_table(cells, rule=rule)
    assert table.axes == ("graph_mode", "mtp_depth", "sliding_window")
    assert len(table.rows) == 3 * 4 * 2
    text = table.render()
    lines = text.splitlines()
    assert lines[0].split() == [
        "graph_mode",
        "mtp_depth",
        "sliding_window",
        "regressed",
        "clean",
        "verdict",
        "rule",
    ]
    assert lines[1].split()[:3] == ["eager", "0", "on"]
    regressed = [line for line in lines if "REGRESSED" in line]
    assert len(regressed) == 2 and all("match" in line for line in regressed)
    assert lines[-1].startswith("rule: graph_mode=full_decode_only")
    mixed = branch_table(cells, axes=["graph_mode"]).rows
    assert [r.verdict for r in mixed] == ["clean", "clean", "mixed"]


def test_from_check_findings_to_the_rule() -> None:
    def bug(cell: ServerCell, v: Variant) -> float:
        hit = (
            cell.planned_graph_mode == "full_decode_only"
            and cell.mtp_depth >= 2
            and cell.sliding_window == "on"
        )
        return 0.85 if hit else 1.0

    sweep = simulate_sweep(
        rng=np.random.default_rng(8),
        depths=(0, 1, 2, 3),
        prompts=200,
        thinking=("off",),
        effect=bug,
    )
    report = check_sweep(sweep, config=CheckConfig(resamples=400))
    cells = labels_from_report(report)
    assert sum(c.regressed for c in cells) == 2
    result = attribute(cells)
    assert result is not None and result.exact
    assert {str(t) for t in result.terms} == {
        "graph_mode=full_decode_only",
        "mtp_depth>=2",
        "sliding_window=on",
    }

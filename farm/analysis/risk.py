"""Which cells of a job are likely to regress, from the job's own past regressions. Pure.

A fail-fast PR run (`farm pr --fail-fast`) starts the cells most likely to show a
regression first and stops at the first one confirmed. What is likely comes from the
job's history: every comparable key a past verdict found regressed votes for the cells
that share its axis values (graph mode, MTP depth, window, prefix caching, ...), in
proportion to how many they share. A cell like one that regressed twice before runs
before a cell like none; cells the history says nothing about keep the plan's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from farm.axes import AxisValue
from farm.comparable import ComparableKey
from farm.plan import ServerCell

__all__ = ["regression_risk", "risk_order"]

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

"""Attribute regressions to axis values: the smallest conjunction that explains them.

Given cells labelled regressed or clean, search all conjunctions of axis predicates
(at most one predicate per axis, at most ``max_terms`` terms) and keep the one that
misclassifies the fewest cells - regressed cells it misses plus clean cells it
covers - breaking ties by fewest clean cells covered, then fewest terms, then a fixed
predicate order. Minimising errors rather than demanding full coverage lets one
noisy verdict (a regressed cell judged clean) leave the answer intact.

Predicates are ``axis=value`` for every axis; ``axis!=value`` for unordered axes with
three or more values (``graph_mode!=eager``); ``axis>=v`` and ``axis<=v`` for numeric
axes (``mtp_depth>=2``). The search is exhaustive (a product over axes of the number
of predicates + 1; a few thousand conjunctions for a nightly matrix) with bitmask
coverage and a lower-bound prune, so the answer is exact and deterministic.

Example (the first seed bug, vllm-ascend PR #8210): over graph_mode x mtp_depth x
sliding_window x thinking, regressions exactly where FULL_DECODE_ONLY, MTP >= 2 and
SWA meet give ``graph_mode=full_decode_only AND mtp_depth>=2 AND sliding_window=on``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Literal

from farm.analysis.check_rules import CheckReport, VariantRef
from farm.frozen import Frozen
from farm.results.alerts import COVERAGE

__all__ = [
    "Attribution",
    "AxisValue",
    "BranchRow",
    "BranchTable",
    "LabeledCell",
    "Predicate",
    "attribute",
    "branch_table",
    "labels_from_report",
]

AxisValue = str | int | float
Op = Literal["==", "!=", ">=", "<="]
_OP_RANK: dict[str, int] = {"==": 0, ">=": 1, "<=": 2, "!=": 3}


class LabeledCell(Frozen):
    """A cell (or variant) by its axis values, and whether it regressed."""

    axes: dict[str, AxisValue]
    regressed: bool
    label: str = ""


class Predicate(Frozen):
    """One term: ``axis op value``."""

    axis: str
    op: Op
    value: AxisValue

    def matches(self, axes: Mapping[str, AxisValue]) -> bool:
        """Whether a cell with these axis values satisfies the term (absent axis: no)."""
        if self.axis not in axes:
            return False
        v = axes[self.axis]
        if self.op == "==":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        if isinstance(v, str) or isinstance(self.value, str):
            return False
        return v >= self.value if self.op == ">=" else v <= self.value

    def __str__(self) -> str:
        op = "=" if self.op == "==" else self.op
        return f"{self.axis}{op}{self.value}"


class Attribution(Frozen):
    """The chosen conjunction and how well it separates regressed from clean cells."""

    terms: tuple[Predicate, ...]
    regressed_total: int
    clean_total: int
    regressed_covered: int
    clean_covered: int

    @property
    def exact(self) -> bool:
        """Covers every regressed cell and no clean one."""
        return self.regressed_covered == self.regressed_total and self.clean_covered == 0

    def matches(self, axes: Mapping[str, AxisValue]) -> bool:
        return all(t.matches(axes) for t in self.terms)

    @property
    def conjunction(self) -> str:
        """The terms alone, without how many cells they cover."""
        return " AND ".join(str(t) for t in self.terms) or "(every cell)"

    def __str__(self) -> str:
        return (
            f"{self.conjunction}{COVERAGE}{self.regressed_covered}/{self.regressed_total} "
            f"regressed, {self.clean_covered}/{self.clean_total} clean"
        )


class BranchRow(Frozen):
    """One combination of the table's axes and the cells that have it."""

    values: tuple[AxisValue, ...]
    regressed: int
    clean: int
    matched: bool | None = None

    @property
    def verdict(self) -> str:
        if self.regressed and self.clean:
            return "mixed"
        return "REGRESSED" if self.regressed else "clean"


class BranchTable(Frozen):
    """Rows = axis combinations, columns = verdict counts; ``render`` prints it."""

    axes: tuple[str, ...]
    rows: tuple[BranchRow, ...]
    rule: str | None = None

    def render(self) -> str:
        """A fixed-width text table, one row per axis combination."""
        head = [*self.axes, "regressed", "clean", "verdict"]
        if self.rule is not None:
            head.append("rule")
        body = [
            [
                *(str(v) for v in r.values),
                str(r.regressed),
                str(r.clean),
                r.verdict,
                *([("match" if r.matched else "-")] if self.rule is not None else []),
            ]
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [head, *body]
        ]
        if self.rule is not None:
            lines.append(f"rule: {self.rule}")
        return "\n".join(lines)


def _axis_values(cells: Sequence[LabeledCell]) -> dict[str, list[AxisValue]]:
    """Values per axis: numbers sorted, words in the order the cells first show them."""
    values: dict[str, list[AxisValue]] = {}
    for c in cells:
        for k, v in c.axes.items():
            seen = values.setdefault(k, [])
            if v not in seen:
                seen.append(v)
    out = {}
    for k, vs in sorted(values.items()):
        numbers = sorted(v for v in vs if not isinstance(v, str))
        out[k] = [*numbers, *(v for v in vs if isinstance(v, str))]
    return out


def _predicates(axis: str, values: list[AxisValue]) -> list[Predicate]:
    preds = [Predicate(axis=axis, op="==", value=v) for v in values]
    numeric = all(not isinstance(v, str | bool) for v in values)
    if numeric:
        # >= max and <= min equal an equality term: leave them out.
        preds += [Predicate(axis=axis, op=">=", value=v) for v in values[1:-1]]
        preds += [Predicate(axis=axis, op="<=", value=v) for v in values[1:-1]]
    elif len(values) >= 3:
        preds += [Predicate(axis=axis, op="!=", value=v) for v in values]
    return preds


def attribute(
    cells: Sequence[LabeledCell],
    *,
    max_terms: int = 4,
    axes: Sequence[str] | None = None,
) -> Attribution | None:
    """The conjunction of axis predicates that best explains the regressed cells.

    ``axes`` limits the search to these axes (default: every axis with two or more
    values). Returns None when no cell regressed. See the module docstring for the
    objective and tie-breaks.
    """
    regressed = sum(c.regressed for c in cells)
    if regressed == 0:
        return None
    all_values = _axis_values(cells)
    wanted = axes if axes is not None else list(all_values)
    names = [a for a in wanted if len(all_values.get(a, [])) > 1]
    reg_mask = sum(1 << i for i, c in enumerate(cells) if c.regressed)
    full = (1 << len(cells)) - 1
    options: list[list[tuple[Predicate, int]]] = []
    for axis in names:
        opts = []
        for p in _predicates(axis, all_values[axis]):
            mask = sum(1 << i for i, c in enumerate(cells) if p.matches(c.axes))
            opts.append((p, mask))
        options.append(opts)

    def score(terms: tuple[Predicate, ...], mask: int) -> tuple[int, int, int, str]:
        covered_reg = (mask & reg_mask).bit_count()
        clean = (mask & ~reg_mask).bit_count()
        order = " ".join(f"{_OP_RANK[t.op]}{t}" for t in terms)
        return (regressed - covered_reg + clean, clean, len(terms), order)

    best_terms: tuple[Predicate, ...] = ()
    best = score((), full)

    def search(start: int, terms: tuple[Predicate, ...], mask: int) -> None:
        nonlocal best, best_terms
        if len(terms) == max_terms:
            return
        for axis_index in range(start, len(options)):
            for pred, pmask in options[axis_index]:
                new_mask = mask & pmask
                missed = regressed - (new_mask & reg_mask).bit_count()
                if missed > best[0]:
                    continue  # coverage only shrinks as terms are added
                new_terms = (*terms, pred)
                s = score(new_terms, new_mask)
                if s < best:
                    best, best_terms = s, new_terms
                search(axis_index + 1, new_terms, new_mask)

    search(0, (), full)
    mask = full
    for t in best_terms:
        mask &= sum(1 << i for i, c in enumerate(cells) if t.matches(c.axes))
    return Attribution(
        terms=best_terms,
        regressed_total=regressed,
        clean_total=len(cells) - regressed,
        regressed_covered=(mask & reg_mask).bit_count(),
        clean_covered=(mask & ~reg_mask).bit_count(),
    )


def branch_table(
    cells: Sequence[LabeledCell],
    axes: Sequence[str] | None = None,
    rule: Attribution | None = None,
) -> BranchTable:
    """Count regressed and clean cells per combination of ``axes``.

    Default axes: the rule's axes when a rule is given, else every axis that varies.
    Combinations no cell has are left out. With a rule, each row says whether the
    rule matches it (a row matches when all its cells do).
    """
    values = _axis_values(cells)
    if axes is None:
        axes = (
            [t.axis for t in rule.terms]
            if rule is not None and rule.terms
            else [a for a, vs in values.items() if len(vs) > 1]
        )
    rows = []
    for combo in itertools.product(*(values.get(a, []) for a in axes)):
        members = [
            c for c in cells if all(c.axes.get(a) == v for a, v in zip(axes, combo, strict=True))
        ]
        if not members:
            continue
        matched = all(rule.matches(c.axes) for c in members) if rule is not None else None
        rows.append(
            BranchRow(
                values=combo,
                regressed=sum(c.regressed for c in members),
                clean=sum(not c.regressed for c in members),
                matched=matched,
            )
        )
    return BranchTable(
        axes=tuple(axes), rows=tuple(rows), rule=str(rule) if rule is not None else None
    )


def labels_from_report(report: CheckReport) -> tuple[LabeledCell, ...]:
    """One labelled cell per variant named in ``report``'s verdicts.

    A variant is regressed when any failed verdict names it as the candidate; variants
    that appear only as references or in passing verdicts are clean.
    """
    refs: dict[str, VariantRef] = {}
    bad: set[str] = set()
    for v in report.verdicts:
        refs.setdefault(v.reference.label, v.reference)
        refs.setdefault(v.candidate.label, v.candidate)
        if v.regressed:
            bad.add(v.candidate.label)
    return tuple(
        LabeledCell(axes=refs[k].axes(), regressed=k in bad, label=k) for k in sorted(refs)
    )

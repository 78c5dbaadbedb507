"""Acceptance by context length: a drop named by the lengths it grows with.

A variant at one context length is compared on its own, like any other; when the
same variant was also measured at other lengths, its finding says how each length
moved ("acceptance fell only at some context lengths: at ctx 2048 fell 1.79 -> 1.00;
at ctx 0 unchanged 2.99 -> 2.99"), so a drop confined to long contexts reads as one.
Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from farm.analysis.check_rules import CheckVerdict
from farm.comparable import ComparableKey
from farm.frozen import Frozen

__all__ = [
    "ContextPoint",
    "context_clause",
    "context_clauses",
    "context_of",
    "context_siblings",
    "verdict_context_clauses",
]

T = TypeVar("T")


class ContextPoint(Frozen):
    """One context length of a variant: reference and candidate AL, and whether the
    comparison there regressed."""

    context: int
    reference: float
    candidate: float
    fell: bool


def _without_context(key: ComparableKey) -> ComparableKey:
    return key.model_copy(update={"axes": tuple((k, v) for k, v in key.axes if k != "context")})


def context_siblings(keys: Sequence[ComparableKey]) -> list[tuple[int, ...]]:
    """For each of ``keys``, the positions of the keys equal to it but for the context
    axis (its own included)."""
    groups: dict[ComparableKey, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(_without_context(key), []).append(i)
    return [tuple(groups[_without_context(key)]) for key in keys]


def context_of(key: ComparableKey) -> int:
    """The key's context length (0: none, and keys stored before the axis)."""
    return int(key.value("context"))


def context_clause(points: Iterable[ContextPoint], what: str = "acceptance") -> str | None:
    """How ``what`` moved at each context length, longest first, or None when the
    variant was measured at one length only."""
    by_length = sorted({p.context: p for p in points}.values(), key=lambda p: -p.context)
    if len(by_length) < 2:
        return None
    parts = [
        f"at ctx {p.context} {'fell' if p.fell else 'unchanged'} "
        f"{p.reference:.2f} -> {p.candidate:.2f}"
        for p in by_length
    ]
    if all(p.fell for p in by_length):
        lead = f"{what} fell at every context length"
    elif any(p.fell for p in by_length):
        lead = f"{what} fell only at some context lengths"
    else:
        lead = f"{what} by context length"
    return f"{lead}: " + "; ".join(parts)


def context_clauses(
    items: Sequence[T],
    key: Callable[[T], ComparableKey],
    point: Callable[[T], ContextPoint | None],
    group: Callable[[T], Hashable] = lambda _: None,
    what: Callable[[T], str] = lambda _: "acceptance",
) -> list[str | None]:
    """For each of ``items`` that fell (its ``point``), how its variant moved at each
    context length among the items of the same ``group`` (None: it did not fall, or
    its variant was measured at one length only)."""
    siblings = context_siblings([key(item) for item in items])
    out: list[str | None] = []
    for item, mine in zip(items, siblings, strict=True):
        own = point(item)
        if own is None or not own.fell:
            out.append(None)
            continue
        points = [
            p for j in mine if group(items[j]) == group(item) and (p := point(items[j])) is not None
        ]
        out.append(context_clause(points, what(item)))
    return out


def verdict_context_clauses(verdicts: Sequence[CheckVerdict]) -> list[str | None]:
    """:func:`context_clauses` of within-sweep verdicts, under the same check and
    metric."""
    return context_clauses(
        verdicts,
        key=lambda v: v.candidate.key,
        point=lambda v: ContextPoint(
            context=context_of(v.candidate.key),
            reference=v.reference_value.estimate,
            candidate=v.candidate_value.estimate,
            fell=v.regressed,
        ),
        group=lambda v: (v.check, v.metric, v.position),
        what=lambda v: "acceptance" if "acceptance" in v.metric else v.metric.replace("_", " "),
    )

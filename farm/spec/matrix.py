"""The axes of a job's matrix and its include / exclude rules."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    create_model,
    field_validator,
)

from farm.axes import AXES, AXIS_NAMES, Axis, AxisValue
from farm.spec.base import _located, _on_off, _Spec


def _axis_field(ax: Axis) -> tuple[Any, Any]:
    value: Any
    if ax.is_int:
        assert ax.bounds is not None
        value = Annotated[int, Field(ge=ax.bounds[0], le=ax.bounds[1], strict=True)]
    else:
        value = Literal[ax.words]
    return tuple[value, ...], Field(default=ax.default, min_length=1, description=ax.label)


class _AxesBase(_Spec):
    @field_validator("*", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        return [_on_off(v) for v in value] if isinstance(value, list) else value

    @field_validator("*")
    @classmethod
    def _once_each(cls, value: tuple[AxisValue, ...]) -> tuple[AxisValue, ...]:
        seen: dict[AxisValue, int] = {}
        problems = []
        for i, v in enumerate(value):
            if v in seen:
                problems.append(((i,), f"{v!r} is listed twice", (seen[v],)))
            seen.setdefault(v, i)
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return value


# The job's ``axes:`` section: one field per axis of farm.axes whose values it names.
AxesSpec: type[_AxesBase] = create_model(  # type: ignore[call-overload]
    "AxesSpec",
    __base__=_AxesBase,
    __doc__="Values of each axis the job file names in its axes: section.",
    **{a.name: _axis_field(a) for a in AXES if a.source == "axes"},
)


MatrixRule = dict[str, Any]


def _rule_problems(i: int, rule: Any) -> list[tuple[tuple[int | str, ...], str, Any]]:
    """What is wrong with include/exclude rule ``i`` (a non-empty mapping of known axes
    to values of their type), each at its own key; on/off words are normalized in place."""
    if not isinstance(rule, dict):
        return [((i,), "each rule is a mapping of axis: value", None)]
    if not rule:
        return [((i,), "an empty rule matches every cell; name at least one axis", None)]
    problems: list[tuple[tuple[int | str, ...], str, Any]] = [
        ((i, key), f"unknown axis {key!r}; axes: {', '.join(AXIS_NAMES)}", None)
        for key in rule
        if key not in AXIS_NAMES
    ]
    for ax in AXES:
        if ax.name not in rule:
            continue
        value = _on_off(rule[ax.name]) if ax.on_off else rule[ax.name]
        rule[ax.name] = value
        if ax.is_int:
            assert ax.bounds is not None
            ok = type(value) is int and ax.bounds[0] <= value <= ax.bounds[1]
            expected = f"a whole number from {ax.bounds[0]} to {ax.bounds[1]}"
        elif ax.words:
            ok, expected = value in ax.words, "one of " + ", ".join(ax.words)
        else:
            ok, expected = isinstance(value, str), f"the name of one of the job's {ax.source}"
        if not ok:
            problems.append(((i, ax.name), f"{value!r} is not {expected}", None))
    return problems

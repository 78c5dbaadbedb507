"""Grafana's SQL interpolation, for the subset of it the farm's queries use.

Grafana rewrites a panel's SQL before the data source runs it. The farm's queries
use only:

- ``$__timeFilter(expr)``: ``expr BETWEEN '<from>' AND '<to>'``, both bounds as UTC
  RFC 3339 timestamps (the PostgreSQL data source's macro);
- ``$__timeFrom()`` / ``$__timeTo()``: the quoted bounds alone;
- ``${name:sqlstring}``: the variable's values, each single-quoted with ``'`` doubled,
  joined by commas (Grafana's ``sqlstring`` format; "All" means every value the
  variable's own query returned).

:func:`interpolate` does the same so that tests can run every query against a real
PostgreSQL exactly as Grafana would send it. Anything else that looks like a macro or
a variable is refused rather than passed through, so a query cannot start using a
form this module (and so the tests) do not model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

__all__ = ["TimeRange", "interpolate", "referenced_variables"]

TimeRange = tuple[datetime, datetime]

_TIME_FILTER = re.compile(r"\$__timeFilter\(([^()]*)\)")
_TIME_FROM = "$__timeFrom()"
_TIME_TO = "$__timeTo()"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):sqlstring\}")
_ANY_DOLLAR = re.compile(r"\$\S*")


def referenced_variables(sql: str) -> set[str]:
    """Names of the dashboard variables ``sql`` uses (as ``${name:sqlstring}``)."""
    return set(_VARIABLE.findall(sql))


def _timestamp(value: datetime) -> str:
    if value.tzinfo is None:
        raise ValueError(f"time range bound {value.isoformat()} has no time zone")
    return "'" + value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") + "'"


def _sqlstring(name: str, values: Sequence[str]) -> str:
    if not values:
        raise ValueError(f"variable {name!r} has no value; Grafana would send broken SQL")
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def interpolate(sql: str, time_range: TimeRange, variables: Mapping[str, Sequence[str]]) -> str:
    """``sql`` as Grafana sends it for ``time_range`` and the selected variable values.

    Raises ValueError for a variable without values, a naive time bound, or any
    ``$`` form other than the ones listed in the module docstring.
    """
    start, end = (_timestamp(t) for t in time_range)
    out = _TIME_FILTER.sub(lambda m: f"{m.group(1).strip()} BETWEEN {start} AND {end}", sql)
    out = out.replace(_TIME_FROM, start).replace(_TIME_TO, end)

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            raise ValueError(f"query uses ${{{name}}}, which is not a dashboard variable")
        return _sqlstring(name, variables[name])

    # Checked before substitution: a selected value may itself contain a "$".
    leftover = _ANY_DOLLAR.findall(_VARIABLE.sub("", out))
    if leftover:
        raise ValueError(f"unsupported Grafana macro or variable form: {', '.join(leftover)}")
    return _VARIABLE.sub(variable, out)

"""The ranges of the numbers the farm stores and is given: one definition.

Ids, counts and limits are stored in 64-bit signed columns (SQLite's INTEGER,
PostgreSQL's BIGINT): a Python int past 2**63 - 1 overflows in SQLite's driver and
is bound as NUMERIC by PostgreSQL's, whose error then reads like an unreachable server.
Every id, limit or age that reaches a query is checked against these bounds where it
enters (a CLI option, a spool file), so it is refused cleanly instead of failing deep
in a driver. Numbers are ASCII digits only: ``"²".isdigit()`` is True but no id.

Pure: no I/O.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import Field

__all__ = [
    "MAX_AGE",
    "MAX_STORED_INT",
    "Seconds",
    "StoredCount",
    "StoredId",
    "StoredInt",
    "parse_age",
    "parse_stored_int",
]

MAX_STORED_INT = 2**63 - 1
# Ages compare with timestamps: a century is past any sweep, and far inside timedelta.
MAX_AGE = timedelta(days=36525)

StoredId = Annotated[int, Field(ge=1, le=MAX_STORED_INT)]
"""A row id: 1 .. 2**63 - 1."""

StoredCount = Annotated[int, Field(ge=0, le=MAX_STORED_INT)]
"""A count or limit that is stored or queried: 0 .. 2**63 - 1."""

StoredInt = Annotated[int, Field(ge=-MAX_STORED_INT - 1, le=MAX_STORED_INT)]
"""Any integer a 64-bit signed column holds (a counter read from an engine)."""

Seconds = Annotated[float, Field(allow_inf_nan=False)]
"""A duration that is stored: a finite number (``"NaN"`` in a spool file is refused
where it is read, not by ``farm export`` later)."""

_DIGITS = re.compile(r"[0-9]+\Z")
_AGE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*\Z")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_stored_int(text: str, *, low: int = 1, what: str = "an id") -> int:
    """``text`` as an int in ``low`` .. 2**63 - 1; ValueError saying what is expected."""
    value = text.strip()
    if not _DIGITS.match(value) or not low <= int(value) <= MAX_STORED_INT:
        raise ValueError(
            f"{text!r} is not {what}: expected a whole number from {low} to {MAX_STORED_INT}"
        )
    return int(value)


def parse_age(text: str, units: str = "smhdw") -> timedelta:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (a unit among ``units``) as a positive
    duration of at most a century; ValueError saying what is expected."""
    m = _AGE.match(text)
    if m is None or m[2] not in units or float(m[1]) <= 0:
        raise ValueError(
            f"{text!r} is not an age: expected a positive number and a unit "
            f"({', '.join(units)}), for example 7d"
        )
    seconds = float(m[1]) * _AGE_UNITS[m[2]]
    if seconds > MAX_AGE.total_seconds():
        raise ValueError(f"{text!r} is longer than a century ({MAX_AGE.days}d); give a shorter age")
    return timedelta(seconds=seconds)

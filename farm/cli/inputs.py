"""Option and argument types shared by the commands: checked when the command line is
parsed, so bad input is refused before anything runs.

- :data:`STORE_ID`, :data:`LIMIT`: the one bounded integer type of ids (a sweep, an
  alert, a bisection: 1 .. 2**63 - 1) and limits / counts (0 .. 2**63 - 1), ASCII
  digits only (farm.bounds); given as ``parser=`` to ``typer.Option`` or
  ``typer.Argument``.
- :data:`DAYS`: an age in days (``--older-than-days``): finite, 0 .. a century.
- :func:`store_id_or_latest`: a sweep id or ``latest``.
- :func:`plain_text`: free text a user gives (``--note``, ``--by``) holds no control
  character (an ANSI escape stored in a note would reach every later terminal).
"""

from __future__ import annotations

import typer

from farm.bounds import parse_stored_int
from farm.inert import show_controls

__all__ = ["DAYS", "LIMIT", "SECONDS", "STORE_ID", "plain_text", "store_id_or_latest"]


def _stored_int(value: object, low: int, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a default, converted like a given value
    try:
        return parse_stored_int(str(value), low=low, what=what)
    except ValueError as exc:
        raise typer.BadParameter(show_controls(str(exc))) from None


def STORE_ID(value: object) -> int:
    """An id a store column holds: 1 .. 2**63 - 1; BadParameter otherwise."""
    return _stored_int(value, 1, "an id")


def LIMIT(value: object) -> int:
    """A limit or count: 0 .. 2**63 - 1; BadParameter otherwise."""
    return _stored_int(value, 0, "a count")


def DAYS(value: object) -> float:
    """A number of days from 0 to a century (farm.bounds.MAX_AGE); no NaN, no
    infinity, no negative age; BadParameter otherwise."""
    import math

    from farm.bounds import MAX_AGE

    try:
        days = float(str(value).strip())
    except ValueError:
        days = math.nan
    if not math.isfinite(days) or not 0 <= days <= MAX_AGE.days:
        raise typer.BadParameter(
            f"{show_controls(str(value))!r} is not a number of days from 0 to {MAX_AGE.days}"
        )
    return days


def SECONDS(value: object) -> float:
    """A timeout in seconds: finite, above 0, at most a day; BadParameter otherwise
    (``--timeout 0`` fails every request, which would read as a wrong server)."""
    import math

    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 < seconds <= 86400:
        raise typer.BadParameter(
            f"{show_controls(str(value))!r} is not a number of seconds above 0 (at most 86400)"
        )
    return seconds


def store_id_or_latest(value: str, option: str = "SWEEP") -> str:
    """``value`` when it is ``latest`` or an id :data:`STORE_ID` takes; BadParameter
    naming ``option`` otherwise."""
    if value == "latest":
        return value
    try:
        parse_stored_int(value)
    except ValueError as exc:
        raise typer.BadParameter(
            f"{show_controls(str(exc))}, or 'latest'", param_hint=option
        ) from None
    return value


def plain_text(value: str | None) -> str | None:
    """A typer callback: ``value`` unless it holds a control or format character."""
    if value is not None and not value.isprintable():
        raise typer.BadParameter(
            f"{show_controls(value)!r} holds control characters (shown escaped); give plain text"
        )
    return value

"""The words of a message, shared by the chat notifiers. Pure.

Plain-text pieces of an alert message, and :class:`Notice`: a message that is not an
alert (a bisection's answer). Each notifier escapes and lays these out in its own
format; the words and figures are the same everywhere, so a Slack message and a
Feishu card say the same thing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import field_validator

from farm.frozen import Frozen
from farm.inert import UntrustedText
from farm.results.alerts import METRIC_NAMES, AlertFigure, AlertRecord, metric_name

__all__ = [
    "MAX_ALERTS_PER_MESSAGE",
    "METRIC_NAMES",
    "Notice",
    "NoticeLevel",
    "alert_lines",
    "alert_title",
    "figure_line",
    "headline",
    "metric_name",
]

# Chat messages have size limits (Slack: 50 blocks; WeCom: 4096 bytes; Feishu: 20 KB);
# past this many alerts a message lists the first ones and says how many more.
MAX_ALERTS_PER_MESSAGE = 10


def headline(alerts: Sequence[AlertRecord]) -> str:
    """One line: how many alerts, how many critical, from which sweep(s); for alerts
    that all recovered (or were withdrawn), that they did."""
    plural = "s" if len(alerts) != 1 else ""
    if alerts and all(a.state == "recovered" for a in alerts):
        sweeps = sorted({a.recovered_sweep_id or a.last_sweep_id for a in alerts})
        return f"mtp-farm: {len(alerts)} alert{plural} recovered in {_sweeps(sweeps)}"
    if alerts and all(a.state == "withdrawn" for a in alerts):
        sweeps = sorted({a.last_sweep_id for a in alerts})
        return (
            f"mtp-farm: {len(alerts)} early alert{plural} withdrawn: the verdict on "
            f"{_sweeps(sweeps)} did not confirm {'them' if plural else 'it'}"
        )
    critical = sum(a.severity == "critical" for a in alerts)
    sweeps = sorted({a.last_sweep_id for a in alerts})
    crit = f", {critical} critical" if critical else ""
    return f"mtp-farm: {len(alerts)} alert{plural} in {_sweeps(sweeps)}{crit}"


def _sweeps(ids: Sequence[int]) -> str:
    return f"sweep {ids[0]}" if len(ids) == 1 else f"sweeps {ids[0]}-{ids[-1]}"


def figure_line(f: AlertFigure) -> str:
    """``AL 2.65 [2.53, 2.75] vs 3.05 [2.90, 3.17]: -0.40 [-0.49, -0.31] (-13.1%)``."""
    rel = f" ({f.relative:+.1%})" if f.relative is not None else ""
    return (
        f"{metric_name(f.metric, f.position)} {f.candidate_value} vs {f.reference_value}: "
        f"{f.difference}{rel}"
    )


def alert_title(a: AlertRecord) -> str:
    """``#12 critical graph_vs_eager AL: <cell key>``."""
    return f"#{a.id} {a.severity} {a.kind} {metric_name(a.metric)}: {a.details.cell}"


def alert_lines(a: AlertRecord) -> list[str]:
    """The body lines of one alert: what is new (a changed cause, a recovery), figures,
    reference, attribution, history, triage."""
    lines = [f"news: {a.news}"] if a.news else []
    lines += [figure_line(f) for f in a.details.figures]
    if a.details.figures:
        lines.append(f"reference: {a.details.figures[0].reference}")
    if a.details.error:
        lines.append(a.details.error.splitlines()[0][:300])
    if a.details.attribution:
        lines.append(f"explained by: {a.details.attribution}")
    seen = (
        f"first seen in sweep {a.first_sweep_id}, {a.occurrences} sweep(s)"
        if a.occurrences > 1
        else f"sweep {a.last_sweep_id}"
    )
    lines.append(seen)
    if a.state != "untriaged":
        by = f" by {a.triaged_by}" if a.triaged_by else ""
        lines.append(f"triage: {a.state}{by}" + (f" ({a.link})" if a.link else ""))
    return lines


NoticeLevel = Literal["info", "warning"]

# An http(s) URL without the characters chat markup gives a meaning to (Slack's <url|x>,
# Markdown's [x](url)), so every channel can carry it as it is.
_LINK = re.compile(r"https?://[^\s<>()\[\]{}|\\^`\"']+")


class Notice(Frozen):
    """A message that is not an alert, in words every channel can lay out.

    ``title``: one line (chat headers cut it at 150 characters); ``level``: ``warning``
    (someone should act, e.g. a culprit was found) or ``info``; ``lines``: the body, one
    fact per line, plain text (each channel escapes it); ``footer``: where to see
    everything, e.g. a command; ``link``: an http(s) URL to open; ``topic``: what the
    notice is about (``bisection:7``), for receivers that route by it.
    """

    # Lines may quote outside text (a commit subject, a failed step's error): held as
    # such, credentials masked, in every channel and in the webhook's JSON body.
    title: UntrustedText
    level: NoticeLevel = "info"
    lines: tuple[UntrustedText, ...] = ()
    footer: UntrustedText = ""
    link: str | None = None
    topic: str = ""

    @field_validator("title")
    @classmethod
    def _one_line(cls, value: str) -> str:
        line = " ".join(value.split())
        if not line:
            raise ValueError("a notice needs a title")
        return line

    @field_validator("link")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not _LINK.fullmatch(value):
            raise ValueError(
                f"link {value!r}: expected an http(s) URL without spaces, quotes, brackets or |"
            )
        return value

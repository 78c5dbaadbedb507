"""Slack (and Slack-compatible: Mattermost, Rocket.Chat) incoming webhooks.

One message per batch of alerts: ``{"text": fallback, "blocks": [...]}`` with a
header block, one section per alert (at most
:data:`farm.notify.message.MAX_ALERTS_PER_MESSAGE`) and a context line. A notice
(:class:`farm.notify.message.Notice`) is one message of the same shape: its title as
the header, its lines in as few sections as fit, and a context line with its level,
footer and link. API:
https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks and
https://docs.slack.dev/reference/block-kit/blocks (header text <= 150 characters,
section text <= 3000, at most 50 blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from farm.inert import show_controls, slack_mrkdwn, untrusted
from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.message import (
    MAX_ALERTS_PER_MESSAGE,
    Notice,
    alert_lines,
    alert_title,
    headline,
)
from farm.results.alerts import AlertRecord

__all__ = ["SlackError", "SlackNotifier", "slack_notice_payload", "slack_payload"]

_HEADER_MAX = 150
_SECTION_MAX = 3000
_MAX_BLOCKS = 50
_LEVEL_ICONS = {"warning": ":large_orange_circle:", "info": ":large_blue_circle:"}


class SlackError(NotifyError):
    """Slack refused the message or did not answer."""


def _escape(text: str) -> str:
    # The three characters Slack's mrkdwn requires escaped (mentions and links are
    # <...>); control characters shown escaped; URL credentials masked.
    return slack_mrkdwn(text)


def _plain(text: str) -> str:
    # A plain_text element or the notification's fallback: Slack shows it as written,
    # but a terminal-style control character or a password must not ride along.
    return show_controls(untrusted(text), "\n")


def slack_payload(alerts: Sequence[AlertRecord]) -> dict[str, Any]:
    """The message for ``alerts``: plain ``text`` for notifications, ``blocks`` to show."""
    title = headline(alerts)
    shown = alerts[:MAX_ALERTS_PER_MESSAGE]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:_HEADER_MAX]}}
    ]
    for a in shown:
        icon = ":red_circle:" if a.severity == "critical" else ":large_orange_circle:"
        body = "\n".join(_escape(line) for line in alert_lines(a))
        text = f"{icon} *{_escape(alert_title(a))}*\n{body}"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text[:_SECTION_MAX]}})
    more = len(alerts) - len(shown)
    footer = (f"and {more} more; " if more else "") + "`farm alerts list` shows all"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": footer}]})
    fallback = _plain("\n".join([title, *(alert_title(a) for a in shown)]))
    return {"text": fallback, "blocks": blocks}


def _sections(lines: Sequence[str], limit: int) -> list[str]:
    """``lines`` joined into as few texts of at most ``limit`` characters as they fit
    in (a longer line is cut)."""
    out: list[str] = []
    for line in (x[:limit] for x in lines):
        if out and len(out[-1]) + 1 + len(line) <= limit:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def slack_notice_payload(notice: Notice) -> dict[str, Any]:
    """The message for ``notice``: header, sections (within Slack's 50 blocks), context."""
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _plain(notice.title)[:_HEADER_MAX]},
        }
    ]
    sections = _sections([_escape(line) for line in notice.lines], _SECTION_MAX)
    for text in sections[: _MAX_BLOCKS - 2]:  # room for the header and the context
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    context = [f"{_LEVEL_ICONS[notice.level]} {notice.level}"]
    if notice.footer:
        context.append(_escape(notice.footer))
    if notice.link:
        context.append(f"<{notice.link}|open>")
    text = " | ".join(context)[:_SECTION_MAX]
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": text}]})
    return {"text": _plain(notice.title), "blocks": blocks}


@dataclass(frozen=True)
class SlackNotifier:
    """Posts to a Slack incoming webhook ``url`` (from ``FARM_NOTIFY_SLACK_URL``).

    API: https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks
    Incoming webhooks take no idempotency key: a POST that may have reached Slack (a
    read timeout, a 5xx) is reported, not retried (:mod:`farm.notify.http`).
    """

    url: str = field(repr=False)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        return "slack"

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """Post one message for ``alerts`` (nothing for none); raises SlackError."""
        if alerts:
            self._post(slack_payload(alerts))

    def send_notice(self, notice: Notice) -> None:
        """Post one message for ``notice``; raises SlackError."""
        self._post(slack_notice_payload(notice))

    def _post(self, payload: dict[str, Any]) -> None:
        post_json(
            self.url,
            payload,
            service="slack",
            error=SlackError,
            policy=self.policy,
            client=self.client,
            hint="check FARM_NOTIFY_SLACK_URL (the webhook may have been revoked)",
        )

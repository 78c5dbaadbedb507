"""Slack (and Slack-compatible: Mattermost, Rocket.Chat) incoming webhooks.

One message per batch of alerts: ``{"text": fallback, "blocks": [...]}`` with a
header block, one section per alert (at most
:data:`farm.notify.message.MAX_ALERTS_PER_MESSAGE`) and a context line. API:
https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks and
https://docs.slack.dev/reference/block-kit/blocks (header text <= 150 characters,
section text <= 3000, at most 50 blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from farm.notify.alert import AlertRecord
from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.message import MAX_ALERTS_PER_MESSAGE, alert_lines, alert_title, headline

__all__ = ["SlackError", "SlackNotifier", "slack_payload"]

_HEADER_MAX = 150
_SECTION_MAX = 3000


class SlackError(NotifyError):
    """Slack refused the message or did not answer."""


def _escape(text: str) -> str:
    # The three characters Slack's mrkdwn requires escaped.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
    fallback = "\n".join([title, *(alert_title(a) for a in shown)])
    return {"text": fallback, "blocks": blocks}


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
        if not alerts:
            return
        post_json(
            self.url,
            slack_payload(alerts),
            service="slack",
            error=SlackError,
            policy=self.policy,
            client=self.client,
            hint="check FARM_NOTIFY_SLACK_URL (the webhook may have been revoked)",
        )

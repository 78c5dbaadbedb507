"""Feishu / Lark custom bot webhooks, signed when the bot has a secret.

``msg_type`` ``"interactive"`` (default: a card with a coloured header and one
markdown element per alert; for a notice, one markdown element with its lines and
link) or ``"text"``. With signature verification enabled on
the bot, each request carries ``timestamp`` (seconds) and ``sign`` =
base64(HMAC-SHA256 keyed with ``f"{timestamp}\\n{secret}"`` over an empty message);
the server refuses timestamps more than an hour off. Feishu answers HTTP 200 with
``{"code": 0}`` on success and a non-zero ``code`` otherwise (19021: bad signature).
API: https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot (Lark:
https://open.larksuite.com/document/client-docs/bot-v3/add-custom-bot); request
bodies are limited to 20 KB.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from farm.inert import feishu_markdown, feishu_text
from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.message import (
    MAX_ALERTS_PER_MESSAGE,
    Notice,
    alert_lines,
    alert_title,
    headline,
)
from farm.results.alerts import AlertRecord

__all__ = [
    "FeishuError",
    "FeishuNotifier",
    "feishu_notice_payload",
    "feishu_payload",
    "feishu_sign",
]

FeishuFormat = Literal["interactive", "text"]
# Leaves room for the envelope below Feishu's 20 KB body limit (CJK is 3 bytes/char).
_TEXT_MAX_CHARS = 5000
# Card header colours (Feishu's template names).
_NOTICE_TEMPLATES = {"warning": "orange", "info": "blue"}


class FeishuError(NotifyError):
    """Feishu/Lark refused the message (non-zero ``code``) or did not answer."""


def feishu_sign(timestamp: int, secret: str) -> str:
    """The ``sign`` field for ``timestamp`` (Unix seconds) and the bot's secret."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def _escape(text: str) -> str:
    # Card markdown reads <...> as tags (<at>, <font>) and [x](y) as links: inert text.
    return feishu_markdown(text)


def feishu_payload(alerts: Sequence[AlertRecord], msg_type: FeishuFormat) -> dict[str, Any]:
    """The unsigned request body for ``alerts``."""
    title = headline(alerts)
    shown = alerts[:MAX_ALERTS_PER_MESSAGE]
    more = len(alerts) - len(shown)
    footer = (f"and {more} more; " if more else "") + "`farm alerts list` shows all"
    if msg_type == "text":
        parts = [title]
        for a in shown:
            parts.append("\n".join([f"[{a.severity}] {alert_title(a)}", *alert_lines(a)]))
        parts.append(footer)
        text = feishu_text("\n\n".join(parts)[:_TEXT_MAX_CHARS])
        return {"msg_type": "text", "content": {"text": text}}
    elements: list[dict[str, Any]] = []
    for a in shown:
        colour = "red" if a.severity == "critical" else "orange"
        lines = "\n".join(_escape(line) for line in alert_lines(a))
        text = f"<font color='{colour}'>**{_escape(alert_title(a))}**</font>\n{lines}"
        if elements:
            elements.append({"tag": "hr"})
        elements.append({"tag": "markdown", "content": text[: _TEXT_MAX_CHARS // 2]})
    elements.append({"tag": "note", "elements": [{"tag": "plain_text", "content": footer}]})
    critical = any(a.severity == "critical" for a in alerts)
    return {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {
                "template": "red" if critical else "orange",
                "title": {"tag": "plain_text", "content": feishu_text(title)},
            },
            "elements": elements,
        },
    }


def feishu_notice_payload(notice: Notice, msg_type: FeishuFormat) -> dict[str, Any]:
    """The unsigned request body for ``notice``."""
    if msg_type == "text":
        parts = [notice.title, "\n".join(notice.lines), notice.footer, notice.link or ""]
        text = feishu_text("\n\n".join(p for p in parts if p)[:_TEXT_MAX_CHARS])
        return {"msg_type": "text", "content": {"text": text}}
    body = "\n".join(_escape(line) for line in notice.lines)
    if notice.link:
        body += f"\n[{_escape(notice.link)}]({notice.link})"
    elements: list[dict[str, Any]] = [{"tag": "markdown", "content": body[:_TEXT_MAX_CHARS]}]
    if notice.footer:
        elements.append(
            {
                "tag": "note",
                "elements": [{"tag": "plain_text", "content": feishu_text(notice.footer)}],
            }
        )
    return {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {
                "template": _NOTICE_TEMPLATES[notice.level],
                "title": {"tag": "plain_text", "content": feishu_text(notice.title)},
            },
            "elements": elements,
        },
    }


def _refused(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None  # some gateways answer 200 with an empty body
    if not isinstance(body, dict):
        return None
    code = body.get("code", body.get("StatusCode", 0))
    if code in (0, None):
        return None
    return f"code {code}: {body.get('msg') or body.get('StatusMessage') or 'no message'}"


@dataclass(frozen=True)
class FeishuNotifier:
    """Posts to a Feishu/Lark custom bot ``url`` (``FARM_NOTIFY_FEISHU_URL``), signing
    with ``secret`` (``FARM_NOTIFY_FEISHU_SECRET``) when set.

    API: https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot
    Custom bots take no idempotency key: a POST that may have reached Feishu (a read
    timeout, a 5xx) is reported, not retried (:mod:`farm.notify.http`).
    """

    url: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)
    msg_type: FeishuFormat = "interactive"
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        return "feishu"

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """Post one message for ``alerts`` (nothing for none); raises FeishuError."""
        if alerts:
            self._post(feishu_payload(alerts, self.msg_type))

    def send_notice(self, notice: Notice) -> None:
        """Post one message for ``notice``, signed as alerts are; raises FeishuError."""
        self._post(feishu_notice_payload(notice, self.msg_type))

    def _post(self, payload: dict[str, Any]) -> None:
        if self.secret:
            # Signed once: a retry (connect errors, 429 only) comes seconds later, well
            # inside the one-hour window.
            timestamp = int(self.clock())
            payload = {
                "timestamp": str(timestamp),
                "sign": feishu_sign(timestamp, self.secret),
                **payload,
            }
        post_json(
            self.url,
            payload,
            service="feishu",
            error=FeishuError,
            secrets=[self.secret] if self.secret else [],
            policy=self.policy,
            client=self.client,
            check=_refused,
            hint="check FARM_NOTIFY_FEISHU_URL, FARM_NOTIFY_FEISHU_SECRET and the bot's "
            "security settings (keywords, IP allow-list)",
        )

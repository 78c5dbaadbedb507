"""WeCom (WeChat Work) group bot webhooks: ``{"msgtype": "markdown", ...}``, for a
batch of alerts or for a notice (its title, level, lines, footer and link).

WeCom answers HTTP 200 with ``{"errcode": 0, "errmsg": "ok"}`` on success and a
non-zero ``errcode`` otherwise; markdown content is limited to 4096 bytes of UTF-8.
API: https://developer.work.weixin.qq.com/document/path/91770
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from farm.inert import show_controls, wecom_markdown
from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.message import (
    MAX_ALERTS_PER_MESSAGE,
    Notice,
    alert_lines,
    alert_title,
    headline,
)
from farm.results.alerts import AlertRecord

__all__ = ["WeComError", "WeComNotifier", "wecom_notice_payload", "wecom_payload"]

_CONTENT_MAX_BYTES = 4096


class WeComError(NotifyError):
    """WeCom refused the message (non-zero ``errcode``) or did not answer."""


def _truncate_utf8(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    cut = data[: limit - len(b" ...")].decode(errors="ignore")
    return cut + " ..."


def wecom_payload(alerts: Sequence[AlertRecord]) -> dict[str, Any]:
    """The request body for ``alerts``: WeCom markdown, cut to 4096 bytes."""
    shown = alerts[:MAX_ALERTS_PER_MESSAGE]
    parts = [f"## {headline(alerts)}"]
    for a in shown:
        colour = "warning" if a.severity == "critical" else "comment"
        lines = "\n".join(f"> {wecom_markdown(line)}" for line in alert_lines(a))
        title = wecom_markdown(alert_title(a))
        parts.append(f'<font color="{colour}">**{title}**</font>\n{lines}')
    more = len(alerts) - len(shown)
    parts.append((f"and {more} more; " if more else "") + "`farm alerts list` shows all")
    content = _truncate_utf8("\n\n".join(parts), _CONTENT_MAX_BYTES)
    return {"msgtype": "markdown", "markdown": {"content": content}}


def wecom_notice_payload(notice: Notice) -> dict[str, Any]:
    """The request body for ``notice``: WeCom markdown within 4096 bytes, the body cut
    first so that the title, footer and link survive a long notice."""
    # The levels are names of WeCom markdown's font colours (info green, warning orange).
    head = f'## {wecom_markdown(notice.title)}\n<font color="{notice.level}">{notice.level}</font>'
    # The link is checked (farm.notify.message): an http(s) URL without markup characters.
    link = f"[{notice.link}]({notice.link})" if notice.link else ""
    # The footer is the farm's own words (a command in `backticks`): controls only.
    tail = "\n".join(x for x in (show_controls(notice.footer), link) if x)
    body = "\n".join(f"> {wecom_markdown(line)}" for line in notice.lines)
    sep = "\n\n"
    room = _CONTENT_MAX_BYTES - len(f"{head}{sep}{sep}{tail}".encode())
    parts = [head, _truncate_utf8(body, room) if room > len(" ...") else "", tail]
    # A title or footer too long on its own is cut with the rest.
    content = _truncate_utf8(sep.join(p for p in parts if p), _CONTENT_MAX_BYTES)
    return {"msgtype": "markdown", "markdown": {"content": content}}


def _refused(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("errcode", 0) == 0:
        return None
    return f"errcode {body.get('errcode')}: {body.get('errmsg') or 'no message'}"


@dataclass(frozen=True)
class WeComNotifier:
    """Posts to a WeCom group bot ``url`` (``FARM_NOTIFY_WECOM_URL``, with its ``key``).

    API: https://developer.work.weixin.qq.com/document/path/91770
    Group bots take no idempotency key: a POST that may have reached WeCom (a read
    timeout, a 5xx) is reported, not retried (:mod:`farm.notify.http`).
    """

    url: str = field(repr=False)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        return "wecom"

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """Post one message for ``alerts`` (nothing for none); raises WeComError."""
        if alerts:
            self._post(wecom_payload(alerts))

    def send_notice(self, notice: Notice) -> None:
        """Post one message for ``notice``; raises WeComError."""
        self._post(wecom_notice_payload(notice))

    def _post(self, payload: dict[str, Any]) -> None:
        post_json(
            self.url,
            payload,
            service="wecom",
            error=WeComError,
            policy=self.policy,
            client=self.client,
            check=_refused,
            hint="check FARM_NOTIFY_WECOM_URL (its key= may have been reset)",
        )

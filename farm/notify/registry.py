"""Which notifiers are configured (from the environment) and sending to all of them."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Protocol

from farm.notify.alert import AlertRecord
from farm.notify.feishu import FeishuNotifier
from farm.notify.http import NotifyError, RetryPolicy
from farm.notify.slack import SlackNotifier
from farm.notify.webhook import WebhookNotifier
from farm.notify.wecom import WeComNotifier

__all__ = ["ENV_VARS", "Notifier", "notifiers_from_env", "send_all"]

log = logging.getLogger("farm.notify")

ENV_VARS = {
    "FARM_NOTIFY_WEBHOOK_URL": "generic webhook: the alert JSON, one POST per alert",
    "FARM_NOTIFY_WEBHOOK_SECRET": "optional: HMAC-SHA256 signature header for the webhook",
    "FARM_NOTIFY_SLACK_URL": "Slack incoming webhook URL",
    "FARM_NOTIFY_FEISHU_URL": "Feishu/Lark custom bot webhook URL",
    "FARM_NOTIFY_FEISHU_SECRET": "optional: the Feishu bot's signing secret",
    "FARM_NOTIFY_FEISHU_FORMAT": "optional: interactive (default) or text",
    "FARM_NOTIFY_WECOM_URL": "WeCom group bot webhook URL (with key=...)",
}


class Notifier(Protocol):
    """Delivers a batch of alerts to one channel; raises a NotifyError subclass."""

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        ...

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """Deliver ``alerts`` (nothing for none); raise a NotifyError subclass on failure."""
        ...


def notifiers_from_env(
    env: Mapping[str, str] | None = None, policy: RetryPolicy | None = None
) -> list[Notifier]:
    """One notifier per channel whose URL is set in ``env`` (default: ``os.environ``).

    Raises NotifyError for an invalid ``FARM_NOTIFY_FEISHU_FORMAT``.
    """
    env = os.environ if env is None else env
    policy = policy or RetryPolicy()
    out: list[Notifier] = []
    if url := env.get("FARM_NOTIFY_WEBHOOK_URL"):
        out.append(
            WebhookNotifier(url, secret=env.get("FARM_NOTIFY_WEBHOOK_SECRET"), policy=policy)
        )
    if url := env.get("FARM_NOTIFY_SLACK_URL"):
        out.append(SlackNotifier(url, policy=policy))
    if url := env.get("FARM_NOTIFY_FEISHU_URL"):
        fmt = env.get("FARM_NOTIFY_FEISHU_FORMAT") or "interactive"
        if fmt not in ("interactive", "text"):
            raise NotifyError(
                f"FARM_NOTIFY_FEISHU_FORMAT={fmt!r}: expected 'interactive' or 'text'"
            )
        secret = env.get("FARM_NOTIFY_FEISHU_SECRET")
        out.append(
            FeishuNotifier(
                url,
                secret=secret,
                msg_type="text" if fmt == "text" else "interactive",
                policy=policy,
            )
        )
    if url := env.get("FARM_NOTIFY_WECOM_URL"):
        out.append(WeComNotifier(url, policy=policy))
    return out


def send_all(notifiers: Sequence[Notifier], alerts: Sequence[AlertRecord]) -> list[NotifyError]:
    """Send ``alerts`` through every notifier; one failing channel does not stop the
    others. Returns the errors (already free of secrets), empty when all delivered."""
    errors: list[NotifyError] = []
    if not alerts:
        return errors
    for n in notifiers:
        try:
            n.send(alerts)
        except NotifyError as exc:
            log.error("%s", exc)
            errors.append(exc)
    return errors

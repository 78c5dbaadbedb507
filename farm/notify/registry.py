"""Which notifiers are configured (:class:`farm.settings.NotifySettings`) and sending
alerts or a notice to all of them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from pydantic import SecretStr

from farm.notify.feishu import FeishuNotifier
from farm.notify.http import NotifyError, RetryPolicy
from farm.notify.message import Notice
from farm.notify.slack import SlackNotifier
from farm.notify.webhook import WebhookNotifier
from farm.notify.wecom import WeComNotifier
from farm.results.alerts import AlertRecord
from farm.settings import NotifySettings, env_vars, get_settings

__all__ = ["ENV_VARS", "Notifier", "configured_notifiers", "send_all", "send_notice_all"]

log = logging.getLogger("farm.notify")

ENV_VARS: dict[str, str] = env_vars(NotifySettings)
"""The channels' environment variables (``FARM_NOTIFY_*``), with their descriptions."""


class Notifier(Protocol):
    """Delivers a batch of alerts, or a notice, to one channel; raises a NotifyError
    subclass."""

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        ...

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """Deliver ``alerts`` (nothing for none); raise a NotifyError subclass on failure."""
        ...

    def send_notice(self, notice: Notice) -> None:
        """Deliver ``notice``; raise a NotifyError subclass on failure."""
        ...


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def configured_notifiers(
    settings: NotifySettings | None = None, policy: RetryPolicy | None = None
) -> list[Notifier]:
    """One notifier per channel whose URL is set (default: the environment's settings).

    Raises NotifyError for an invalid ``FARM_NOTIFY_FEISHU_FORMAT``.
    """
    cfg = settings if settings is not None else get_settings().notify
    policy = policy or RetryPolicy()
    out: list[Notifier] = []
    if url := _secret(cfg.webhook_url):
        out.append(WebhookNotifier(url, secret=_secret(cfg.webhook_secret), policy=policy))
    if url := _secret(cfg.slack_url):
        out.append(SlackNotifier(url, policy=policy))
    if url := _secret(cfg.feishu_url):
        fmt = cfg.feishu_format
        if fmt not in ("interactive", "text"):
            raise NotifyError(
                f"FARM_NOTIFY_FEISHU_FORMAT={fmt!r}: expected 'interactive' or 'text'"
            )
        out.append(
            FeishuNotifier(
                url,
                secret=_secret(cfg.feishu_secret),
                msg_type="text" if fmt == "text" else "interactive",
                policy=policy,
            )
        )
    if url := _secret(cfg.wecom_url):
        out.append(WeComNotifier(url, policy=policy))
    return out


def send_all(notifiers: Sequence[Notifier], alerts: Sequence[AlertRecord]) -> list[NotifyError]:
    """Send ``alerts`` through every notifier; one failing channel does not stop the
    others. Returns the errors (already free of secrets), empty when all delivered."""
    if not alerts:
        return []
    return _each(notifiers, lambda n: n.send(alerts))


def send_notice_all(notifiers: Sequence[Notifier], notice: Notice) -> list[NotifyError]:
    """Send ``notice`` through every notifier; one failing channel does not stop the
    others. Returns the errors (already free of secrets), empty when all delivered."""
    return _each(notifiers, lambda n: n.send_notice(notice))


def _each(notifiers: Sequence[Notifier], deliver: Callable[[Notifier], None]) -> list[NotifyError]:
    errors: list[NotifyError] = []
    for n in notifiers:
        try:
            deliver(n)
        except NotifyError as exc:
            log.error("%s", exc)
            errors.append(exc)
    return errors

"""Generic webhook: one POST per alert, the alert's JSON as the body.

For receivers of your own (an incident tool, a CI hook). With a secret, each request
carries ``X-Farm-Signature-256: sha256=<hex HMAC-SHA256 of the body>``, the scheme
GitHub uses for its webhooks, so a receiver can check where the alert came from
(https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from farm.notify.alert import AlertRecord
from farm.notify.http import NotifyError, RetryPolicy, post_json

__all__ = [
    "SIGNATURE_HEADER",
    "WebhookError",
    "WebhookNotifier",
    "signature",
    "webhook_payload",
]

SIGNATURE_HEADER = "X-Farm-Signature-256"


class WebhookError(NotifyError):
    """The generic webhook refused or did not answer."""


def webhook_payload(alert: AlertRecord) -> dict[str, Any]:
    """The request body: the alert record as JSON."""
    return alert.model_dump(mode="json")


def signature(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``body`` keyed with ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class WebhookNotifier:
    """POSTs each alert to ``url`` (from ``FARM_NOTIFY_WEBHOOK_URL``), signed like
    https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    when ``secret`` (``FARM_NOTIFY_WEBHOOK_SECRET``) is set."""

    url: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        return "webhook"

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """POST every alert; raises WebhookError at the first one that fails."""
        secret = self.secret

        def sign(body: bytes) -> dict[str, str]:
            return {SIGNATURE_HEADER: signature(secret, body)} if secret else {}

        for alert in alerts:
            post_json(
                self.url,
                webhook_payload(alert),
                service="webhook",
                error=WebhookError,
                secrets=[secret] if secret else [],
                sign=sign,
                policy=self.policy,
                client=self.client,
                hint="check FARM_NOTIFY_WEBHOOK_URL and the receiver",
            )

"""Generic webhook: one POST per group of alerts of one cause, one POST per notice.

For receivers of your own (an incident tool, a CI hook). The bodies:

- the alerts of one cause (a night's alerts are grouped by the attribution's
  conjunction, else by check and metric: :func:`farm.results.alerts.cause_of`):
  ``{"type": "alerts", "cause": str, "headline": str, "alerts": [alert]}``, each alert
  the :class:`~farm.results.alerts.AlertRecord` as JSON (``id``, ``kind``, ``state``,
  ``severity``, ``summary``, ``details``, ``news``: what changed when an open alert is
  sent again, or that it recovered, ...). Before alerts were grouped, each alert was
  its own body, without a ``type`` key;
- a notice (:class:`~farm.notify.message.Notice`, e.g. a bisection's answer):
  ``{"type": "notice", "title": str, "level": "info" | "warning", "lines": [str],
  "footer": str, "link": str | null, "topic": str}`` (``topic`` names what it is
  about, e.g. ``"bisection:7"``). **Receivers tell the two apart by** ``type``:
  ``"alerts"`` or ``"notice"``.

Each request carries:

- ``Idempotency-Key``: the same for every attempt of one group of alerts in one state
  (and for a later pass that sends the same group again because another channel
  failed), or of
  one notice (the same words: a rerun that sends the same answer again), so the POST
  is retried after a timeout or a 5xx. **Receivers dedupe by it**: keep the keys of
  the last day and answer 2xx to a key already seen without acting again.
- with a secret (``FARM_NOTIFY_WEBHOOK_SECRET``), ``X-Farm-Timestamp`` (Unix seconds)
  and ``X-Farm-Signature-256: sha256=<hex HMAC-SHA256 of "<timestamp>." + body>``,
  GitHub's scheme
  (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries)
  with Stripe's signed timestamp
  (https://docs.stripe.com/webhooks#verify-manually) so a captured request cannot be
  replayed later. **Receivers check both** with :func:`verify_signature` (or its
  three lines in their own language): recompute the HMAC over the raw body, compare
  in constant time, and reject a timestamp more than 5 minutes off.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.message import Notice, headline
from farm.results.alerts import AlertRecord

__all__ = [
    "ALERTS_TYPE",
    "IDEMPOTENCY_HEADER",
    "NOTICE_TYPE",
    "SIGNATURE_HEADER",
    "SIGNATURE_TOLERANCE_S",
    "TIMESTAMP_HEADER",
    "WebhookError",
    "WebhookNotifier",
    "WebhookSignatureError",
    "idempotency_key",
    "notice_idempotency_key",
    "signature",
    "verify_signature",
    "webhook_notice_payload",
    "webhook_payload",
]

SIGNATURE_HEADER = "X-Farm-Signature-256"
TIMESTAMP_HEADER = "X-Farm-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Stripe's default: wide enough for clock skew and a retry's backoff, narrow enough that
# a captured request is useless soon after.
SIGNATURE_TOLERANCE_S = 300.0
NOTICE_TYPE = "notice"
"""The ``type`` of a notice's body."""
ALERTS_TYPE = "alerts"
"""The ``type`` of a body of alerts (one cause)."""


class WebhookError(NotifyError):
    """The generic webhook refused or did not answer."""


class WebhookSignatureError(ValueError):
    """A received webhook request is not one the farm signed just now; says why."""


def webhook_payload(alerts: Sequence[AlertRecord]) -> dict[str, Any]:
    """The request body of one group of alerts of one cause (module docstring)."""
    return {
        "type": ALERTS_TYPE,
        "cause": alerts[0].cause if alerts else "",
        "headline": headline(alerts) if alerts else "",
        "alerts": [a.model_dump(mode="json") for a in alerts],
    }


def idempotency_key(alerts: Sequence[AlertRecord]) -> str:
    """The same for one group of alerts each in one state: ids, states, last updates."""
    version = ";".join(
        f"{a.id}:{a.state}:{a.occurrences}:{a.updated_at.isoformat()}" for a in alerts
    )
    first = alerts[0].id if alerts else 0
    return f"mtp-farm-alerts-{first}-{hashlib.sha256(version.encode()).hexdigest()[:24]}"


def webhook_notice_payload(notice: Notice) -> dict[str, Any]:
    """The request body of a notice: ``{"type": "notice", ...the notice's fields}``."""
    return {"type": NOTICE_TYPE, **notice.model_dump(mode="json")}


def notice_idempotency_key(notice: Notice) -> str:
    """The same for the same notice: a hash of its words."""
    words = json.dumps(notice.model_dump(mode="json"), sort_keys=True)
    return f"mtp-farm-notice-{hashlib.sha256(words.encode()).hexdigest()[:24]}"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``b"<timestamp>." + body`` keyed with ``secret``."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
    now: float | None = None,
) -> None:
    """For receivers: check a request's signature and timestamp. Returns nothing when
    the farm signed exactly ``body`` within ``tolerance_s`` seconds of ``now``
    (default: the clock); raises WebhookSignatureError saying what is wrong otherwise.
    ``headers`` is looked up case-insensitively; ``body`` must be the raw bytes."""
    lower = {k.lower(): v for k, v in headers.items()}
    got_sig = lower.get(SIGNATURE_HEADER.lower())
    got_ts = lower.get(TIMESTAMP_HEADER.lower())
    if not got_sig or not got_ts:
        raise WebhookSignatureError(f"missing {SIGNATURE_HEADER} or {TIMESTAMP_HEADER}")
    try:
        timestamp = int(got_ts)
    except ValueError:
        raise WebhookSignatureError(f"{TIMESTAMP_HEADER} {got_ts!r} is not Unix seconds") from None
    skew = (time.time() if now is None else now) - timestamp
    if abs(skew) > tolerance_s:
        raise WebhookSignatureError(
            f"timestamp is {skew:+.0f} s off (more than {tolerance_s:g} s): a replay or a "
            "wrong clock"
        )
    if not hmac.compare_digest(got_sig, signature(secret, timestamp, body)):
        raise WebhookSignatureError("signature does not match the body and timestamp")


@dataclass(frozen=True)
class WebhookNotifier:
    """POSTs each alert or notice to ``url`` (from ``FARM_NOTIFY_WEBHOOK_URL``) with an
    idempotency key, signed with a timestamp when ``secret``
    (``FARM_NOTIFY_WEBHOOK_SECRET``) is set (module docstring)."""

    url: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The channel's name in logs and CLI output."""
        return "webhook"

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        """POST ``alerts`` (one group: :func:`farm.notify.delivery.deliver` sends each
        cause on its own) as one body; raises WebhookError."""
        if alerts:
            self._post(webhook_payload(alerts), idempotency_key(alerts))

    def send_notice(self, notice: Notice) -> None:
        """POST ``notice`` (``"type": "notice"``), signed and keyed as alerts are;
        raises WebhookError."""
        self._post(webhook_notice_payload(notice), notice_idempotency_key(notice))

    def _post(self, payload: dict[str, Any], key: str) -> None:
        secret = self.secret

        def sign(body: bytes) -> dict[str, str]:
            if not secret:
                return {}
            timestamp = int(self.clock())  # per attempt: a retry is signed afresh
            return {
                TIMESTAMP_HEADER: str(timestamp),
                SIGNATURE_HEADER: signature(secret, timestamp, body),
            }

        post_json(
            self.url,
            payload,
            service="webhook",
            error=WebhookError,
            secrets=[secret] if secret else [],
            headers={IDEMPOTENCY_HEADER: key},
            sign=sign,
            replay_safe=True,
            policy=self.policy,
            client=self.client,
            hint="check FARM_NOTIFY_WEBHOOK_URL and the receiver",
        )

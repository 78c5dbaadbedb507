"""POST JSON with a timeout and bounded retries, without ever showing a secret.

Shared by every notifier. A POST is retried only when retrying cannot post twice:

- always: failures before the request was sent (connection refused, connect
  timeout, no connection from the pool) and HTTP 429 (rate limited: the service says
  it did nothing; Slack and GitHub answer it with ``Retry-After``);
- for a *replay-safe* POST only (the receiver drops a repeat, e.g. by an idempotency
  key; or ``delivered`` can look up what an earlier attempt created): also HTTP 5xx and
  failures after the request may have reached the server (a read timeout, a
  dropped connection). Before such a retry ``delivered`` is asked first.

Slack, Feishu and WeCom webhooks offer no idempotency, so a read timeout there is
reported, not retried: a message posted twice is worse than one the error names.
Never retried: other 4xx answers, which mean the request itself is wrong (bad URL,
bad token, bad body) and would fail again.

Webhook URLs carry their credential in the path or query (Slack, Feishu, WeCom), so
a URL is shown only as ``scheme://host/***`` (:func:`farm.masking.mask_endpoint`); every
text that leaves this module - log records, exception messages - goes through
:func:`farm.masking.redact` first. httpx logs each
request's full URL at INFO on the ``httpx`` logger; a filter on that logger redacts
the secrets of a request while it is in flight.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from farm.errors import FarmError
from farm.inert import Untrusted, show_controls, untrusted
from farm.masking import mask_endpoint, redact

__all__ = [
    "NotifyError",
    "RetryPolicy",
    "answer_text",
    "check_http_url",
    "post_json",
]

# Raised before any byte of the request left: sending it again cannot post twice.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

log = logging.getLogger("farm.notify")

_RETRY_AFTER_CAP_S = 30.0
_BODY_EXCERPT = 300


class NotifyError(FarmError):
    """A notification (or comment) could not be delivered; the message names the
    service, the masked target and what to check. Never contains a secret."""


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts, backoff and timeout of one delivery.

    3 attempts with 1 s then 2 s between them ride out a restarting receiver or a
    load balancer's brief 502 without holding a nightly run for long; 10 s per
    request is well above a chat webhook's normal sub-second answer.
    """

    attempts: int = 3
    backoff_s: float = 1.0
    timeout_s: float = 10.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): exponential."""
        return float(self.backoff_s * 2 ** (attempt - 1))


def check_http_url(url: str, where: str, error: type[NotifyError], hint: str | None = None) -> None:
    """Raise ``error`` at once for a URL that is no http(s) URL with a host: retrying
    one cannot help (it is the setting that is wrong, not the network)."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:  # an unclosed "[", a bad port
        raise error(
            f"{where} {mask_endpoint(url)}: not a URL that parses, so not tried"
            + (f"; {hint}" if hint else "")
        ) from None
    if parts.scheme.lower() not in ("http", "https") or not hostname:
        shown = f"{parts.scheme}://..." if parts.scheme else "a URL without a scheme"
        raise error(
            f"{where} {shown}: not an http(s) URL with a host, so not tried"
            + (f"; {hint}" if hint else "")
        )


def answer_text(text: str, secrets: Sequence[str]) -> Untrusted:
    """A remote service's answer (a response body, its error message) as the farm
    holds it from where it is read: outside text, its secrets redacted and URL
    credentials masked, every control character but newline and tab shown escaped
    (``\\x1b``), so no failure line built from it can move a terminal's cursor."""
    return untrusted(show_controls(redact(text, secrets).strip(), "\n\t"))


class _RedactFilter(logging.Filter):
    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True


@contextmanager
def _redacting_httpx_logs(secrets: Sequence[str]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in ("httpx", "httpcore")]
    flt = _RedactFilter(secrets)
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(float(value), _RETRY_AFTER_CAP_S) if value is not None else None
    except ValueError:
        return None


def post_json(
    url: str,
    payload: Any,
    *,
    service: str,
    error: type[NotifyError],
    secrets: Sequence[str] = (),
    headers: dict[str, str] | None = None,
    policy: RetryPolicy | None = None,
    client: httpx.Client | None = None,
    check: Callable[[httpx.Response], str | None] | None = None,
    sign: Callable[[bytes], dict[str, str]] | None = None,
    hint: str = "",
    replay_safe: bool = False,
    delivered: Callable[[], httpx.Response | None] | None = None,
) -> httpx.Response:
    """POST ``payload`` as JSON to ``url``; return the 2xx response.

    ``check`` may inspect a 2xx answer and return an error text (services such as
    Feishu and WeCom answer HTTP 200 with an error code in the body); that is not
    retried. ``sign`` turns the exact body bytes into extra headers (an HMAC
    signature), once per attempt. ``replay_safe`` says the receiver drops a repeated
    request; ``delivered`` looks up whether an earlier attempt landed after all (its
    answer is returned instead of posting again). Without either, only failures that
    certainly did not reach the server are retried (module docstring). Raises
    ``error`` (a :class:`NotifyError`) naming ``service``, the masked URL and ``hint``
    after a 4xx, a refused 2xx, a failure that may have posted, or
    ``policy.attempts`` failures. ``url`` and ``secrets`` never appear in a log record
    or in the exception.
    """
    policy = policy or RetryPolicy()
    check_http_url(url, f"{service} POST", error, hint)
    request = _Request(
        url=url,
        secrets=[url, *secrets],
        body=json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(),
        headers={"Content-Type": "application/json; charset=utf-8", **(headers or {})},
        where=f"{service} POST {mask_endpoint(url)}",
        suffix=f"; {hint}" if hint else "",
        unsafe=(
            f"not retried: the request may have reached {service}, and it keeps no "
            "idempotency key, so a retry could post it twice"
        ),
        retry_all=replay_safe or delivered is not None,
        error=error,
        check=check,
        sign=sign,
    )
    own_client = client is None
    http = client or httpx.Client(timeout=policy.timeout_s)
    try:
        with _redacting_httpx_logs(request.secrets):
            return _deliver(http, request, policy, delivered)
    finally:
        if own_client:
            http.close()


@dataclass(frozen=True)
class _Request:
    """One delivery's fixed parts: what each attempt sends, and how its errors read.

    ``where`` is the masked target every message starts with, ``suffix`` the caller's
    hint, ``unsafe`` why a failure that may have posted is not retried, ``retry_all``
    whether such failures are retried anyway (replay-safe, or ``delivered`` given).
    """

    url: str
    secrets: list[str]
    body: bytes
    headers: dict[str, str]
    where: str
    suffix: str
    unsafe: str
    retry_all: bool
    error: type[NotifyError]
    check: Callable[[httpx.Response], str | None] | None
    sign: Callable[[bytes], dict[str, str]] | None

    def fail(self, text: str) -> NotifyError:
        """The caller's error for ``text``, naming the target and the hint."""
        return self.error(f"{self.where}: {text}{self.suffix}")


@dataclass(frozen=True)
class _Retry:
    """A failed attempt that may be tried again: why it failed, how long the service
    asked to wait (None: the policy's backoff), and whether it may have posted."""

    reason: str
    wait: float | None = None
    maybe_landed: bool = False


def _deliver(
    http: httpx.Client,
    request: _Request,
    policy: RetryPolicy,
    delivered: Callable[[], httpx.Response | None] | None,
) -> httpx.Response:
    """Up to ``policy.attempts`` attempts of ``request``; the 2xx response, or the
    caller's error naming the last failure."""
    reason = "no attempt made"
    maybe_landed = False
    for attempt in range(1, policy.attempts + 1):
        # Once an attempt may have posted, ask before posting again.
        if maybe_landed and delivered is not None:
            found = delivered()
            if found is not None:
                return found
        outcome = _attempt(http, request)
        if isinstance(outcome, httpx.Response):
            return outcome
        reason = outcome.reason
        maybe_landed = maybe_landed or outcome.maybe_landed
        if attempt < policy.attempts:
            delay = outcome.wait if outcome.wait is not None else policy.delay(attempt)
            log.warning(
                "%s: attempt %d/%d failed (%s); retrying in %.1f s",
                request.where,
                attempt,
                policy.attempts,
                reason,
                delay,
            )
            policy.sleep(delay)
    raise request.fail(f"failed after {policy.attempts} attempt(s): {reason}")


def _attempt(http: httpx.Client, request: _Request) -> httpx.Response | _Retry:
    """One POST: the accepted 2xx response, or a failure that may be retried; raises
    the caller's error for one that must not be."""
    headers = {**request.headers, **(request.sign(request.body) if request.sign else {})}
    try:
        response = http.post(request.url, content=request.body, headers=headers)
    except httpx.TransportError as exc:
        return _transport_failure(request, exc)
    return _answered(request, response)


def _transport_failure(request: _Request, exc: httpx.TransportError) -> _Retry:
    """A POST that got no answer: retried if it was never sent, or if posting twice
    is safe; otherwise the caller's error."""
    reason = f"{type(exc).__name__}: {answer_text(str(exc), request.secrets) or 'no detail'}"
    if isinstance(exc, _UNSENT):
        return _Retry(reason)
    if not request.retry_all:
        # Called while ``exc`` is handled: ``from None`` keeps its text (which may hold
        # a secret) out of the traceback.
        raise request.fail(f"{reason} ({request.unsafe})") from None
    return _Retry(reason, maybe_landed=True)


def _answered(request: _Request, response: httpx.Response) -> httpx.Response | _Retry:
    """The response if it is an accepted 2xx; a retryable failure for 429, or for
    other non-4xx statuses when posting twice is safe; otherwise the caller's error."""
    status = response.status_code
    excerpt = answer_text(response.text[:_BODY_EXCERPT], request.secrets)
    if 200 <= status < 300:
        refused = request.check(response) if request.check else None
        if refused is None:
            return response
        raise request.fail(f"refused: {answer_text(refused, request.secrets)}")
    reason = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
    if status == 429:
        # Rate limited: the service did nothing, so a retry cannot post twice.
        return _Retry(reason, wait=_retry_after(response))
    if 400 <= status < 500:
        raise request.fail(f"{reason} (not retried)")
    if not request.retry_all:
        raise request.fail(f"{reason} ({request.unsafe})")
    return _Retry(reason, maybe_landed=True)

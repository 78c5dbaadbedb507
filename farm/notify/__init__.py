"""Alerts as data, and the channels that deliver them (alerts, and notices: messages
that are not alerts, such as a bisection's answer).

Pure pieces: :mod:`farm.notify.alert` (typed alerts), :mod:`farm.notify.candidates`
(analysis results -> alert candidates) and :mod:`farm.notify.message` (the words of a
message; :class:`~farm.notify.message.Notice`). I/O pieces:
one small client per service, each with its own error class, all on
:func:`farm.notify.http.post_json` (timeouts, bounded retries, secrets masked).
URLs and secrets come from :class:`farm.settings.NotifySettings` (:data:`ENV_VARS`).
The check-alert-notify stage is :func:`farm.notify.pipeline.check_and_notify`
(imported from there: it needs the store, which imports this package).
"""

import importlib
from typing import TYPE_CHECKING, Any

from farm.notify.alert import (
    AlertCandidate,
    AlertDetails,
    AlertFigure,
    AlertKind,
    AlertRecord,
    AlertState,
    FigureInterval,
    Severity,
)

if TYPE_CHECKING:
    from farm.notify.candidates import alert_candidates_from_history, alert_candidates_from_report
    from farm.notify.feishu import FeishuError, FeishuNotifier
    from farm.notify.github import GitHubClient, GitHubError, PullRequestRef, parse_pr_ref
    from farm.notify.http import NotifyError, RetryPolicy, mask_url, redact
    from farm.notify.message import Notice, NoticeLevel
    from farm.notify.registry import (
        ENV_VARS,
        Notifier,
        configured_notifiers,
        send_all,
        send_notice_all,
    )
    from farm.notify.slack import SlackError, SlackNotifier
    from farm.notify.webhook import (
        WebhookError,
        WebhookNotifier,
        WebhookSignatureError,
        verify_signature,
    )
    from farm.notify.wecom import WeComError, WeComNotifier

# The channels and candidates are imported on first use (PEP 562): the store imports
# farm.notify.alert on every open, and must not pull in httpx and numpy with it
# (`farm sweeps` starts in under a second).
_LAZY = {
    "alert_candidates_from_history": "candidates",
    "alert_candidates_from_report": "candidates",
    "FeishuError": "feishu",
    "FeishuNotifier": "feishu",
    "GitHubClient": "github",
    "GitHubError": "github",
    "PullRequestRef": "github",
    "parse_pr_ref": "github",
    "NotifyError": "http",
    "RetryPolicy": "http",
    "mask_url": "http",
    "redact": "http",
    "Notice": "message",
    "NoticeLevel": "message",
    "ENV_VARS": "registry",
    "Notifier": "registry",
    "configured_notifiers": "registry",
    "send_all": "registry",
    "send_notice_all": "registry",
    "SlackError": "slack",
    "SlackNotifier": "slack",
    "WebhookError": "webhook",
    "WebhookNotifier": "webhook",
    "WebhookSignatureError": "webhook",
    "verify_signature": "webhook",
    "WeComError": "wecom",
    "WeComNotifier": "wecom",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ENV_VARS",
    "AlertCandidate",
    "AlertDetails",
    "AlertFigure",
    "AlertKind",
    "AlertRecord",
    "AlertState",
    "FeishuError",
    "FeishuNotifier",
    "FigureInterval",
    "GitHubClient",
    "GitHubError",
    "Notice",
    "NoticeLevel",
    "Notifier",
    "NotifyError",
    "PullRequestRef",
    "RetryPolicy",
    "Severity",
    "SlackError",
    "SlackNotifier",
    "WeComError",
    "WeComNotifier",
    "WebhookError",
    "WebhookNotifier",
    "WebhookSignatureError",
    "alert_candidates_from_history",
    "alert_candidates_from_report",
    "configured_notifiers",
    "mask_url",
    "parse_pr_ref",
    "redact",
    "send_all",
    "send_notice_all",
    "verify_signature",
]

"""Alerts as data, and the channels that deliver them (alerts, and notices: messages
that are not alerts, such as a bisection's answer).

Pure pieces: :mod:`farm.notify.message` (the words of a message;
:class:`~farm.notify.message.Notice`); alerts are typed in :mod:`farm.results.alerts`
and derived from findings by :mod:`farm.analysis.alert_rules`. I/O pieces:
one small client per service, each with its own error class, all on
:func:`farm.notify.http.post_json` (timeouts, bounded retries, secrets masked).
URLs and secrets come from :class:`farm.settings.NotifySettings` (:data:`ENV_VARS`).
Pending alerts are sent by :func:`farm.notify.delivery.send_pending`.
"""

from farm.notify.feishu import FeishuError, FeishuNotifier
from farm.notify.github import GitHubClient, GitHubError, PullRequestRef, parse_pr_ref
from farm.notify.http import NotifyError, RetryPolicy
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
from farm.results.alerts import (
    AlertCandidate,
    AlertDetails,
    AlertFigure,
    AlertKind,
    AlertRecord,
    AlertState,
    FigureInterval,
    Severity,
)

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
    "configured_notifiers",
    "parse_pr_ref",
    "send_all",
    "send_notice_all",
    "verify_signature",
]

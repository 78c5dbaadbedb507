"""Delivery of stored alerts: every pending alert to the configured channels, what
each channel did, and the words that say so.

The judging and raising is :func:`farm.workflows.alerts.steps.check_alerts` (``farm
alerts check``) and :func:`farm.workflows.nightly.steps.check_night` (``farm
nightly``); both send through :func:`send_pending`.

"sent 1 alert(s) to slack" must mean Slack took it. A delivery records, per channel,
whether it took the alerts; :func:`delivery_lines` is the one wording every command
prints (`farm alerts check`, `farm nightly`), so the same failure reads the same,
and :data:`EXIT_UNDELIVERED` the one exit status both give it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session

from farm.notify.http import NotifyError
from farm.notify.registry import Notifier, send_all
from farm.results.alerts import AlertRecord
from farm.store.alerts import mark_notified, pending_notifications

__all__ = ["EXIT_UNDELIVERED", "by_cause", "deliver", "delivery_lines", "send_pending"]

EXIT_UNDELIVERED = 4
"""Exit status of a command whose alerts a channel did not take (they stay pending).
It outranks a verdict's own status: a regression nobody was told of is the news."""


def send_pending(
    session: Session, channels: Sequence[Notifier]
) -> tuple[list[AlertRecord], list[str], list[NotifyError]]:
    """Send every alert not yet delivered (whichever check raised it) to ``channels``;
    marked delivered only when every channel took them. The alerts sent, the channels
    that took them and the other channels' errors."""
    pending = pending_notifications(session) if channels else []
    took, errors = deliver(channels, pending)
    if pending and not errors:
        mark_notified(session, [a.id for a in pending])
    return pending, took, errors


def by_cause(alerts: Sequence[AlertRecord]) -> list[list[AlertRecord]]:
    """``alerts`` grouped by cause (:func:`farm.results.alerts.cause_of`), in order."""
    groups: dict[str, list[AlertRecord]] = {}
    for alert in alerts:
        groups.setdefault(alert.cause, []).append(alert)
    return list(groups.values())


def deliver(
    channels: Sequence[Notifier], alerts: Sequence[AlertRecord]
) -> tuple[list[str], list[NotifyError]]:
    """Send ``alerts`` to each channel, one message per cause; (the channels that took
    them all, the errors of the others). One failing channel does not stop the rest."""
    took: list[str] = []
    errors: list[NotifyError] = []
    groups = by_cause(alerts)
    for channel in channels:
        failed = [e for group in groups for e in send_all([channel], group)]
        if failed:
            errors += failed
        elif alerts:
            took.append(channel.name)
    return took, errors


def delivery_lines(
    sent: int, delivered_to: Sequence[str], errors: Sequence[str]
) -> list[tuple[str, bool]]:
    """The lines that say what a delivery of ``sent`` alerts did, each with True when
    it is good news: the channels that took them, each failure, and what happens to
    the alerts then (they stay pending when any channel failed)."""
    lines: list[tuple[str, bool]] = []
    if sent and delivered_to:
        lines.append((f"sent {sent} alert(s) to {', '.join(delivered_to)}", True))
    for err in errors:
        lines.append((f"notification failed: {err}", False))
    if sent and errors:
        lines.append(
            (
                f"{sent} alert(s) not delivered to every channel: they stay pending; the next "
                "`farm alerts check` (or `farm nightly`) sends them again",
                False,
            )
        )
    return lines

"""Notices (messages that are not alerts) through every channel, against a real HTTP
receiver on 127.0.0.1: each service's format and limits, signatures, one failing
channel not stopping the others, masked secrets; and a bisection's answer as a notice."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging

import pytest
from pydantic import ValidationError

from farm.notify import (
    FeishuNotifier,
    Notice,
    Notifier,
    RetryPolicy,
    SlackError,
    SlackNotifier,
    WebhookNotifier,
    WeComError,
    WeComNotifier,
    send_notice_all,
    verify_signature,
)
from farm.notify.feishu import feishu_sign
from farm.notify.webhook import IDEMPOTENCY_HEADER, NOTICE_TYPE, TIMESTAMP_HEADER
from farm.report.notice import bisection_notice
from farm.workflows.bisect.decide import (
    BisectStep,
)
from tests.fakes.receiver import Receiver
from tests.support.alerts import FEISHU_SECRET, SLACK_TOKEN, alert_record
from tests.support.bisection import bisection

WEBHOOK_SECRET = "wh-hmac-secret-42"
WECOM_KEY = "wecom-key-0123456789"
NOW = 1767225600.0


def _policy() -> RetryPolicy:
    return RetryPolicy(attempts=3, backoff_s=1.0, timeout_s=5.0, sleep=lambda _s: None)


def _notice(lines: int = 3, line: str = "AL fell <sharply> & fast") -> Notice:
    return Notice(
        title="mtp-farm bisection 7 (nightly / vllm-cpu): first bad commit 0123456789ab",
        level="warning",
        lines=tuple(f"{i}: {line}" for i in range(lines)),
        footer="`farm report --bisection 7` shows every step",
        link="https://github.com/acme/plugin/commit/0123456789abcdef",
        topic="bisection:7",
    )


# --- the notice ----------------------------------------------------------------------


def test_a_notice_is_one_titled_line_with_a_plain_http_link() -> None:
    assert Notice(title="  two\n lines ").title == "two lines"
    for bad in ("javascript:alert(1)", "https://x/a b", "https://x/<script>", "https://x/a|b"):
        with pytest.raises(ValidationError, match="http"):
            Notice(title="t", link=bad)
    with pytest.raises(ValidationError, match="title"):
        Notice(title=" \n ")
    with pytest.raises(ValidationError):
        Notice(title="t", level="critical")  # type: ignore[arg-type]


# --- each channel --------------------------------------------------------------------


def test_webhook_notice_is_typed_signed_and_keyed_like_alerts(receiver: Receiver) -> None:
    notifier = WebhookNotifier(
        receiver.url("/hook"), secret=WEBHOOK_SECRET, policy=_policy(), clock=lambda: NOW
    )
    notifier.send_notice(_notice())
    notifier.send_notice(_notice())  # the same notice again (a rerun)
    notifier.send([alert_record()])
    first, again, alert = receiver.requests
    body = first.json()
    assert body == {"type": NOTICE_TYPE, **_notice().model_dump(mode="json")}
    assert body["type"] == "notice" and body["level"] == "warning"
    assert body["lines"][0] == "0: AL fell <sharply> & fast"  # JSON: nothing escaped
    assert alert.json()["type"] == "alerts"  # receivers tell the two apart by type
    assert alert.json()["alerts"][0]["kind"] == "graph_vs_eager"
    verify_signature(WEBHOOK_SECRET, first.body, first.headers, now=NOW + 60)
    assert first.headers[TIMESTAMP_HEADER] == str(int(NOW))
    key = first.headers[IDEMPOTENCY_HEADER]
    assert key.startswith("mtp-farm-notice-") and again.headers[IDEMPOTENCY_HEADER] == key
    assert alert.headers[IDEMPOTENCY_HEADER] != key
    assert WEBHOOK_SECRET.encode() not in first.body


def test_slack_notice_has_a_header_escaped_sections_and_a_context(receiver: Receiver) -> None:
    SlackNotifier(receiver.url("/services/T0/B0/" + SLACK_TOKEN), policy=_policy()).send_notice(
        _notice()
    )
    body = receiver.requests[0].json()
    assert set(body) == {"text", "blocks"} and body["text"] == _notice().title
    assert [b["type"] for b in body["blocks"]] == ["header", "section", "context"]
    assert body["blocks"][0]["text"] == {"type": "plain_text", "text": _notice().title}
    section = body["blocks"][1]["text"]
    assert section["type"] == "mrkdwn"
    assert section["text"].splitlines()[0] == "0: AL fell &lt;sharply&gt; &amp; fast"
    [context] = body["blocks"][2]["elements"]
    assert context["text"] == (
        ":large_orange_circle: warning | `farm report --bisection 7` shows every step | "
        "<https://github.com/acme/plugin/commit/0123456789abcdef|open>"
    )


def test_slack_notice_stays_within_slacks_limits(receiver: Receiver) -> None:
    huge = Notice(title="t" * 400, lines=("y" * 5000, *("x" * 120 for _ in range(3000))))
    SlackNotifier(receiver.url("/s"), policy=_policy()).send_notice(huge)
    blocks = receiver.requests[0].json()["blocks"]
    assert len(blocks) == 50  # header, 48 sections, context
    assert len(blocks[0]["text"]["text"]) == 150
    assert blocks[1]["text"]["text"] == "y" * 3000  # a line too long for a section is cut
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")
    assert blocks[-1]["elements"][0]["text"] == ":large_blue_circle: info"


def test_feishu_notice_card_and_text_are_signed_as_alerts_are(receiver: Receiver) -> None:
    ok = '{"code":0,"msg":"success"}'
    receiver.answer((200, ok), (200, ok))
    url = receiver.url("/open-apis/bot/v2/hook/abc-123-hook")
    for msg_type in ("interactive", "text"):
        FeishuNotifier(
            url, secret=FEISHU_SECRET, msg_type=msg_type, policy=_policy(), clock=lambda: NOW
        ).send_notice(_notice())
    card, text = (r.json() for r in receiver.requests)
    for body in (card, text):
        assert body["timestamp"] == str(int(NOW))
        key = f"{int(NOW)}\n{FEISHU_SECRET}".encode()
        expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
        assert body["sign"] == expected == feishu_sign(int(NOW), FEISHU_SECRET)
    assert card["msg_type"] == "interactive"
    header = card["card"]["header"]
    assert header == {
        "template": "orange",
        "title": {"tag": "plain_text", "content": _notice().title},
    }
    markdown, note = card["card"]["elements"]
    assert markdown["tag"] == "markdown"
    assert "0: AL fell &lt;sharply&gt; &amp; fast" in markdown["content"]
    assert markdown["content"].endswith("(https://github.com/acme/plugin/commit/0123456789abcdef)")
    assert note["elements"][0]["content"] == "`farm report --bisection 7` shows every step"
    assert text["msg_type"] == "text"
    # Feishu text messages read <at ...> as a mention: angle brackets become fullwidth.
    shown = _notice().title + "\n\n0: AL fell \uff1csharply\uff1e & fast"
    assert text["content"]["text"].startswith(shown)
    assert all(FEISHU_SECRET not in r.body.decode() for r in receiver.requests)


def test_wecom_notice_fits_4096_bytes_and_keeps_its_footer(receiver: Receiver) -> None:
    receiver.answer((200, '{"errcode":0,"errmsg":"ok"}'))
    long = _notice(lines=200, line="回归 " * 30)
    WeComNotifier(
        receiver.url(f"/cgi-bin/webhook/send?key={WECOM_KEY}"), policy=_policy()
    ).send_notice(long)
    body = receiver.requests[0].json()
    assert body["msgtype"] == "markdown"
    content = body["markdown"]["content"]
    assert len(content.encode()) <= 4096
    assert content.startswith(f'## {long.title}\n<font color="warning">warning</font>\n\n> 0: ')
    assert " ...\n\n`farm report --bisection 7` shows every step\n[https://" in content
    assert content.endswith("(https://github.com/acme/plugin/commit/0123456789abcdef)")

    receiver.answer((200, '{"errcode":93000,"errmsg":"invalid webhook url"}'))
    with pytest.raises(WeComError, match="errcode 93000") as info:
        WeComNotifier(receiver.url(f"/send?key={WECOM_KEY}"), policy=_policy()).send_notice(
            _notice()
        )
    assert WECOM_KEY not in str(info.value)


# --- all channels ---------------------------------------------------------------------


def test_a_failing_channel_does_not_stop_the_others_and_shows_no_secret(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    receiver.answer(
        (200, "ok"),  # webhook
        (404, f"no_service {SLACK_TOKEN}"),  # slack: refused, echoing its URL's token
        (200, '{"code":0}'),  # feishu
        (200, '{"errcode":0}'),  # wecom
    )
    notifiers: list[Notifier] = [
        WebhookNotifier(receiver.url("/hook"), secret=WEBHOOK_SECRET, policy=_policy()),
        SlackNotifier(receiver.url("/services/T0/B0/" + SLACK_TOKEN), policy=_policy()),
        FeishuNotifier(receiver.url("/feishu"), secret=FEISHU_SECRET, policy=_policy()),
        WeComNotifier(receiver.url(f"/wecom?key={WECOM_KEY}"), policy=_policy()),
    ]
    errors = send_notice_all(notifiers, _notice())
    paths = [r.path.split("/")[1].split("?")[0] for r in receiver.requests]
    assert paths == ["hook", "services", "feishu", "wecom"]
    [error] = errors
    assert isinstance(error, SlackError) and "HTTP 404" in str(error)
    text = "\n".join([str(error), repr(error), caplog.text])
    for secret in (SLACK_TOKEN, WEBHOOK_SECRET, FEISHU_SECRET, WECOM_KEY):
        assert secret not in text
    assert send_notice_all([], _notice()) == []


# --- a bisection's answer -------------------------------------------------------------


def test_a_found_bisection_names_the_culprit_as_a_warning() -> None:
    steps = (
        BisectStep(position=4, commit="4" * 40, verdict="good"),
        BisectStep(position=6, commit="6" * 40, verdict="bad"),
        BisectStep(position=5, commit="5" * 40, verdict="skip", reason="build_failed"),
    )
    b = bisection(status="found", first_bad=6, last_good=4, steps=steps)
    n = bisection_notice(b)
    assert n.level == "warning" and n.topic == "bisection:7"
    assert n.title == (
        "mtp-farm bisection 7 (bisect-fake / vllm-cpu): first bad commit 666666666666 (PR #106)"
    )
    assert n.lines[0] == b.headline()
    assert n.lines[0] == (
        "first bad commit: 666666666666 change 6 (#106); last good: 444444444444 change 4 (#104)"
    )
    assert n.lines[1] == "pull request: #106"
    assert n.lines[2] == (
        "searched: 8 first-parent commits of farm-bisect-fake "
        "(https://github.com/acme/plugin.git) from 000000000000 to 888888888888 "
        "(job bisect-fake, engine vllm-cpu)"
    )
    assert n.lines[3] == (
        "regressed: tiny-mtp eager mtp3 swa-on: AL 2.900 [2.800, 3.000] at the good end, "
        "2.100 [2.000, 2.200] at the bad end (-27.6%)"
    )
    assert n.lines[4] == "cost: 3 step(s) (1 skipped), 5 build(s), 7 cell(s), 93 s wall"
    assert n.footer == "`farm report --bisection 7` shows every step"
    assert n.link == f"https://github.com/acme/plugin/commit/{'6' * 40}"


def test_an_inconclusive_bisection_gives_the_reason_as_info() -> None:
    reason = "the first bad commit is one of 2 commits: 1 skipped (could not be built or run)"
    b = bisection(
        status="inconclusive",
        first_bad=5,
        last_good=3,
        reason=reason,
        repo="/srv/git/plugin",
        steps=(BisectStep(position=4, commit="4" * 40, verdict="skip", reason="build_failed"),),
    )
    n = bisection_notice(b)
    assert n.level == "info" and n.link is None
    assert n.title == "mtp-farm bisection 7 (bisect-fake / vllm-cpu): inconclusive"
    assert n.lines[:3] == (
        f"inconclusive: {reason}",
        "candidate: 444444444444 change 4 (#104)",
        "candidate: 555555555555 change 5 (#105)",
    )
    assert "pull request" not in json.dumps(n.lines)
    assert n.lines[-1] == "cost: 1 step(s) (1 skipped), 5 build(s), 7 cell(s), 93 s wall"

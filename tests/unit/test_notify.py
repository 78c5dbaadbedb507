"""Notifiers against a real HTTP receiver on 127.0.0.1: formats, retries, masked secrets,
and no message posted twice by a retry."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from farm.masking import mask_endpoint, redact
from farm.notify import (
    FeishuError,
    FeishuNotifier,
    GitHubClient,
    GitHubError,
    Notifier,
    NotifyError,
    RetryPolicy,
    SlackError,
    SlackNotifier,
    WebhookNotifier,
    WeComError,
    WeComNotifier,
    configured_notifiers,
    parse_pr_ref,
    send_all,
)
from farm.notify.feishu import feishu_sign
from farm.notify.registry import ENV_VARS
from farm.notify.webhook import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookError,
    WebhookSignatureError,
    signature,
    verify_signature,
)
from farm.settings import NotifySettings
from tests.fakes.receiver import HANG_LIMIT_S, Receiver, serving
from tests.support.alerts import FEISHU_SECRET, SLACK_TOKEN, alert_record

GITHUB_TOKEN = "ghp_TOPSECRETtoken1234567890"
# The client's read timeout where a hung answer must make it give up; the requests that
# follow must answer within it on a machine loaded by the engine tests (0.5 s did not).
GIVE_UP_S = 2.0


@dataclass
class FakeSleep:
    calls: list[float] = field(default_factory=list)

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def _policy(sleep: FakeSleep | None = None, timeout_s: float = 5.0) -> RetryPolicy:
    return RetryPolicy(attempts=3, backoff_s=1.0, timeout_s=timeout_s, sleep=sleep or FakeSleep())


# --- test data ---------------------------------------------------------------------------


# --- formats -----------------------------------------------------------------------------


def test_generic_webhook_posts_a_group_of_alerts_as_json_with_a_valid_signature(
    receiver: Receiver,
) -> None:
    alerts = [alert_record(1), alert_record(2, severity="warning")]
    notifier = WebhookNotifier(
        receiver.url("/hook"), secret="s3cr3t-hmac", policy=_policy(), clock=lambda: 1767225600.4
    )
    notifier.send(alerts)
    notifier.send(alerts[1:])
    assert [r.path for r in receiver.requests] == ["/hook", "/hook"]  # one POST a group
    first = receiver.requests[0]
    body = first.json()
    assert body["type"] == "alerts" and body["cause"] == alerts[0].cause
    assert body["alerts"] == [json.loads(a.model_dump_json()) for a in alerts]
    assert body["headline"].startswith("mtp-farm: 2 alerts in sweep 12")
    assert first.headers["Content-Type"].startswith("application/json")
    # The signature covers "<timestamp>." + body, so the timestamp cannot be swapped.
    assert first.headers[TIMESTAMP_HEADER] == "1767225600"
    signed = b"1767225600." + first.body
    expected = "sha256=" + hmac.new(b"s3cr3t-hmac", signed, hashlib.sha256).hexdigest()
    assert first.headers[SIGNATURE_HEADER] == expected
    assert expected == signature("s3cr3t-hmac", 1767225600, first.body)
    verify_signature("s3cr3t-hmac", first.body, first.headers, now=1767225600 + 60)
    assert b"s3cr3t-hmac" not in first.body
    # One key per group, kept by a retry: what receivers dedupe by.
    keys = [r.headers[IDEMPOTENCY_HEADER] for r in receiver.requests]
    assert len(set(keys)) == 2 and all(k.startswith("mtp-farm-alerts-") for k in keys)


def test_webhook_signature_cannot_be_replayed_or_moved(receiver: Receiver) -> None:
    """Before: the HMAC covered the body only, so a captured request could be sent again
    at any later time and still verify."""
    WebhookNotifier(
        receiver.url("/hook"), secret="s3cr3t-hmac", policy=_policy(), clock=lambda: 1767225600
    ).send([alert_record()])
    [req] = receiver.requests
    verify_signature("s3cr3t-hmac", req.body, req.headers, now=1767225600 + 299)
    with pytest.raises(WebhookSignatureError, match=r"off .*a replay"):
        verify_signature("s3cr3t-hmac", req.body, req.headers, now=1767225600 + 3600)
    moved = {**req.headers, TIMESTAMP_HEADER: str(1767225600 + 3600)}
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify_signature("s3cr3t-hmac", req.body, moved, now=1767225600 + 3600)
    with pytest.raises(WebhookSignatureError, match="does not match"):
        verify_signature("s3cr3t-hmac", req.body + b" ", req.headers, now=1767225600)
    with pytest.raises(WebhookSignatureError, match="missing"):
        verify_signature("s3cr3t-hmac", req.body, {}, now=1767225600)


def test_slack_message_has_text_and_blocks_with_escaped_mrkdwn(receiver: Receiver) -> None:
    SlackNotifier(receiver.url("/services/T0/B0/" + SLACK_TOKEN), policy=_policy()).send(
        [alert_record(1), alert_record(2, severity="warning")]
    )
    [req] = receiver.requests
    body = req.json()
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith("mtp-farm: 2 alerts in sweep 12, 1 critical")
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds == ["header", "section", "section", "context"]
    assert body["blocks"][0]["text"] == {
        "type": "plain_text",
        "text": "mtp-farm: 2 alerts in sweep 12, 1 critical",
    }
    section = body["blocks"][1]["text"]
    assert section["type"] == "mrkdwn"
    assert "*#1 critical graph_vs_eager AL: ascend-main(vllm-ascend)" in section["text"]
    assert "AL 2.510 [2.400, 2.600] vs 2.900 [2.760, 3.030]: -0.400" in section["text"]
    assert "explained by: graph_mode=full_decode_only AND mtp_depth&gt;=2" in section["text"]


def test_slack_caps_a_long_batch(receiver: Receiver) -> None:
    SlackNotifier(receiver.url("/s"), policy=_policy()).send([alert_record(i) for i in range(25)])
    body = receiver.requests[0].json()
    assert len(body["blocks"]) == 12  # header, 10 alerts, context
    assert body["blocks"][-1]["elements"][0]["text"].startswith("and 15 more")


def test_feishu_interactive_card_is_signed_per_feishu_docs(receiver: Receiver) -> None:
    receiver.answer((200, '{"code":0,"msg":"success","data":{}}'))
    notifier = FeishuNotifier(
        receiver.url("/open-apis/bot/v2/hook/abc-123-hook"),
        secret=FEISHU_SECRET,
        policy=_policy(),
        clock=lambda: 1599360473.7,
    )
    notifier.send([alert_record(3)])
    body = receiver.requests[0].json()
    assert body["timestamp"] == "1599360473"
    # timestamp + "\n" + secret is the HMAC-SHA256 key of an empty message, base64.
    key = f"1599360473\n{FEISHU_SECRET}".encode()
    assert body["sign"] == base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    assert body["sign"] == feishu_sign(1599360473, FEISHU_SECRET)
    assert body["msg_type"] == "interactive"
    card = body["card"]
    assert card["header"]["template"] == "red"
    assert card["header"]["title"] == {
        "tag": "plain_text",
        "content": "mtp-farm: 1 alert in sweep 12, 1 critical",
    }
    markdown = card["elements"][0]
    assert markdown["tag"] == "markdown" and "&lt;sharply&gt;" not in markdown["content"]
    assert "mtp_depth&gt;=2" in markdown["content"]
    assert FEISHU_SECRET not in receiver.requests[0].body.decode()


def test_feishu_text_message_unsigned(receiver: Receiver) -> None:
    receiver.answer((200, '{"code":0,"msg":"success"}'))
    FeishuNotifier(receiver.url("/hook/x"), msg_type="text", policy=_policy()).send(
        [alert_record()]
    )
    body = receiver.requests[0].json()
    assert set(body) == {"msg_type", "content"}
    assert body["msg_type"] == "text"
    assert body["content"]["text"].startswith("mtp-farm: 1 alert in sweep 12")
    assert "[critical] #7 critical graph_vs_eager AL" in body["content"]["text"]


def test_feishu_error_code_in_a_200_answer_is_refused_not_retried(receiver: Receiver) -> None:
    receiver.answer(
        (200, '{"code":19021,"msg":"sign match fail or timestamp is not within one hour"}')
    )
    sleep = FakeSleep()
    notifier = FeishuNotifier(
        receiver.url("/open-apis/bot/v2/hook/hook-id-SECRETPART"),
        secret=FEISHU_SECRET,
        policy=_policy(sleep),
    )
    with pytest.raises(FeishuError, match="code 19021: sign match fail") as info:
        notifier.send([alert_record()])
    assert len(receiver.requests) == 1 and sleep.calls == []
    assert "hook-id-SECRETPART" not in str(info.value)
    assert FEISHU_SECRET not in str(info.value)


def test_wecom_markdown_fits_4096_bytes_and_errcode_is_an_error(receiver: Receiver) -> None:
    receiver.answer((200, '{"errcode":0,"errmsg":"ok"}'))
    long = "涨落" * 400
    WeComNotifier(receiver.url("/cgi-bin/webhook/send?key=wecom-key-123"), policy=_policy()).send(
        [alert_record(i, summary=long) for i in range(12)]
    )
    req = receiver.requests[0]
    assert req.path == "/cgi-bin/webhook/send?key=wecom-key-123"
    body = req.json()
    assert body["msgtype"] == "markdown"
    content = body["markdown"]["content"]
    assert content.startswith("## mtp-farm: 12 alerts in sweep 12, 12 critical")
    assert '<font color="warning">**#0 critical' in content
    assert len(content.encode()) <= 4096

    receiver.answer((200, '{"errcode":93000,"errmsg":"invalid webhook url"}'))
    with pytest.raises(WeComError, match="errcode 93000: invalid webhook url") as info:
        WeComNotifier(receiver.url("/send?key=wecom-key-123"), policy=_policy()).send(
            [alert_record()]
        )
    assert "wecom-key-123" not in str(info.value)


# --- retries -----------------------------------------------------------------------------


def test_retries_on_500_then_succeeds_with_backoff(receiver: Receiver) -> None:
    receiver.answer((500, "boom"), (503, "busy"), (200, "ok"))
    sleep = FakeSleep()
    WebhookNotifier(receiver.url("/w/" + SLACK_TOKEN), policy=_policy(sleep)).send([alert_record()])
    assert len(receiver.requests) == 3
    assert sleep.calls == [1.0, 2.0]
    assert receiver.requests[0].body == receiver.requests[2].body
    keys = {r.headers[IDEMPOTENCY_HEADER] for r in receiver.requests}
    assert len(keys) == 1  # the receiver sees one delivery, three times


def test_gives_up_after_the_attempts_with_the_last_reason(receiver: Receiver) -> None:
    receiver.answer((500, "e1"), (502, "e2"), (500, "still broken"))
    with pytest.raises(WebhookError, match=r"failed after 3 attempt\(s\): HTTP 500: still broken"):
        WebhookNotifier(receiver.url("/w"), policy=_policy()).send([alert_record()])
    assert len(receiver.requests) == 3


def test_a_webhook_post_that_timed_out_is_retried_with_the_same_key(receiver: Receiver) -> None:
    receiver.hangs = 1  # the first answer comes after the client gave up
    WebhookNotifier(receiver.url("/w"), policy=_policy(timeout_s=GIVE_UP_S)).send([alert_record()])
    assert len(receiver.requests) == 2
    assert len({r.headers[IDEMPOTENCY_HEADER] for r in receiver.requests}) == 1


def _chat_notifiers(receiver: Receiver, timeout_s: float = 5.0) -> list[Notifier]:
    policy = _policy(timeout_s=timeout_s)
    return [
        SlackNotifier(receiver.url("/slack/" + SLACK_TOKEN), policy=policy),
        FeishuNotifier(receiver.url("/feishu"), secret=FEISHU_SECRET, policy=policy),
        WeComNotifier(receiver.url("/wecom?key=wecom-key-123"), policy=policy),
    ]


def test_chat_posts_are_not_retried_after_a_read_timeout(receiver: Receiver) -> None:
    """Before: a read timeout was retried, and Slack (no idempotency key) showed the
    message twice when the first POST had landed after all."""
    for notifier in _chat_notifiers(receiver, timeout_s=GIVE_UP_S):
        receiver.requests.clear()
        receiver.hangs = 1
        with pytest.raises(NotifyError, match=r"ReadTimeout.*may have reached") as info:
            notifier.send([alert_record()])
        assert len(receiver.requests) == 1, notifier.name
        assert "not retried" in str(info.value)
        assert SLACK_TOKEN not in str(info.value) and "wecom-key-123" not in str(info.value)


def test_chat_posts_are_not_retried_after_a_5xx_but_are_after_429(receiver: Receiver) -> None:
    for notifier in _chat_notifiers(receiver):
        receiver.requests.clear()
        receiver.answer((502, "bad gateway"))
        with pytest.raises(NotifyError, match=r"HTTP 502: bad gateway .*not retried"):
            notifier.send([alert_record()])
        assert len(receiver.requests) == 1, notifier.name
        ok = '{"code":0,"errcode":0}'
        receiver.answer((429, "slow down", {"Retry-After": "1"}), (200, ok))
        notifier.send([alert_record()])
        assert len(receiver.requests) == 3, notifier.name


def test_no_retry_on_400(receiver: Receiver) -> None:
    receiver.answer((400, "invalid_payload"))
    sleep = FakeSleep()
    with pytest.raises(SlackError, match=r"HTTP 400: invalid_payload \(not retried\)"):
        SlackNotifier(receiver.url("/s/" + SLACK_TOKEN), policy=_policy(sleep)).send(
            [alert_record()]
        )
    assert len(receiver.requests) == 1 and sleep.calls == []


def test_429_waits_as_told_by_retry_after(receiver: Receiver) -> None:
    receiver.answer((429, "rate_limited", {"Retry-After": "3"}), (200, "ok"))
    sleep = FakeSleep()
    SlackNotifier(receiver.url("/s"), policy=_policy(sleep)).send([alert_record()])
    assert len(receiver.requests) == 2 and sleep.calls == [3.0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_errors_are_retried_then_reported_masked() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/services/T0/B0/{SLACK_TOKEN}"
    sleep = FakeSleep()
    with pytest.raises(SlackError, match=r"failed after 3 attempt\(s\): ConnectError") as info:
        SlackNotifier(url, policy=_policy(sleep)).send([alert_record()])
    assert sleep.calls == [1.0, 2.0]
    assert SLACK_TOKEN not in str(info.value)
    assert "http://127.0.0.1:" in str(info.value) and "/***" in str(info.value)


# --- secrets -----------------------------------------------------------------------------


def _all_text(exc: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    records = "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {r.msg!r}" for r in caplog.records)
    return "\n".join(
        [str(exc), repr(exc), "".join(traceback.format_exception(exc)), caplog.text, records]
    )


def test_secrets_never_reach_logs_or_exceptions(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # httpx logs every request URL at INFO
    receiver.answer(
        (429, f"echo {SLACK_TOKEN}"), (429, "again"), (500, f"and {FEISHU_SECRET} again")
    )
    with pytest.raises(FeishuError) as info:
        FeishuNotifier(
            receiver.url(f"/open-apis/bot/v2/hook/{SLACK_TOKEN}"),
            secret=FEISHU_SECRET,
            policy=_policy(),
        ).send([alert_record()])
    text = _all_text(info.value, caplog)
    assert "attempt 1/3 failed" in text  # the retries were logged ...
    assert "HTTP Request: POST" in text  # ... and so were httpx's request lines
    assert SLACK_TOKEN not in text and FEISHU_SECRET not in text


def test_github_token_is_masked_and_401_not_retried(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    receiver.answer((401, f'{{"message":"Bad credentials {GITHUB_TOKEN}"}}'))
    client = GitHubClient(token=GITHUB_TOKEN, api_url=receiver.url(""), policy=_policy())
    with pytest.raises(GitHubError, match="HTTP 401") as info:
        client.post_issue_comment(parse_pr_ref("octo/farm#5"), "hello")
    assert len(receiver.requests) == 1
    assert GITHUB_TOKEN not in _all_text(info.value, caplog)
    assert GITHUB_TOKEN not in repr(client)


def _from_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> list[Notifier]:
    """The notifiers configured by exactly ``env`` among the FARM_NOTIFY_* variables."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return configured_notifiers()


def test_notifier_reprs_hide_urls_and_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    notifiers = _from_env(
        monkeypatch,
        {
            "FARM_NOTIFY_WEBHOOK_URL": "https://hooks.example/abc/" + SLACK_TOKEN,
            "FARM_NOTIFY_WEBHOOK_SECRET": "wh-secret-123",
            "FARM_NOTIFY_SLACK_URL": "https://hooks.slack.com/services/T/B/" + SLACK_TOKEN,
            "FARM_NOTIFY_FEISHU_URL": "https://open.feishu.cn/open-apis/bot/v2/hook/" + SLACK_TOKEN,
            "FARM_NOTIFY_FEISHU_SECRET": FEISHU_SECRET,
            "FARM_NOTIFY_WECOM_URL": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k-1",
        },
    )
    assert [n.name for n in notifiers] == ["webhook", "slack", "feishu", "wecom"]
    text = repr(notifiers)
    for secret in (SLACK_TOKEN, "wh-secret-123", FEISHU_SECRET, "k-1"):
        assert secret not in text


def test_mask_and_redact() -> None:
    url = f"https://hooks.slack.com/services/T0/B0/{SLACK_TOKEN}?x=1"
    assert mask_endpoint(url) == "https://hooks.slack.com/***"
    assert mask_endpoint("not a url") == "***"
    assert redact(f"GET {url} failed", [url]) == "GET *** failed"
    assert SLACK_TOKEN not in redact(f"token {SLACK_TOKEN} in path", [url])
    wecom = "https://q.example/send?key=k-123456789&debug=1"
    assert redact("POST /send?key=k-123456789&debug=1", [wecom]) == "POST /send?***"
    assert redact("key k-123456789 leaked; debug=1", [wecom]) == "key *** leaked; debug=1"


# --- configuration and fan-out -----------------------------------------------------------


def test_configured_notifiers_read_only_what_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _from_env(monkeypatch, {}) == []
    assert _from_env(monkeypatch, {"FARM_NOTIFY_SLACK_URL": ""}) == []  # empty is unset
    [feishu] = _from_env(
        monkeypatch,
        {"FARM_NOTIFY_FEISHU_URL": "https://x/hook", "FARM_NOTIFY_FEISHU_FORMAT": "text"},
    )
    assert isinstance(feishu, FeishuNotifier) and feishu.msg_type == "text"
    with pytest.raises(NotifyError, match="FARM_NOTIFY_FEISHU_FORMAT='card'"):
        _from_env(
            monkeypatch,
            {"FARM_NOTIFY_FEISHU_URL": "https://x/h", "FARM_NOTIFY_FEISHU_FORMAT": "card"},
        )


def test_configured_notifiers_take_settings_built_in_code() -> None:
    settings = NotifySettings(slack_url="https://hooks.slack.com/services/T/B/" + SLACK_TOKEN)
    [slack] = configured_notifiers(settings)
    assert isinstance(slack, SlackNotifier)
    assert SLACK_TOKEN not in repr(settings) and SLACK_TOKEN not in str(settings)


def test_send_all_keeps_going_past_a_failing_channel(receiver: Receiver) -> None:
    receiver.answer((404, "no_service"), (200, '{"errcode":0,"errmsg":"ok"}'))
    notifiers: list[Notifier] = [
        SlackNotifier(receiver.url("/slack"), policy=_policy()),
        WeComNotifier(receiver.url("/wecom"), policy=_policy()),
    ]
    errors = send_all(notifiers, [alert_record()])
    assert [r.path for r in receiver.requests] == ["/slack", "/wecom"]
    assert len(errors) == 1 and isinstance(errors[0], SlackError)
    assert send_all(notifiers, []) == []
    assert len(receiver.requests) == 2


def test_github_comment_goes_to_the_issue_comments_endpoint(receiver: Receiver) -> None:
    receiver.answer((201, '{"id":1,"html_url":"https://github.com/octo/farm/pull/5#c1"}'))
    client = GitHubClient(token=GITHUB_TOKEN, api_url=receiver.url("/api/"), policy=_policy())
    url = client.post_issue_comment(parse_pr_ref("octo/farm#5"), "### report\n| a |")
    assert url == "https://github.com/octo/farm/pull/5#c1"
    [req] = receiver.requests
    assert req.path == "/api/repos/octo/farm/issues/5/comments"
    assert req.headers["Authorization"] == f"Bearer {GITHUB_TOKEN}"
    assert req.headers["Accept"] == "application/vnd.github+json"
    assert req.headers["X-GitHub-Api-Version"] == "2022-11-28"
    assert req.json() == {"body": "### report\n| a |"}


def test_parse_pr_ref() -> None:
    ref = parse_pr_ref("vllm-project/vllm-ascend#8210")
    assert (ref.owner, ref.repo, ref.number) == ("vllm-project", "vllm-ascend", 8210)
    assert str(ref) == "vllm-project/vllm-ascend#8210"
    for bad in ("vllm#1", "a/b", "a/b#x", "a/b/c#1"):
        with pytest.raises(ValueError, match="OWNER/REPO#NUMBER"):
            parse_pr_ref(bad)


# --- GitHub: one comment per call, whatever the retries ----------------------------------


@dataclass
class FakeGitHub:
    """The two endpoints the client uses: create and list an issue's comments. The
    first ``slow_posts`` creations land but answer only when the fake closes."""

    port: int = 0
    comments: list[dict[str, Any]] = field(default_factory=list)
    posts: int = 0
    gets: int = 0
    slow_posts: int = 0
    closed: threading.Event = field(default_factory=threading.Event)
    list_status: int = 200

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    gh = FakeGitHub()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            gh.posts += 1
            n = len(gh.comments) + 1
            comment = {
                "id": n,
                "body": body["body"],
                "html_url": f"https://github.com/octo/farm/pull/5#issuecomment-{n}",
            }
            gh.comments.append(comment)  # landed, whether or not the answer arrives
            if gh.posts <= gh.slow_posts:
                gh.closed.wait(HANG_LIMIT_S)
            self._answer(201, comment)

        def do_GET(self) -> None:
            gh.gets += 1
            assert "since=" in self.path and "per_page=100" in self.path
            self._answer(gh.list_status, gh.comments if gh.list_status == 200 else {})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as gh.port:
        try:
            yield gh
        finally:
            gh.closed.set()


def test_github_retry_after_a_timeout_finds_its_comment_instead_of_posting_twice(
    github: FakeGitHub,
) -> None:
    """Before: a POST whose answer timed out was sent again, and the report appeared
    twice on the pull request."""
    github.comments.append({"id": 0, "body": "someone else's comment", "html_url": "x"})
    github.slow_posts = 1
    client = GitHubClient(
        token=GITHUB_TOKEN, api_url=github.api, policy=_policy(timeout_s=GIVE_UP_S)
    )
    url = client.post_issue_comment(parse_pr_ref("octo/farm#5"), "### report")
    assert github.posts == 1 and github.gets == 1
    assert url == "https://github.com/octo/farm/pull/5#issuecomment-2"
    assert github.comments[1]["body"] == "### report"


def test_github_does_not_post_again_when_it_cannot_check(github: FakeGitHub) -> None:
    github.slow_posts = 1
    github.list_status = 502
    client = GitHubClient(
        token=GITHUB_TOKEN, api_url=github.api, policy=_policy(timeout_s=GIVE_UP_S)
    )
    with pytest.raises(GitHubError, match="not posting again") as info:
        client.post_issue_comment(parse_pr_ref("octo/farm#5"), "### report")
    assert github.posts == 1
    assert GITHUB_TOKEN not in str(info.value)


def test_github_first_post_needs_no_lookup(github: FakeGitHub) -> None:
    client = GitHubClient(token=GITHUB_TOKEN, api_url=github.api, policy=_policy())
    client.post_issue_comment(parse_pr_ref("octo/farm#5"), "a" * 70000)
    assert github.posts == 1 and github.gets == 0
    body = github.comments[0]["body"]
    assert len(body) <= 65536 and body.endswith("longer than a GitHub comment allows)*")

"""Everything that came from an engine, a repository or a user is
inert text in every channel: WeCom, Feishu (card and text), Slack, the PR comment and
`farm report --bisection --format md`, the terminal. Mentions ping no one, tags and
links do not render, control characters are shown escaped, and a cut never splits an
escape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.analysis.rules import pr_rules
from farm.cli.main import app
from farm.inert import cut, feishu_markdown, github_markdown, terminal, wecom_markdown
from farm.notify.feishu import feishu_notice_payload, feishu_payload
from farm.notify.message import Notice
from farm.notify.slack import slack_payload
from farm.notify.wecom import wecom_notice_payload, wecom_payload
from farm.report.markdown import render_bisection
from farm.workflows.bisect.decide import Commit
from tests.support.alerts import alert_record
from tests.support.bisection import bisection

HOSTILE = [
    "<@all> look",
    '<font color="info">ALL CLEAN</font>',
    "[click](https://evil.example/x)",
    "![img](https://evil.example/p.png)",
    "@octocat and @org/team",
    '<at user_id="all">all</at>',
    "<!channel> <https://evil.example|docs>",
    "<script>alert(1)</script>",
    "\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
    "right\u202eto-left \x00 nul \r return",
    "x" * 55 + "<font>",  # a tag across the 60-character cut
]

# What must not survive in each channel's rendering of HOSTILE text.
RAW_TAG = re.compile(r"<\s*[@!/a-zA-Z]")
MD_LINK = re.compile(r"(?<!\\)\]\(")
MENTION = re.compile(r"(?<![\w\u200b])@[A-Za-z0-9]")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


def _inert(text: str, *, mentions: bool = True) -> None:
    assert not RAW_TAG.search(text), text
    assert not MD_LINK.search(text), text
    assert not CONTROL.search(text), repr(text)
    if mentions:
        assert not MENTION.search(text), text


@pytest.mark.parametrize("bad", HOSTILE)
def test_each_channel_escapes_by_its_own_rules(bad: str) -> None:
    _inert(github_markdown(bad))
    _inert(wecom_markdown(bad), mentions=False)  # WeCom mentions are <@id>: no < left
    _inert(feishu_markdown(bad), mentions=False)  # Feishu mentions are <at>: no < left
    _inert(terminal(bad), mentions=False) if "<" not in bad and "](" not in bad else None
    assert not CONTROL.search(terminal(bad))


@pytest.mark.parametrize("bad", HOSTILE)
def test_alerts_and_notices_reach_chat_inert(bad: str) -> None:
    alert = alert_record(summary=bad)
    alert = alert.model_copy(
        update={"details": alert.details.model_copy(update={"error": bad, "attribution": bad})}
    )
    wecom = wecom_payload([alert])["markdown"]["content"]
    notice = Notice(title=f"bisection: {bad}", lines=(bad, f"commit: {bad}"), footer="f")
    wecom_notice = wecom_notice_payload(notice)["markdown"]["content"]
    for content in (wecom, wecom_notice):
        ours = content.replace('<font color="warning">', "").replace('<font color="info">', "")
        ours = ours.replace('<font color="comment">', "").replace("</font>", "")
        _inert(ours, mentions=False)
    card = json.dumps(feishu_payload([alert], "interactive"), ensure_ascii=False)
    card_notice = feishu_notice_payload(notice, "interactive")
    text = feishu_payload([alert], "text")["content"]["text"]
    text_notice = feishu_notice_payload(notice, "text")["content"]["text"]
    for markdown in [e["content"] for e in card_notice["card"]["elements"] if "content" in e]:
        _inert(markdown, mentions=False)
    for plain in (text, text_notice):
        assert "<" not in plain and not CONTROL.search(plain.replace("\n", "")), plain
    assert "<at" not in card and "<@" not in card
    slack = json.dumps(slack_payload([alert]))
    assert "<!channel>" not in slack and "<@all>" not in slack and "\\u001b" not in slack


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_bisection_report_in_markdown_carries_commit_subjects_inert(bad: str) -> None:
    b = bisection(status="running")
    commits = tuple(Commit.of(c.sha, bad) for c in b.commits)
    md = render_bisection(b.model_copy(update={"commits": commits, "job": bad}))
    _inert(md.replace("<br>", ""))


def test_a_cut_never_splits_what_escaping_makes() -> None:
    raw = "x" * 55 + "<font>&"
    cell = github_markdown(cut(raw, 60))
    assert cell.endswith("...") and "&lt;" in cell and not re.search(r"&[a-z]*\.\.\.$", cell)
    assert cut("e\u0301" * 40, 11).count("\u0301") == cut("e\u0301" * 40, 11).count("e")


def test_alert_notes_refuse_control_characters_and_old_ones_print_escaped(
    tmp_path: Path,
) -> None:
    env = {"FARM_HOME": str(tmp_path), "COLUMNS": "300"}
    for option in ("--note", "--by"):
        result = CliRunner().invoke(
            app,
            ["alerts", "ack", "1", option, "\x1b[2J\x1b[31mpwned"],
            env=env,
        )
        assert result.exit_code == 2 and "control characters" in result.output
        assert "\x1b" not in result.output


@pytest.mark.parametrize("bad", HOSTILE)
def test_the_pr_comment_carries_labels_patches_and_links_inert(bad: str) -> None:
    from farm.report.pr_comment import render_pr_comment
    from farm.workflows.pr.decide import DroppedPatch, comment_marker, judge_pr
    from tests.support.sweeps import BASE, CAND, PR_FAST, pr_sweep

    dropped = (DroppedPatch(patch_id="a", reason="conflict", detail=bad),)
    judged = judge_pr(
        pr_sweep(5, cand_factor=0.8),
        base=BASE,
        candidate=CAND,
        reused=(),
        job="pr-unit",
        number=7,
        head_sha="b" * 40,
        dropped=dropped,
        rules=pr_rules(candidate=CAND, base=BASE, check=PR_FAST),
    )
    marker = comment_marker("pr-unit", BASE)
    text = render_pr_comment(
        judged.verdict,
        judged.comparison,
        marker=marker,
        candidate_label=bad,
        base_label=bad,
        dropped=[d.describe() for d in dropped],
        report_url=f"https://farm.example/r.html?x={bad}",
    )
    body = text.removeprefix(marker).replace("<sub>", "").replace("</sub>", "")
    body = re.sub(r"<https://farm\.example/r\.html\?x=[^\s<>]*>", "", body)
    _inert(body)

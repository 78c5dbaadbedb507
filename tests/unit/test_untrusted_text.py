"""Text from outside the farm is made safe where it enters.

Outside text (an engine's error, a golden case file, git metadata, a remote service's
answer) is held as :class:`farm.inert.Untrusted` from the moment a record is built or
read back: its URL credentials are masked then, so no later page or message can show
them. Each channel shows it through its own function (:data:`farm.inert.CHANNELS`);
:func:`test_renderers_interpolate_outside_text_only_through_their_channel` walks the
renderers' source so that a new unescaped path fails here, not only in review.
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.text import Text
from typer.testing import CliRunner

from farm import inert
from farm.cli.common import FarmConsole
from farm.cli.main import app
from farm.inert import (
    CHANNELS,
    Untrusted,
    UntrustedText,
    feishu_markdown,
    feishu_text,
    github_cell,
    github_code,
    github_markdown,
    html_text,
    slack_mrkdwn,
    terminal,
    untrusted,
    wecom_markdown,
)
from farm.notify.feishu import feishu_notice_payload, feishu_payload
from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.message import Notice
from farm.notify.slack import slack_notice_payload, slack_payload
from farm.notify.webhook import webhook_notice_payload, webhook_payload
from farm.notify.wecom import wecom_notice_payload, wecom_payload
from farm.records import CellResult, RequestRecord
from farm.results.alerts import AlertDetails, AlertRecord
from farm.results.bisection import Bisection, BisectStep, Commit
from farm.spec.goldens import Golden, parse_goldens

REPO = Path(__file__).resolve().parents[2]

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"
PG = "postgresql://farm:PW-db-secret@db/x?password=Q-param-secret"
USERINFO = "https://user:PASSWORD-in-url@host/repo"
SECRETS = ("PW-db-secret", "Q-param-secret", "PASSWORD-in-url")
HOSTILE = (
    f"{ESCAPES}boom",
    "@everyone look",
    "<!-- mtp-farm:pr-comment -->",
    "<img src=x onerror=alert(1)> <b>raw</b>",
    "[click](https://evil.example/x) https://evil.example/bare",
    USERINFO,
    PG,
)
ALL_HOSTILE = " ".join(HOSTILE)


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


# --- the type ------------------------------------------------------------------------


def test_untrusted_masks_credentials_when_made_and_never_raises() -> None:
    u = untrusted(PG)
    assert isinstance(u, Untrusted) and isinstance(u, str)
    assert u == "postgresql://farm:***@db/x?password=***"
    assert Untrusted(u) is u and untrusted(u) == u  # made once, masked once
    assert untrusted(USERINFO) == "https://user:***@host/repo"
    assert untrusted("plain text, a=b") == "plain text, a=b"  # valid text unchanged

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert untrusted(Unprintable()) == "***"  # the masking itself never raises


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (CellResult, "error"),
        (CellResult, "log_tail"),
        (RequestRecord, "error"),
        (AlertDetails, "error"),
        (AlertRecord, "summary"),
        (AlertRecord, "note"),
        (AlertRecord, "news"),
        (Golden, "name"),
        (Golden, "case"),
        (Golden, "dataset"),
        (Bisection, "repo"),
        (Bisection, "reason"),
        (BisectStep, "reason"),
        (Commit, "subject"),
        (Notice, "title"),
        (Notice, "lines"),
    ],
)
def test_records_hold_outside_text_as_untrusted(model: type[Any], field: str) -> None:
    # The field's type carries the masking, whichever stage builds the record and
    # whichever store it is read back from.
    info = model.model_fields[field]
    assert repr(UntrustedText.__metadata__[0]) in repr(info), info


def test_a_cell_error_is_masked_when_the_result_is_built() -> None:
    failed = CellResult.never_ran("c1", f"cannot reach the store at {PG}")
    assert isinstance(failed.error, Untrusted)
    _no_secret(failed.model_dump_json())
    assert failed.error == "cannot reach the store at postgresql://farm:***@db/x?password=***"


def test_a_bisection_keeps_its_source_repository_without_the_password() -> None:
    from tests.support.bisection import bisection

    b = bisection(repo=USERINFO)
    assert b.repo == "https://user:***@host/repo"
    _no_secret(b.model_dump_json())


# --- each channel --------------------------------------------------------------------


def _inert_markdown(text: str) -> None:
    _no_secret(text)
    assert "\x1b" not in text and "\x07" not in text
    assert "<!--" not in text and "<img" not in text and "<b>" not in text
    assert "@everyone" not in text  # a zero-width space after the @
    assert "](https://" not in text and "https://evil" not in text  # no link, no autolink


@pytest.mark.parametrize("bad", HOSTILE)
def test_each_channel_shows_the_examples_inert_and_masked(bad: str) -> None:
    _inert_markdown(github_markdown(bad))
    # A table cell of the farm's own words: outside text is to pass github_markdown
    # first; the cell still shows no escape sequence, tag or credential.
    cell = github_cell(bad)
    assert "\x1b" not in cell and "<!--" not in cell and "<img" not in cell
    _no_secret(cell)
    code = github_code(bad)
    assert code.startswith("`") and code.endswith("`") and "\n" not in code
    assert "<!--" not in code and "\x1b" not in code
    _no_secret(code)
    for shown in (terminal(bad), terminal(bad, newlines=True)):
        assert "\x1b" not in shown and "\x07" not in shown
        _no_secret(shown)
    page = html_text(bad)
    assert "<" not in page and "\x1b" not in page
    _no_secret(page)
    for chat in (slack_mrkdwn(bad), wecom_markdown(bad), feishu_markdown(bad), feishu_text(bad)):
        assert "<" not in chat and "\x1b" not in chat, chat
        _no_secret(chat)


def test_every_channel_has_its_functions_in_farm_inert() -> None:
    for channel, names in CHANNELS.items():
        for name in names:
            assert callable(getattr(inert, name)), (channel, name)
            assert getattr(inert, name)(PG) != PG, (channel, name)  # masks too


def test_the_terminal_console_never_writes_an_escape_sequence() -> None:
    out = io.StringIO()
    console = FarmConsole(file=out, force_terminal=True, markup=False, width=200)
    console.print(Text(f"a {ESCAPES} b"))
    console.print(f"env: EVIL='{ESCAPES}'")
    console.print(Text("styled", style="bold red"))  # the console's own colour is kept
    written = out.getvalue()
    assert "\x1b]0;" not in written and "\x1b[2J" not in written and "\x07" not in written
    assert "\\x1b]0;pwned" in written and "\x1b[1;31mstyled" in written


# --- the examples, end to end --------------------------------------------------------


def test_goldens_show_prints_a_case_name_inert(tmp_path: Path) -> None:
    text = (REPO / "tests" / "data" / "goldens" / "synthetic-mtp3.yaml").read_text()
    text = text.replace("name: synthetic-mtp3", 'name: "x\\e]0;pwned\\a\\e[2Jevil"')
    text = text.replace("dataset_path: farm-tests/synthetic", f'dataset_path: "{USERINFO}"')
    case = tmp_path / "g.yaml"
    case.write_text(text)
    (golden,) = parse_goldens(text, str(case))
    assert isinstance(golden.name, Untrusted)
    result = CliRunner().invoke(app, ["goldens", "show", str(case)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\\x1b]0;pwned" in result.output
    _no_secret(result.output)


def test_plan_prints_an_engines_env_and_extra_args_inert(tmp_path: Path) -> None:
    text = (REPO / "jobs" / "local.yaml").read_text()
    text = text.replace("../models/tiny-step", str(REPO / "models" / "tiny-step"))
    text = text.replace("../workloads/arith-mix.jsonl", str(REPO / "workloads" / "arith-mix.jsonl"))
    text = text.replace(
        '      VLLM_CPU_KVCACHE_SPACE: "1"\n',
        '      VLLM_CPU_KVCACHE_SPACE: "1"\n      EVIL: "\\e]0;pwned\\a\\e[2J"\n'
        '    extra_args: ["--x=\\e[31mred"]\n',
    )
    job = tmp_path / "job.yaml"
    job.write_text(text)
    result = CliRunner().invoke(
        app, ["plan", str(job)], env={"COLUMNS": "300", "FARM_HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "EVIL='\\x1b]0;pwned" in result.output and "--x=\\x1b[31mred" in result.output


def _failed_sweep(error: str) -> Any:
    from tests.support.sweeps import fail_cell, seeded_sweep

    return fail_cell(seeded_sweep(3), "base.synthetic.full_decode_only.mtp1.swa-off", error)


def test_report_status_column_shows_a_stored_engine_error_inert() -> None:
    from farm.analysis.summary import summarize_sweep
    from farm.report.table import render_matrix

    sweep = _failed_sweep(f"{ESCAPES}engine died")
    out = io.StringIO()
    console = FarmConsole(file=out, force_terminal=True, markup=False, width=300)
    console.print(render_matrix("sweep", tuple(summarize_sweep(sweep))).wide())
    written = out.getvalue()
    assert "\x1b]0;" not in written and "\x1b[2J" not in written
    assert "\\x1b]0;pwned" in written


def test_report_markdown_notes_quote_a_failed_cells_error_inert() -> None:
    from farm.analysis.checks import check_sweep
    from farm.analysis.summary import summarize_sweep
    from farm.report.markdown import render_markdown
    from tests.support.sweeps import FAST

    sweep = _failed_sweep(ALL_HOSTILE)
    text = render_markdown(sweep, summarize_sweep(sweep), check_sweep(sweep, config=FAST))
    notes = text[text.index("### Notes") :]
    _no_secret(text)
    assert "\x1b" not in text and "<!--" not in text
    assert "<img" not in text.replace("`", "").split("### Notes")[0]  # the matrix: entities
    for line in notes.splitlines():
        if "engine" in line or "everyone" in line:
            # Quoted in a code span: verbatim, yet no tag, link or mention renders.
            body = line.split(": ", 1)[1]
            assert body.startswith("`") and body.endswith("`"), line


def test_bisection_pages_never_show_the_sources_password() -> None:
    from farm.report.html import render_bisection_html
    from farm.report.markdown import render_bisection
    from tests.support.bisection import bisection

    b = bisection(repo=USERINFO)
    raw = b.model_copy(update={"repo": USERINFO})  # even a record that skipped the mask
    for shown in (b, raw):
        md, page = render_bisection(shown), render_bisection_html(shown)
        _no_secret(md)
        _no_secret(page)
        assert "https://user:***@host/repo" in page


def _alert(error: str) -> AlertRecord:
    from tests.support.alerts import alert_record as base

    a = base(summary=f"cell failed: {error}")
    data = a.model_dump(mode="python")
    data["details"]["error"] = error
    return AlertRecord.model_validate(data)


def test_chat_and_webhook_alert_bodies_carry_no_stored_credential() -> None:
    alert = _alert(f"cannot reach {PG}")
    assert "PW-db-secret" not in alert.details.error  # type: ignore[operator]
    notice = Notice(title=f"bisection of {USERINFO}", lines=(f"store: {PG}",), footer="f")
    bodies = [
        slack_payload([alert]),
        slack_notice_payload(notice),
        feishu_payload([alert], "interactive"),
        feishu_payload([alert], "text"),
        feishu_notice_payload(notice, "interactive"),
        feishu_notice_payload(notice, "text"),
        wecom_payload([alert]),
        wecom_notice_payload(notice),
        webhook_payload([alert]),
        webhook_notice_payload(notice),
    ]
    for body in bodies:
        _no_secret(json.dumps(body, ensure_ascii=False))


def test_chat_renderers_mask_even_a_record_that_skipped_the_mask() -> None:
    alert = _alert("x")
    raw = alert.model_copy(
        update={"details": alert.details.model_copy(update={"error": f"{ESCAPES}{PG}"})}
    )
    for body in (slack_payload([raw]), feishu_payload([raw], "interactive"), wecom_payload([raw])):
        shown = json.dumps(body, ensure_ascii=False)
        _no_secret(shown)
        assert "\x1b" not in shown


@pytest.mark.parametrize("status", [400, 502])
def test_a_remote_answer_reaches_the_failure_line_inert(status: int) -> None:
    answer = f"{ESCAPES}denied; see {USERINFO} token=T0KEN"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=answer)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with pytest.raises(NotifyError) as caught:
        post_json(
            "https://hooks.example/x",
            {"a": 1},
            service="webhook",
            error=NotifyError,
            secrets=["T0KEN"],
            policy=RetryPolicy(attempts=1, sleep=lambda _s: None),
            client=client,
        )
    message = str(caught.value)
    assert "\x1b" not in message and "\x07" not in message and "\\x1b]0;pwned" in message
    assert "T0KEN" not in message
    _no_secret(message)


def test_github_answer_reaches_the_failure_line_inert() -> None:
    from farm.notify.github import GitHubClient, GitHubError, PullRequestRef

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, text=f"{ESCAPES}bad {USERINFO}")

    notifier = GitHubClient(
        token="ghp_secret",
        client=httpx.Client(transport=httpx.MockTransport(handler)),
        policy=RetryPolicy(attempts=1, sleep=lambda _s: None),
    )
    with pytest.raises(GitHubError) as caught:
        notifier.get_pull(PullRequestRef(owner="acme", repo="plugin", number=1))
    message = str(caught.value)
    assert "\x1b" not in message and "\\x1b" in message
    _no_secret(message)


# --- the renderers' source -----------------------------------------------------------

# Attributes that hold outside text in the records the renderers read (the fields typed
# UntrustedText, and what the analysis derives from them: a summary's error, a note's
# message, an excluded cell's reason).
OUTSIDE_ATTRS = frozenset(
    {"error", "log_tail", "message", "reason", "subject", "repo", "summary", "detail", "note"}
    | {"news", "output_text"}
)
# A case file's every word is outside text (farm goldens show).
GOLDEN_ATTRS = frozenset({"name", "label", "model", "where", "method", "dataset", "case"})
RENDERERS = {
    "farm/report/markdown.py": OUTSIDE_ATTRS,
    "farm/report/html.py": OUTSIDE_ATTRS,
    "farm/report/pr_comment.py": OUTSIDE_ATTRS,
    "farm/report/table.py": OUTSIDE_ATTRS,
    "farm/report/golden_table.py": OUTSIDE_ATTRS | GOLDEN_ATTRS,
    "farm/report/charts.py": OUTSIDE_ATTRS,
    "farm/report/grid.py": OUTSIDE_ATTRS,
    "farm/report/heatmap.py": OUTSIDE_ATTRS,
    "farm/report/svg.py": OUTSIDE_ATTRS,
    "farm/notify/slack.py": OUTSIDE_ATTRS,
    "farm/notify/feishu.py": OUTSIDE_ATTRS,
    "farm/notify/wecom.py": OUTSIDE_ATTRS,
}
# Builders of channel-neutral text (rendered later, whole, by a channel's function):
# the bisection's rows (Markdown, HTML and the terminal each escape every cell) and a
# grid cell's tooltip (html_text where the SVG is drawn).
NEUTRAL = {
    ("farm/report/markdown.py", "bisection_rows"),
    ("farm/report/grid.py", "_grid_cell"),
    ("farm/report/grid.py", "_error"),
}
CHANNEL_FUNCTIONS = frozenset(n for names in CHANNELS.values() for n in names)


def _allowed(tree: ast.Module) -> set[str]:
    """The channel's functions as the module names them: imported (``md``), or a
    module function that returns one's call (``_e``, ``_escape``, ``_cell``)."""
    allowed = set(CHANNEL_FUNCTIONS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "farm.inert":
            allowed |= {a.asname or a.name for a in node.names if a.name in CHANNEL_FUNCTIONS}
    for f in tree.body:
        if isinstance(f, ast.FunctionDef):
            returns = [r for r in ast.walk(f) if isinstance(r, ast.Return) and r.value]
            if returns and all(
                isinstance(r.value, ast.Call)
                and isinstance(r.value.func, ast.Name)
                and r.value.func.id in allowed
                for r in returns
            ):
                allowed.add(f.name)
    return allowed


def unescaped_interpolations(source: str, attrs: frozenset[str], where: str = "") -> list[str]:
    """Each f-string of ``source`` that interpolates one of ``attrs`` without a call to
    the channel's function around it: ``function:line: expression``."""
    tree = ast.parse(source)
    allowed = _allowed(tree)
    found: list[str] = []

    def visit(node: ast.AST, wrapped: bool, function: str) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            wrapped = wrapped or node.func.id in allowed
        if isinstance(node, ast.Attribute) and node.attr in attrs and not wrapped:
            found.append(f"{function}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, wrapped, function)

    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        if (where, function.name) in NEUTRAL:
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.FormattedValue):
                visit(node.value, False, function.name)
    return sorted(set(found))


@pytest.mark.parametrize("path", sorted(RENDERERS))
def test_renderers_interpolate_outside_text_only_through_their_channel(path: str) -> None:
    source = (REPO / path).read_text()
    found = unescaped_interpolations(source, RENDERERS[path], path)
    assert found == [], (
        f"{path} puts outside text into an f-string without its channel's function "
        f"(farm.inert.CHANNELS): {found}"
    )


def test_the_source_walk_catches_an_unescaped_interpolation() -> None:
    bad = "def f(r):\n    return f'status: {r.error[:60]}'\n"
    good = (
        "from farm.inert import github_markdown as md\n"
        "def f(r):\n    return f'status: {md(r.error[:60])}'\n"
    )
    assert unescaped_interpolations(bad, OUTSIDE_ATTRS) == ["f:2: r.error"]
    assert unescaped_interpolations(good, OUTSIDE_ATTRS) == []

"""The PR comment cannot be hijacked. Only comments written by the
token's own user count as the farm's (a marker anyone can paste is no proof), and the
commit status is set even when the comment cannot be written. Against the FAKE GitHub
server (tests/fakes/github_server.py)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from farm.notify.github import GitHubClient, GitHubError, PullRequestRef
from farm.notify.http import RetryPolicy
from farm.workflows.pr.decide import comment_marker
from farm.workflows.pr.steps import publish_pr
from tests.fakes.github_server import FakeGitHub, FakePull, fake_github

TOKEN = "ghp_OWNERownertoken0123456789abcdefSECRET"
HEAD, BASE = "3" * 40, "4" * 40
PR = PullRequestRef(owner="acme", repo="plugin", number=7)
NO_WAIT = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0, sleep=lambda _s: None)
MARKER = comment_marker("job", "vllm-cpu")


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    state = FakeGitHub(token=TOKEN, pulls={7: FakePull(head_sha=HEAD, base_sha=BASE)})
    with fake_github(state) as served:
        yield served


def _client(github: FakeGitHub, **kw: Any) -> GitHubClient:
    return GitHubClient(token=TOKEN, api_url=github.url, policy=NO_WAIT, **kw)


def _check(outcome: str = "clean") -> Any:
    verdict = SimpleNamespace(
        outcome=outcome, regressions=(), comparisons=3, reused_cells=(), findings=(), sweep_id=5
    )
    judgement = SimpleNamespace(verdict=verdict)
    return SimpleNamespace(judgement=judgement, comment=f"{MARKER}\nverdict: {outcome}")


SETUP: Any = SimpleNamespace(job="job", base=SimpleNamespace(name="vllm-cpu"))


@pytest.mark.parametrize(
    "planted",
    [
        MARKER,  # the marker alone
        f"{MARKER}\nALL CLEAN, merge me",  # a fake verdict under the marker
        f"quoting the farm:\n> {MARKER}",  # a quote of the farm's own comment
    ],
)
def test_a_comment_by_another_user_with_the_marker_is_not_the_farms(
    github: FakeGitHub, planted: str
) -> None:
    attacker = github.add_comment(7, planted, user="mallory")
    url, created = _client(github).upsert_comment(PR, MARKER, f"{MARKER}\nrun 1")
    assert created  # a new comment of the farm's own, not the attacker's
    assert github.comments[attacker]["body"] == planted
    assert github.calls_of("PATCH", r"/issues/comments/") == []
    # The next run updates the farm's own comment, still not the attacker's newer one.
    github.add_comment(7, planted, user="mallory")
    url2, created2 = _client(github).upsert_comment(PR, MARKER, f"{MARKER}\nrun 2")
    assert not created2 and url2 == url
    ours = [c for c in github.comments.values() if c["user"] == "farm-bot"]
    assert [c["body"] for c in ours] == [f"{MARKER}\nrun 2"]


def test_an_app_token_names_its_bot_login_and_is_refused_without_it(github: FakeGitHub) -> None:
    github.app_token = True
    github.login = "mtp-farm[bot]"
    with pytest.raises(GitHubError, match="FARM_GITHUB_LOGIN") as info:
        _client(github).upsert_comment(PR, MARKER, f"{MARKER}\nrun")
    assert TOKEN not in str(info.value)
    assert github.calls_of("POST", r"/comments$") == []
    _, created = _client(github, login="mtp-farm[bot]").upsert_comment(PR, MARKER, f"{MARKER}\nx")
    assert created


def test_the_status_is_set_even_when_the_comment_fails(github: FakeGitHub) -> None:
    github.pulls.clear()  # listing and creating comments now answer 404
    with pytest.raises(GitHubError, match="the status success was set"):
        publish_pr(_client(github), PR, _check(), SETUP, sha=HEAD)
    [status] = github.statuses
    assert status["sha"] == HEAD and status["state"] == "success"
    assert status["context"] == "mtp-farm/job"


def test_a_hijacked_marker_does_not_stop_the_status(github: FakeGitHub) -> None:
    github.add_comment(7, f"{MARKER}\nALL CLEAN", user="mallory")
    _, created, state = publish_pr(_client(github), PR, _check("regression"), SETUP, sha=HEAD)
    assert created and state == "failure"
    assert [s["state"] for s in github.statuses] == ["failure"]
    assert github.problems == []

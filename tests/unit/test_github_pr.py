"""The GitHub client's PR calls against the FAKE GitHub REST server (tests/fakes):
read the PR, one comment per marker (created once, then updated, across pages),
commit statuses, and errors that name the problem without the token."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from farm.notify.github import GitHubClient, GitHubError, PullRequestRef, parse_repo
from farm.notify.http import RetryPolicy
from tests.fakes.github_server import FakeGitHub, FakePull, fake_github

TOKEN = "ghp_UNITunittoken0123456789abcdefSECRET"
HEAD, BASE = "1" * 40, "2" * 40
PR = PullRequestRef(owner="acme", repo="plugin", number=7)
NO_WAIT = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0, sleep=lambda _s: None)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    state = FakeGitHub(token=TOKEN, pulls={7: FakePull(head_sha=HEAD, base_sha=BASE)})
    with fake_github(state) as served:
        yield served


def _client(github: FakeGitHub, token: str = TOKEN) -> GitHubClient:
    return GitHubClient(token=token, api_url=github.url, policy=NO_WAIT)


def test_reading_the_pull_request_gives_its_head_and_base(github: FakeGitHub) -> None:
    info = _client(github).get_pull(PR)
    assert (info.head_sha, info.base_sha, info.base_ref) == (HEAD, BASE, "main")
    with pytest.raises(GitHubError, match="no such repository or pull request"):
        _client(github).get_pull(PullRequestRef("acme", "plugin", 9))


def test_one_comment_per_marker_created_once_then_updated(github: FakeGitHub) -> None:
    for i in range(3):  # other people's comments: the marker is on page 3 after this
        github.add_comment(7, f"review {i}")
    client = _client(github)
    marker = "<!-- mtp-farm:job:vllm-cpu -->"
    url, created = client.upsert_comment(PR, marker, f"{marker}\nrun 1")
    assert created and url.endswith("#issuecomment-1004")
    github.add_comment(7, "another review")
    url2, created2 = client.upsert_comment(PR, marker, f"{marker}\nrun 2")
    assert not created2 and url2 == url
    ours = [c for c in github.comments.values() if marker in c["body"]]
    assert [c["body"] for c in ours] == [f"{marker}\nrun 2"]
    assert len(github.calls_of("POST", r"/issues/7/comments$")) == 1
    assert len(github.calls_of("PATCH", r"/issues/comments/1004$")) == 1
    # The listing followed the Link header across pages.
    assert any("page=3" in c.path for c in github.calls_of("GET", r"/issues/7/comments"))
    # A comment of another job's marker is another comment.
    other = "<!-- mtp-farm:other:vllm-cpu -->"
    _, created3 = client.upsert_comment(PR, other, f"{other}\nrun 1")
    assert created3 and github.problems == []
    with pytest.raises(ValueError, match="marker"):
        client.upsert_comment(PR, marker, "no marker here")


def test_a_status_has_the_fields_github_takes_and_one_line(github: FakeGitHub) -> None:
    _client(github).set_status(
        "acme",
        "plugin",
        HEAD,
        "failure",
        "mtp-farm/job",
        "AL fell\nin 2 cells " + "x" * 200,
        target_url="https://farm.example/r.html",
    )
    [status] = github.statuses
    assert status["sha"] == HEAD and status["state"] == "failure"
    assert status["context"] == "mtp-farm/job" and status["target_url"].endswith("r.html")
    assert len(status["description"]) == 140 and "\n" not in status["description"]
    assert github.problems == []
    with pytest.raises(ValueError, match="state"):
        _client(github).set_status("acme", "plugin", HEAD, "green", "c", "d")


def test_a_refused_token_is_named_and_never_shown(github: FakeGitHub) -> None:
    wrong = "ghp_WRONGwrongtoken9876543210zyxw"
    client = _client(github, wrong)
    for call in (
        lambda: client.get_pull(PR),
        lambda: client.upsert_comment(PR, "<!-- m -->", "<!-- m -->"),
        lambda: client.set_status("acme", "plugin", HEAD, "success", "c", "d"),
    ):
        with pytest.raises(GitHubError) as info:
            call()
        text = str(info.value)
        assert "401" in text and wrong not in text and TOKEN not in text
    with pytest.raises(GitHubError, match="refused the token"):
        client.get_pull(PR)
    # A 401 is not retried: one call per attempt above, no more.
    assert len(github.calls_of("GET", r"/pulls/7$")) == 2


def test_an_unreachable_api_fails_after_the_retries_without_the_token() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = GitHubClient(token=TOKEN, api_url=f"http://127.0.0.1:{port}", policy=NO_WAIT)
    with pytest.raises(GitHubError, match="unreachable or failing after 2 attempt") as info:
        client.get_pull(PR)
    assert TOKEN not in str(info.value)


def test_repositories_are_read_from_names_and_github_urls() -> None:
    assert parse_repo("vllm-project/vllm-ascend") == ("vllm-project", "vllm-ascend")
    assert parse_repo("https://github.com/vllm-project/vllm-ascend.git") == (
        "vllm-project",
        "vllm-ascend",
    )
    assert parse_repo("git@github.com:sgl-project/sglang") == ("sgl-project", "sglang")
    for bad in ("/srv/mirrors/plugin", "https://gitlab.com/a/b", "a/b/c"):
        with pytest.raises(ValueError):
            parse_repo(bad)

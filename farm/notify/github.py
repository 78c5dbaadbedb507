"""GitHub REST client: post a comparison as a pull-request comment.

A pull request is an issue for comments, so this calls "Create an issue comment",
``POST /repos/{owner}/{repo}/issues/{issue_number}/comments`` with
``Authorization: Bearer <token>``:
https://docs.github.com/en/rest/issues/comments#create-an-issue-comment
Comment bodies are limited to 65536 characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx

from farm.notify.http import NotifyError, RetryPolicy, post_json

__all__ = [
    "DEFAULT_API_URL",
    "GitHubClient",
    "GitHubError",
    "PullRequestRef",
    "parse_pr_ref",
]

DEFAULT_API_URL = "https://api.github.com"
_API_VERSION = "2022-11-28"
_BODY_MAX = 65536
_REF = re.compile(r"^(?P<owner>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<repo>[A-Za-z0-9._-]+)#(?P<n>\d+)$")


class GitHubError(NotifyError):
    """GitHub refused the request or did not answer."""


@dataclass(frozen=True)
class PullRequestRef:
    """``OWNER/REPO#NUMBER``."""

    owner: str
    repo: str
    number: int

    def __str__(self) -> str:
        return f"{self.owner}/{self.repo}#{self.number}"


def parse_pr_ref(text: str) -> PullRequestRef:
    """Parse ``OWNER/REPO#NUMBER``; ValueError when it is not of that form."""
    m = _REF.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not OWNER/REPO#NUMBER (for example vllm-project/vllm#123)")
    return PullRequestRef(owner=m["owner"], repo=m["repo"], number=int(m["n"]))


@dataclass(frozen=True)
class GitHubClient:
    """A token-authenticated client of ``api_url`` (``FARM_GITHUB_API`` overrides it)."""

    token: str = field(repr=False)
    api_url: str = DEFAULT_API_URL
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)

    def post_issue_comment(self, ref: PullRequestRef, body: str) -> str:
        """Comment ``body`` (Markdown) on issue or pull request ``ref``; return the
        comment's URL. Bodies over 65536 characters are cut with a note. Raises
        GitHubError (401/403/404 are not retried: token or repository is wrong).

        API: https://docs.github.com/en/rest/issues/comments#create-an-issue-comment
        """
        if len(body) > _BODY_MAX:
            note = "\n\n*(cut: the full report is longer than a GitHub comment allows)*"
            body = body[: _BODY_MAX - len(note)] + note
        base = self.api_url.rstrip("/")
        url = f"{base}/repos/{ref.owner}/{ref.repo}/issues/{ref.number}/comments"
        response = post_json(
            url,
            {"body": body},
            service="github",
            error=GitHubError,
            secrets=[self.token],
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": _API_VERSION,
                "User-Agent": "mtp-farm",
            },
            policy=self.policy,
            client=self.client,
            hint=f"check GITHUB_TOKEN (needs write access to issues/pull requests of {ref})",
        )
        try:
            html_url = response.json().get("html_url")
        except ValueError:
            html_url = None
        return str(html_url or f"{ref}")

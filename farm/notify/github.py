"""GitHub REST client: post a comparison as a pull-request comment.

A pull request is an issue for comments, so this calls "Create an issue comment",
``POST /repos/{owner}/{repo}/issues/{issue_number}/comments`` with
``Authorization: Bearer <token>``:
https://docs.github.com/en/rest/issues/comments#create-an-issue-comment
Comment bodies are limited to 65536 characters.

Creating a comment has no idempotency key. So before a retry of a POST that may have
landed (a read timeout, a 5xx), the client lists the issue's comments updated since
the call began ("List issue comments",
https://docs.github.com/en/rest/issues/comments#list-issue-comments) and returns the
one with exactly its text instead of posting again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx

from farm.notify.http import NotifyError, RetryPolicy, mask_url, post_json, redact

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
# Comments listed while looking for our own: 10 pages of 100, newest window only.
_LOOKUP_PAGES = 10
# "since" is compared with GitHub's clock: leave room for ours being ahead.
_CLOCK_MARGIN = timedelta(minutes=5)
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

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": _API_VERSION,
            "User-Agent": "mtp-farm",
        }

    def post_issue_comment(self, ref: PullRequestRef, body: str) -> str:
        """Comment ``body`` (Markdown) on issue or pull request ``ref``; return the
        comment's URL. Bodies over 65536 characters are cut with a note. A retry after
        a timeout or a 5xx first looks for the comment (module docstring), so one call
        posts at most one comment. Raises GitHubError (401/403/404 are not retried:
        token or repository is wrong; a failed look-up is not followed by another POST).

        API: https://docs.github.com/en/rest/issues/comments#create-an-issue-comment
        """
        if len(body) > _BODY_MAX:
            note = "\n\n*(cut: the full report is longer than a GitHub comment allows)*"
            body = body[: _BODY_MAX - len(note)] + note
        base = self.api_url.rstrip("/")
        url = f"{base}/repos/{ref.owner}/{ref.repo}/issues/{ref.number}/comments"
        since = datetime.now(UTC) - _CLOCK_MARGIN
        response = post_json(
            url,
            {"body": body},
            service="github",
            error=GitHubError,
            secrets=[self.token],
            headers=self._headers(),
            policy=self.policy,
            client=self.client,
            delivered=lambda: self._find_comment(url, body, since),
            hint=f"check GITHUB_TOKEN (needs write access to issues/pull requests of {ref})",
        )
        try:
            html_url = response.json().get("html_url")
        except ValueError:
            html_url = None
        return str(html_url or f"{ref}")

    def _find_comment(self, url: str, body: str, since: datetime) -> httpx.Response | None:
        """The comment of ``url`` (an issue's comments) with text ``body``, updated
        after ``since``, as a response; None if there is none. Raises
        GitHubError when the comments cannot be listed: posting again might duplicate.

        API: https://docs.github.com/en/rest/issues/comments#list-issue-comments
        """
        params = {"since": since.strftime("%Y-%m-%dT%H:%M:%SZ"), "per_page": "100"}
        http = self.client or httpx.Client(timeout=self.policy.timeout_s)
        page_url: str | None = url
        try:
            for _ in range(_LOOKUP_PAGES):
                if page_url is None:
                    break
                try:
                    found = http.get(page_url, params=params, headers=self._headers())
                    found.raise_for_status()
                    comments = found.json()
                except (httpx.HTTPError, ValueError) as exc:
                    reason = redact(f"{type(exc).__name__}: {exc}", [self.token])
                    raise GitHubError(
                        f"github GET {mask_url(url)}: an earlier attempt may have posted the "
                        f"comment and listing the comments to check failed ({reason}); not "
                        "posting again: look at the pull request before re-running"
                    ) from None
                for comment in comments if isinstance(comments, list) else []:
                    if isinstance(comment, dict) and _same_text(comment.get("body"), body):
                        return httpx.Response(200, json=comment)
                next_link = found.links.get("next", {}).get("url")
                page_url, params = (str(next_link), {}) if next_link else (None, params)
        finally:
            if self.client is None:
                http.close()
        return None


def _same_text(found: object, body: str) -> bool:
    # GitHub may store the text with CRLF line ends and trimmed.
    return isinstance(found, str) and found.replace("\r\n", "\n").strip() == body.strip()

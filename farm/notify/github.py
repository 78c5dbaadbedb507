"""GitHub REST client: pull-request comments (create, or update the farm's own), commit
statuses, and the pull request itself.

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

`farm pr` keeps one comment per pull request and job: :meth:`GitHubClient.upsert_comment`
finds the farm's earlier comment by a hidden marker line in its body, among the comments
written by the token's own user only (anyone can paste the marker into a comment of
theirs: "Get the authenticated user", ``GET /user``,
https://docs.github.com/en/rest/users/users#get-the-authenticated-user, or the login
given as ``FARM_GITHUB_LOGIN`` for an app's installation token, which ``GET /user``
refuses) and updates it
("Update an issue comment", ``PATCH /repos/{owner}/{repo}/issues/comments/{id}``,
https://docs.github.com/en/rest/issues/comments#update-an-issue-comment), else creates
one. :meth:`GitHubClient.set_status` sets the commit status of the PR head ("Create a
commit status", https://docs.github.com/en/rest/commits/statuses#create-a-commit-status);
:meth:`GitHubClient.get_pull` reads the PR ("Get a pull request",
https://docs.github.com/en/rest/pulls/pulls#get-a-pull-request) before anything runs,
so a wrong token, repository or number fails fast. GET and PATCH are idempotent, so
they are retried like any failure that cannot post twice; a status is replay-safe
(the newest status of a context wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from farm.inert import untrusted
from farm.masking import mask_endpoint
from farm.notify.http import (
    NotifyError,
    RetryPolicy,
    answer_text,
    check_http_url,
    log,
    post_json,
)

__all__ = [
    "DEFAULT_API_URL",
    "STATUS_STATES",
    "GitHubClient",
    "GitHubError",
    "PullRequestInfo",
    "PullRequestRef",
    "parse_pr_ref",
    "parse_repo",
]

DEFAULT_API_URL = "https://api.github.com"
_API_VERSION = "2022-11-28"
_BODY_MAX = 65536
# Comments listed while looking for our own: 10 pages of 100, newest window only.
_LOOKUP_PAGES = 10
# "since" is compared with GitHub's clock: leave room for ours being ahead.
_CLOCK_MARGIN = timedelta(minutes=5)
_REF = re.compile(r"^(?P<owner>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<repo>[A-Za-z0-9._-]+)#(?P<n>\d+)\Z")
_REPO = re.compile(r"^(?P<owner>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<repo>[A-Za-z0-9._-]+)\Z")
# https://github.com/o/r(.git), git@github.com:o/r(.git), ssh://git@github.com/o/r
_GITHUB_URL = re.compile(
    r"github\.com[/:](?P<owner>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<repo>[A-Za-z0-9._-]+?)(?:\.git)?/?$"
)
STATUS_STATES = ("error", "failure", "pending", "success")
_DESCRIPTION_MAX = 140


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


def parse_repo(text: str) -> tuple[str, str]:
    """``OWNER/REPO`` or a github.com repository URL as (owner, repo); ValueError else."""
    text = text.strip()
    m = _REPO.match(text) or _GITHUB_URL.search(text)
    if m is None:
        raise ValueError(f"{text!r} is not OWNER/REPO or a github.com repository URL")
    return m["owner"], m["repo"]


@dataclass(frozen=True)
class PullRequestInfo:
    """What `farm pr` needs of a pull request: its head and base commits."""

    head_sha: str
    base_sha: str
    base_ref: str
    state: str
    html_url: str


@dataclass(frozen=True)
class GitHubClient:
    """A token-authenticated client of ``api_url`` (``FARM_GITHUB_API`` overrides it)."""

    token: str = field(repr=False)
    api_url: str = DEFAULT_API_URL
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client: httpx.Client | None = field(default=None, repr=False, compare=False)
    # The token's own login (an app's bot, "NAME[bot]"); None: asked of GET /user.
    login: str | None = None
    _known: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

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
        body = self._fit(body)
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
        # GitHub's answer: outside text (printed by the caller), credentials masked.
        return untrusted(str(html_url)) if html_url else f"{ref}"

    def get_pull(self, ref: PullRequestRef) -> PullRequestInfo:
        """The pull request ``ref``: head and base commits. Raises GitHubError (404:
        no such pull request, or the token cannot see the repository).

        API: https://docs.github.com/en/rest/pulls/pulls#get-a-pull-request
        """
        url = f"{self._repo_url(ref)}/pulls/{ref.number}"
        data = self._idempotent("GET", url, None, f"read pull request {ref}")
        try:
            return PullRequestInfo(
                head_sha=str(data["head"]["sha"]),
                base_sha=str(data["base"]["sha"]),
                base_ref=str(data["base"].get("ref", "")),
                state=str(data.get("state", "")),
                html_url=str(data.get("html_url", "")),
            )
        except (KeyError, TypeError) as exc:
            raise GitHubError(
                f"github GET {mask_endpoint(url)}: the answer has no {exc} (is FARM_GITHUB_API "
                "a GitHub REST API?)"
            ) from None

    def own_login(self) -> str:
        """The login of the token's user (``login`` when given, else ``GET /user``,
        asked once). Raises GitHubError when GitHub will not say (an app's
        installation token: set FARM_GITHUB_LOGIN to its bot login).

        API: https://docs.github.com/en/rest/users/users#get-the-authenticated-user
        """
        if self.login:
            return self.login
        if "login" not in self._known:
            url = f"{self.api_url.rstrip('/')}/user"
            try:
                data = self._idempotent("GET", url, None, "read the token's own user")
            except GitHubError as exc:
                raise GitHubError(
                    f"{exc}; the farm updates only its own comments and must know whose "
                    "they are: with an app's installation token set FARM_GITHUB_LOGIN to "
                    "the app's bot login (NAME[bot])"
                ) from None
            login = data.get("login")
            if not isinstance(login, str) or not login:
                raise GitHubError(
                    f"github GET {mask_endpoint(url)}: the answer names no login (is "
                    "FARM_GITHUB_API a GitHub REST API?)"
                )
            self._known["login"] = login
        return self._known["login"]

    def upsert_comment(self, ref: PullRequestRef, marker: str, body: str) -> tuple[str, bool]:
        """Update the comment of ``ref`` whose body holds ``marker`` to ``body`` (which
        must hold it too), or create one; return (its URL, True when created). Raises
        GitHubError.

        API: https://docs.github.com/en/rest/issues/comments#list-issue-comments and
        https://docs.github.com/en/rest/issues/comments#update-an-issue-comment
        """
        if marker not in body:
            raise ValueError(
                "the comment body must hold its marker, or the next run cannot find it"
            )
        body = self._fit(body)
        found = self._comment_with(ref, marker)
        if found is None:
            return self.post_issue_comment(ref, body), True
        url = f"{self._repo_url(ref)}/issues/comments/{found}"
        data = self._idempotent("PATCH", url, {"body": body}, f"update comment {found} on {ref}")
        return str(data.get("html_url") or url), False

    def set_status(
        self,
        owner: str,
        repo: str,
        sha: str,
        state: str,
        context: str,
        description: str,
        target_url: str | None = None,
    ) -> None:
        """Set commit status ``context`` of ``sha`` to ``state`` (error, failure,
        pending, success) with a one-line ``description`` (cut to 140 characters).
        Raises GitHubError; ValueError for an unknown state.

        API: https://docs.github.com/en/rest/commits/statuses#create-a-commit-status
        """
        if state not in STATUS_STATES:
            raise ValueError(f"status state {state!r} is not one of {STATUS_STATES}")
        line = " ".join(description.split())
        payload: dict[str, str] = {
            "state": state,
            "context": context,
            "description": line[:_DESCRIPTION_MAX],
        }
        if target_url:
            payload["target_url"] = target_url
        post_json(
            f"{self.api_url.rstrip('/')}/repos/{owner}/{repo}/statuses/{sha}",
            payload,
            service="github",
            error=GitHubError,
            secrets=[self.token],
            headers=self._headers(),
            policy=self.policy,
            client=self.client,
            replay_safe=True,  # the newest status of a context wins: a repeat changes nothing
            hint=f"check GITHUB_TOKEN (needs commit statuses: write on {owner}/{repo})",
        )

    def _repo_url(self, ref: PullRequestRef) -> str:
        return f"{self.api_url.rstrip('/')}/repos/{ref.owner}/{ref.repo}"

    @staticmethod
    def _fit(body: str) -> str:
        if len(body) > _BODY_MAX:
            note = "\n\n*(cut: the full report is longer than a GitHub comment allows)*"
            body = body[: _BODY_MAX - len(note)] + note
        return body

    def _comment_with(self, ref: PullRequestRef, marker: str) -> int | None:
        """The id of the newest comment of ``ref`` written by the token's own user whose
        body holds ``marker``. Anyone else's comment is never ours, marker or not."""
        me = self.own_login()
        url: str | None = f"{self._repo_url(ref)}/issues/{ref.number}/comments?per_page=100"
        found: int | None = None
        for _ in range(_LOOKUP_PAGES * 10):  # 10,000 comments: far beyond a real PR
            if url is None:
                break
            comments, url = self._page(url, f"list the comments of {ref}")
            for c in comments:
                if (
                    isinstance(c, dict)
                    and _author(c) == me
                    and marker in str(c.get("body") or "")
                    and isinstance(c.get("id"), int)
                ):
                    found = int(c["id"])
        return found

    def _page(self, url: str, what: str) -> tuple[list[Any], str | None]:
        response = self._send("GET", url, None, what)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, list):
            raise GitHubError(f"github GET {mask_endpoint(url)}: {what}: the answer is not a list")
        link = response.links.get("next", {}).get("url")
        return data, str(link) if link else None

    def _idempotent(
        self, method: str, url: str, payload: dict[str, Any] | None, what: str
    ) -> dict[str, Any]:
        response = self._send(method, url, payload, what)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise GitHubError(
                f"github {method} {mask_endpoint(url)}: {what}: the answer is not JSON"
            )
        return data

    def _send(
        self, method: str, url: str, payload: dict[str, Any] | None, what: str
    ) -> httpx.Response:
        """An idempotent request (GET, PATCH of a whole field): retried on failures to
        connect, timeouts, 429 and 5xx; 4xx other than 429 raise at once. Neither the
        token nor the URL's credentials appear in the error."""
        check_http_url(url, f"github {method}", GitHubError, "check FARM_GITHUB_API")
        where = f"github {method} {mask_endpoint(url)}"
        hint = {
            401: "GitHub refused the token (GITHUB_TOKEN is wrong or expired)",
            403: "the token may not do this (needs pull requests, issues and commit statuses "
            "write access), or the rate limit is reached",
            404: "no such repository or pull request, or the token cannot see it",
        }
        reason = "no attempt made"
        http = self.client or httpx.Client(timeout=self.policy.timeout_s)
        try:
            for attempt in range(1, self.policy.attempts + 1):
                try:
                    response = http.request(method, url, json=payload, headers=self._headers())
                except httpx.TransportError as exc:
                    reason = (
                        f"{type(exc).__name__}: "
                        f"{answer_text(str(exc), [self.token]) or 'no detail'}"
                    )
                else:
                    status = response.status_code
                    if 200 <= status < 300:
                        return response
                    excerpt = answer_text(response.text[:300], [self.token])
                    reason = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
                    if 400 <= status < 500 and status != 429:
                        extra = f" ({hint[status]})" if status in hint else ""
                        raise GitHubError(f"{where}: {what}: {reason}{extra}")
                if attempt < self.policy.attempts:
                    delay = self.policy.delay(attempt)
                    log.warning(
                        "%s: attempt %d/%d failed (%s); retrying in %.1f s",
                        where,
                        attempt,
                        self.policy.attempts,
                        reason,
                        delay,
                    )
                    self.policy.sleep(delay)
        finally:
            if self.client is None:
                http.close()
        raise GitHubError(
            f"{where}: {what}: GitHub unreachable or failing after {self.policy.attempts} "
            f"attempt(s): {reason}; check FARM_GITHUB_API and the network"
        )

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
                    reason = answer_text(f"{type(exc).__name__}: {exc}", [self.token])
                    raise GitHubError(
                        f"github GET {mask_endpoint(url)}: an earlier attempt may have posted the "
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


def _author(comment: dict[str, Any]) -> str | None:
    user = comment.get("user")
    login = user.get("login") if isinstance(user, dict) else None
    return login if isinstance(login, str) else None


def _same_text(found: object, body: str) -> bool:
    # GitHub may store the text with CRLF line ends and trimmed.
    return isinstance(found, str) and found.replace("\r\n", "\n").strip() == body.strip()

"""FAKE GitHub REST API: a real HTTP server in a thread, standing in for api.github.com.

Nothing here talks to GitHub. It serves the calls `farm pr` makes and checks their
shapes as GitHub would (the bearer token, the API headers, the JSON body keys), and
records every call so tests can count comment creations, updates and statuses:

- ``GET  /user``                                  (Get the authenticated user)
- ``GET  /repos/{o}/{r}/pulls/{n}``               (Get a pull request)
- ``GET  /repos/{o}/{r}/issues/{n}/comments``     (List issue comments, paginated)
- ``POST /repos/{o}/{r}/issues/{n}/comments``     (Create an issue comment)
- ``PATCH /repos/{o}/{r}/issues/comments/{id}``   (Update an issue comment)
- ``POST /repos/{o}/{r}/statuses/{sha}``          (Create a commit status)

A wrong token gets 401, a request of a bad shape 422, and an update of a comment
someone else wrote 403 (an ordinary token may edit only its own), as GitHub answers
them. ``app_token`` makes ``GET /user`` answer 403, as it does for an app's
installation token.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.receiver import serving

__all__ = ["FakeGitHub", "FakePull", "RecordedCall", "fake_github"]

_STATES = {"error", "failure", "pending", "success"}


@dataclass(frozen=True)
class FakePull:
    head_sha: str
    base_sha: str
    base_ref: str = "main"


@dataclass(frozen=True)
class RecordedCall:
    method: str
    path: str
    body: dict[str, Any] | None
    status: int


@dataclass
class FakeGitHub:
    """The fake's state: its token, pull requests, comments and statuses."""

    token: str
    login: str = "farm-bot"  # the token's own user
    app_token: bool = False
    owner: str = "acme"
    repo: str = "plugin"
    pulls: dict[int, FakePull] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> comment
    statuses: list[dict[str, Any]] = field(default_factory=list)
    calls: list[RecordedCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # shape errors the fake saw
    url: str = ""
    page_size: int = 2  # small, so a test crosses pages
    _next_id: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls_of(self, method: str, pattern: str) -> list[RecordedCall]:
        return [c for c in self.calls if c.method == method and re.search(pattern, c.path)]

    def add_comment(self, number: int, body: str, user: str = "someone-else") -> int:
        """A comment ``user`` wrote (by default someone else: the farm must leave it
        alone)."""
        self._next_id += 1
        self.comments[self._next_id] = {
            "id": self._next_id,
            "number": number,
            "body": body,
            "user": user,
        }
        return self._next_id

    # --- request handling -----------------------------------------------------------

    def handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            status, payload, extra, body = self._handle(method, path, headers, raw)
            self.calls.append(RecordedCall(method, path, body, status))
            return status, payload, extra

    def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str], dict[str, Any] | None]:
        body: dict[str, Any] | None = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return 400, {"message": "Problems parsing JSON"}, {}, None
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}, {}, body
        if headers.get("accept") != "application/vnd.github+json":
            self.problems.append(f"{method} {path}: Accept is {headers.get('accept')!r}")
        route, _, query = path.partition("?")
        if route == "/user" and method == "GET":
            if self.app_token:
                return 403, {"message": "Resource not accessible by integration"}, {}, body
            return 200, {"login": self.login, "id": 1, "type": "User"}, {}, body
        prefix = f"/repos/{self.owner}/{self.repo}"
        if not route.startswith(prefix + "/"):
            return 404, {"message": "Not Found"}, {}, body
        rest = route[len(prefix) :]
        if m := re.fullmatch(r"/pulls/(\d+)", rest):
            return (*self._pull(method, int(m[1])), body)
        if m := re.fullmatch(r"/issues/(\d+)/comments", rest):
            if method == "GET":
                return (*self._list(int(m[1]), query), body)
            return (*self._create(method, int(m[1]), body), body)
        if m := re.fullmatch(r"/issues/comments/(\d+)", rest):
            return (*self._update(method, int(m[1]), body), body)
        if m := re.fullmatch(r"/statuses/([0-9a-f]{40})", rest):
            return (*self._status(method, m[1], body), body)
        return 404, {"message": "Not Found"}, {}, body

    def _pull(self, method: str, number: int) -> tuple[int, Any, dict[str, str]]:
        pull = self.pulls.get(number)
        if method != "GET" or pull is None:
            return 404, {"message": "Not Found"}, {}
        return (
            200,
            {
                "number": number,
                "state": "open",
                "html_url": f"https://github.example/{self.owner}/{self.repo}/pull/{number}",
                "head": {"sha": pull.head_sha, "ref": f"pr-{number}"},
                "base": {"sha": pull.base_sha, "ref": pull.base_ref},
            },
            {},
        )

    def _list(self, number: int, query: str) -> tuple[int, Any, dict[str, str]]:
        if number not in self.pulls:
            return 404, {"message": "Not Found"}, {}
        page = int(m[1]) if (m := re.search(r"(?:^|&)page=(\d+)", query)) else 1
        mine = [c for c in self.comments.values() if c["number"] == number]
        start = (page - 1) * self.page_size
        chunk = mine[start : start + self.page_size]
        extra = {}
        if start + self.page_size < len(mine):
            nxt = f"{self.url}/repos/{self.owner}/{self.repo}/issues/{number}/comments"
            extra["Link"] = f'<{nxt}?per_page=100&page={page + 1}>; rel="next"'
        return 200, [self._shown(c) for c in chunk], extra

    def _create(
        self, method: str, number: int, body: dict[str, Any] | None
    ) -> tuple[int, Any, dict[str, str]]:
        if method != "POST" or number not in self.pulls:
            return 404, {"message": "Not Found"}, {}
        if not body or set(body) != {"body"} or not isinstance(body["body"], str):
            self.problems.append(f"create comment: body keys {sorted(body or {})}")
            return 422, {"message": "Validation Failed"}, {}
        comment_id = self.add_comment(number, body["body"], user=self.login)
        return 201, self._shown(self.comments[comment_id]), {}

    def _update(
        self, method: str, comment_id: int, body: dict[str, Any] | None
    ) -> tuple[int, Any, dict[str, str]]:
        if method != "PATCH" or comment_id not in self.comments:
            return 404, {"message": "Not Found"}, {}
        if not body or set(body) != {"body"} or not isinstance(body["body"], str):
            self.problems.append(f"update comment: body keys {sorted(body or {})}")
            return 422, {"message": "Validation Failed"}, {}
        if self.comments[comment_id]["user"] != self.login:
            return 403, {"message": "Resource not accessible by personal access token"}, {}
        self.comments[comment_id]["body"] = body["body"]
        return 200, self._shown(self.comments[comment_id]), {}

    def _status(
        self, method: str, sha: str, body: dict[str, Any] | None
    ) -> tuple[int, Any, dict[str, str]]:
        if method != "POST":
            return 404, {"message": "Not Found"}, {}
        allowed = {"state", "context", "description", "target_url"}
        if (
            not body
            or body.get("state") not in _STATES
            or not set(body) <= allowed
            or len(str(body.get("description", ""))) > 140
            or "\n" in str(body.get("description", ""))
        ):
            self.problems.append(f"status: body {body}")
            return 422, {"message": "Validation Failed"}, {}
        self.statuses.append({"sha": sha, **body})
        return 201, {"id": len(self.statuses), "sha": sha, **body}, {}

    def _shown(self, c: dict[str, Any]) -> dict[str, Any]:
        html = f"https://github.example/{self.owner}/{self.repo}/pull/{c['number']}"
        return {
            "id": c["id"],
            "body": c["body"],
            "user": {"login": c["user"], "type": "User"},
            "html_url": f"{html}#issuecomment-{c['id']}",
        }


@contextmanager
def fake_github(state: FakeGitHub) -> Iterator[FakeGitHub]:
    """Serve ``state`` on 127.0.0.1 (a free port) while the block runs; ``state.url``
    is the API base URL (what FARM_GITHUB_API is set to)."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, payload, extra = state.handle(self.command, self.path, headers, raw)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as port:
        state.url = f"http://127.0.0.1:{port}"
        yield state

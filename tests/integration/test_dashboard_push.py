"""`farm dashboards push` against a FAKE Grafana: a real HTTP server on 127.0.0.1.

No Grafana can run on this machine, so ``FakeGrafana`` implements only the endpoints
the push calls, the way Grafana's HTTP API documents them: ``GET /api/health``
(no auth), ``GET /api/folders/:uid``, ``POST /api/folders``,
``GET /api/datasources/uid/:uid``, ``POST /api/datasources`` and
``POST /api/dashboards/db``, each checking the bearer token (401 for a wrong one,
403 when told to act as a token without the role) and the payload's contract.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.dashboards import DATASOURCE_TYPE, DATASOURCE_UID, render_files

runner = CliRunner()
TOKEN = "glsa_fake-token-7f3a9c"
STORE_URL = "postgresql://farm:s3cret-pw@db.example:5433/farm?sslmode=require"


@dataclass
class FakeGrafana:
    """What the fake holds and saw. ``forbid`` makes it answer 403 to a good token."""

    token: str = TOKEN
    prefix: str = ""
    forbid: bool = False
    port: int = 0
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def paths(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.calls]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGrafana

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        fake = self.fake
        path = self.path
        if fake.prefix:
            if not path.startswith(fake.prefix + "/"):
                return self._answer(404, {"message": "Not found"})
            path = path[len(fake.prefix) :]
        fake.calls.append((method, path, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        if (method, path) == ("GET", "/api/health"):
            return self._answer(200, {"database": "ok", "version": "11.3.0", "commit": "fake"})
        if self.headers.get("Authorization") != f"Bearer {fake.token}":
            return self._answer(401, {"message": "Invalid API key"})
        if fake.forbid:
            return self._answer(403, {"message": "You'll need additional permissions"})
        if method == "GET" and path.startswith("/api/folders/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in fake.folders:
                return self._answer(404, {"message": "folder not found", "status": "not-found"})
            return self._answer(200, fake.folders[uid])
        if (method, path) == ("POST", "/api/folders"):
            assert body is not None and set(body) <= {"uid", "title", "parentUid"}
            assert body["title"] and body["uid"] not in fake.folders
            folder = {"id": len(fake.folders) + 1, "uid": body["uid"], "title": body["title"]}
            fake.folders[body["uid"]] = folder
            return self._answer(200, folder)
        if method == "GET" and path.startswith("/api/datasources/uid/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in fake.datasources:
                return self._answer(404, {"message": "Data source not found"})
            return self._answer(200, fake.datasources[uid])
        if (method, path) == ("POST", "/api/datasources"):
            assert body is not None and {"name", "type", "access"} <= set(body)
            fake.datasources[body["uid"]] = body
            return self._answer(
                200,
                {"id": 1, "message": "Datasource added", "name": body["name"], "datasource": body},
            )
        if (method, path) == ("POST", "/api/dashboards/db"):
            assert body is not None
            dashboard = body["dashboard"]
            if body.get("folderUid") not in fake.folders:
                return self._answer(400, {"message": "folder not found"})
            if dashboard.get("uid") in fake.dashboards and not body.get("overwrite"):
                return self._answer(
                    412, {"message": "A dashboard with the same uid already exists"}
                )
            fake.dashboards[dashboard["uid"]] = body
            slug = dashboard["title"].lower().replace(" ", "-")
            return self._answer(
                200,
                {
                    "id": len(fake.dashboards),
                    "uid": dashboard["uid"],
                    "url": f"/d/{dashboard['uid']}/{slug}",
                    "status": "success",
                    "version": 1,
                    "slug": slug,
                },
            )
        return self._answer(404, {"message": "Not found"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


def _serve(fake: FakeGrafana) -> Iterator[FakeGrafana]:
    handler = type("FakeGrafanaHandler", (_Handler,), {"fake": fake})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    yield from _serve(FakeGrafana())


def _push(url: str, *args: str, token: str | None = TOKEN, db: str | None = STORE_URL) -> Any:
    return runner.invoke(
        app,
        ["dashboards", "push", "--url", url, *args],
        env={"GRAFANA_TOKEN": token, "FARM_DB_URL": db, "GRAFANA_URL": None, "COLUMNS": "200"},
    )


def _committed_dashboards() -> dict[str, dict[str, Any]]:
    docs = (json.loads(t) for rel, t in render_files().items() if rel.endswith(".json"))
    return {d["uid"]: d for d in docs}


# --- pushing -----------------------------------------------------------------------------


def test_push_creates_folder_and_data_source_then_uploads_every_dashboard(
    grafana: FakeGrafana, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    result = _push(grafana.url)
    assert result.exit_code == 0, result.output
    assert grafana.paths() == [
        ("GET", "/api/health"),
        ("GET", "/api/folders/mtp-farm"),
        ("POST", "/api/folders"),
        ("GET", f"/api/datasources/uid/{DATASOURCE_UID}"),
        ("POST", "/api/datasources"),
        ("POST", "/api/dashboards/db"),
        ("POST", "/api/dashboards/db"),
    ]
    assert all(
        auth == f"Bearer {TOKEN}" for _, path, auth in grafana.calls if path != "/api/health"
    )
    assert grafana.folders["mtp-farm"]["title"] == "MTP farm"

    ds = grafana.datasources[DATASOURCE_UID]
    assert (ds["type"], ds["access"], ds["url"], ds["user"]) == (
        DATASOURCE_TYPE,
        "proxy",
        "db.example:5433",
        "farm",
    )
    assert ds["jsonData"]["database"] == "farm" and ds["jsonData"]["sslmode"] == "require"
    assert ds["secureJsonData"] == {"password": "s3cret-pw"}

    expected = _committed_dashboards()
    assert set(grafana.dashboards) == set(expected)
    for uid, body in grafana.dashboards.items():
        # Grafana's contract: the dashboard model with its uid and no id, overwrite on.
        assert body["overwrite"] is True and body["folderUid"] == "mtp-farm"
        assert body["dashboard"] == expected[uid] and "id" not in body["dashboard"]
    assert f"pushed mtp-acceptance: {grafana.url}/d/mtp-acceptance/" in result.output
    assert "(created)" in result.output and "data source created" in result.output
    assert TOKEN not in result.output and TOKEN not in caplog.text
    assert "s3cret-pw" not in result.output


def test_a_second_push_overwrites_and_creates_nothing_twice(grafana: FakeGrafana) -> None:
    assert _push(grafana.url).exit_code == 0
    grafana.calls.clear()
    again = _push(grafana.url, "--folder", "MTP farm", db=None)  # no store needed now
    assert again.exit_code == 0, again.output
    assert ("POST", "/api/folders") not in grafana.paths()
    assert ("POST", "/api/datasources") not in grafana.paths()
    assert grafana.paths().count(("POST", "/api/dashboards/db")) == 2
    assert "(created)" not in again.output


def test_push_into_another_folder_under_a_url_path() -> None:
    for fake in _serve(FakeGrafana(prefix="/grafana")):
        result = _push(fake.url + "/", "--folder", "Team NPU / nightly")
        assert result.exit_code == 0, result.output
        assert set(fake.folders) == {"team-npu-nightly"}
        assert {b["folderUid"] for b in fake.dashboards.values()} == {"team-npu-nightly"}


# --- failures ---------------------------------------------------------------------------


def test_a_refused_token_is_named_without_echoing_it() -> None:
    for fake in _serve(FakeGrafana(token="the-real-token")):
        result = _push(fake.url)
        assert result.exit_code == 2
        assert "refused the token in GRAFANA_TOKEN (HTTP 401)" in result.output
        assert TOKEN not in result.output
        assert not fake.dashboards


def test_a_token_without_the_role_gets_403_explained() -> None:
    for fake in _serve(FakeGrafana(forbid=True)):
        result = _push(fake.url)
        assert result.exit_code == 2
        assert "(HTTP 403)" in result.output and "Editor role" in result.output
        assert TOKEN not in result.output


def test_an_unreachable_grafana_is_reported() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _push(f"http://127.0.0.1:{port}")
    assert result.exit_code == 2
    assert f"Grafana at http://127.0.0.1:{port} is unreachable" in result.output
    assert TOKEN not in result.output


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:3000", "bad Grafana URL"),
        ("ftp://127.0.0.1:3000", "bad Grafana URL"),
        ("http://:3000", "bad Grafana URL"),
        ("http://127.0.0.1:port", "the port is not a number"),
        ("http://admin:pw@127.0.0.1:3000", "carries credentials"),
    ],
)
def test_a_bad_url_is_refused_before_any_request(url: str, message: str) -> None:
    result = _push(url)
    assert result.exit_code == 2
    assert message in result.output
    assert TOKEN not in result.output and "pw@" not in result.output


def test_a_missing_data_source_needs_the_store_url(grafana: FakeGrafana) -> None:
    result = _push(grafana.url, db=None)
    assert result.exit_code == 2
    assert f"no data source '{DATASOURCE_UID}'" in result.output
    assert not grafana.dashboards
    sqlite = _push(grafana.url, db="sqlite:////tmp/farm.db")
    assert sqlite.exit_code == 2 and "needs the PostgreSQL store" in sqlite.output


def test_something_that_is_not_grafana_is_named() -> None:
    class NotGrafana(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotGrafana)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        result = _push(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert result.exit_code == 2
    assert "not like Grafana's HTTP API" in result.output

"""`farm dashboards push` against a FAKE Grafana: a real HTTP server on 127.0.0.1.

No Grafana can run on this machine, so ``FakeGrafana`` implements only the endpoints
the push calls, the way Grafana's HTTP API documents them: ``GET /api/health``
(no auth), ``GET /api/folders/:uid``, ``POST /api/folders``,
``GET /api/datasources/uid/:uid``, ``POST /api/datasources``,
``POST /api/dashboards/db``, and from the alerting provisioning API
``GET``/``PUT /api/v1/provisioning/alert-rules/:uid``,
``POST /api/v1/provisioning/alert-rules`` and
``GET``/``PUT /api/v1/provisioning/folder/:folderUid/rule-groups/:group``, each checking
the bearer token (401 for a wrong one, 403 when told to act as a token without the
role) and the payload's contract. Alert rules are validated as Grafana 11 does for
the fields it requires (``_rule_problem``); a refused one gets a 400 with a message.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from farm.cli.main import app
from farm.dashboards import DATASOURCE_TYPE, DATASOURCE_UID, AlertRule, alert_rules, render_files
from farm.dashboards.alerting import ALERT_GROUP, ALERT_INTERVAL_S
from farm.dashboards.files import ALERTING_FILE
from tests.fakes.receiver import serving

runner = CliRunner()
TOKEN = "glsa_fake-token-7f3a9c"
STORE_URL = "postgresql://farm:s3cret-pw@db.example:5433/farm?sslmode=require"
RULES = "/api/v1/provisioning/alert-rules"
GROUP = f"/api/v1/provisioning/folder/mtp-farm/rule-groups/{ALERT_GROUP}"
# Grafana's own defaults: unified_alerting's base interval and the interval a rule group
# made by the provisioning API gets (default_rule_evaluation_interval).
BASE_INTERVAL_S = 10
DEFAULT_GROUP_INTERVAL_S = 60
_UID = re.compile(r"[A-Za-z0-9_-]{1,40}")  # Grafana's util.IsValidShortUID and MaxUIDLength
_DURATION = re.compile(r"0|(\d+(ms|s|m|h|d|w|y))+")  # Prometheus model.ParseDuration
NO_DATA_STATES = {"Alerting", "NoData", "OK", "KeepLast"}
EXEC_ERR_STATES = {"Alerting", "Error", "OK", "KeepLast"}


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
    alert_rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (folder uid, group name) -> evaluation interval in seconds
    rule_groups: dict[tuple[str, str], int] = field(default_factory=dict)
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def paths(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.calls]

    def alert_paths(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.paths() if p.startswith("/api/v1/provisioning/")]

    def save_rule(self, rule: dict[str, Any]) -> dict[str, Any]:
        stored = {**rule, "id": rule.get("id") or len(self.alert_rules) + 1, "provenance": "api"}
        self.alert_rules[rule["uid"]] = stored
        group = (rule["folderUID"], rule["ruleGroup"])
        self.rule_groups.setdefault(group, DEFAULT_GROUP_INTERVAL_S)
        return stored

    def group_rules(self, folder: str, group: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.alert_rules.values()
            if (r["folderUID"], r["ruleGroup"]) == (folder, group)
        ]


def _rule_problem(fake: FakeGrafana, rule: Any) -> str | None:
    """Why Grafana would refuse ``rule`` (a ProvisionedAlertRule), or None."""
    if not isinstance(rule, dict):
        return "invalid rule specification: not an object"
    uid = rule.get("uid")
    if not isinstance(uid, str) or not _UID.fullmatch(uid):
        return f"invalid alert rule: UID {uid!r} is invalid (at most 40 of a-z A-Z 0-9 - _)"
    for key in ("title", "condition", "folderUID", "ruleGroup", "for"):
        if not isinstance(rule.get(key), str) or not rule[key]:
            return f"invalid alert rule: {key} is required"
    if not isinstance(rule.get("orgID"), int):
        return "invalid alert rule: orgID is required"
    data = rule.get("data")
    if not isinstance(data, list) or not data:
        return "invalid alert rule: no queries or expressions are found"
    ref_ids = []
    for query in data:
        if not isinstance(query, dict) or not query.get("refId"):
            return "invalid alert rule: a query has no refId"
        ref_ids.append(query["refId"])
        ds = query.get("datasourceUid")
        if not ds:
            return f"invalid alert rule: query {query['refId']} has no datasourceUid"
        if ds != "__expr__" and ds not in fake.datasources:
            return f"failed to build query '{query['refId']}': data source not found"
        if not isinstance(query.get("model"), dict):
            return f"invalid alert rule: query {query['refId']} has no model"
    if len(set(ref_ids)) != len(ref_ids):
        return "invalid alert rule: refIds are not unique"
    if rule["condition"] not in ref_ids:
        return (
            f"invalid alert rule: condition {rule['condition']} does not exist, "
            f"must be one of [{','.join(ref_ids)}]"
        )
    if rule["folderUID"] not in fake.folders:
        return f"invalid alert rule: folder {rule['folderUID']} does not exist"
    if not _DURATION.fullmatch(rule["for"]):
        return f"invalid alert rule: not a valid duration string: {rule['for']!r}"
    if rule.get("noDataState") not in NO_DATA_STATES:
        return f"invalid alert rule: unknown NoData state option {rule.get('noDataState')}"
    if rule.get("execErrState") not in EXEC_ERR_STATES:
        return f"invalid alert rule: unknown Error state option {rule.get('execErrState')}"
    for key in ("labels", "annotations"):
        value = rule.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return f"invalid alert rule: {key} must map strings to strings"
    return None


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
        if path.startswith("/api/v1/provisioning/"):
            return self._alerting(method, path, body)
        return self._answer(404, {"message": "Not found"})

    def _alerting(self, method: str, path: str, body: Any) -> None:
        fake = self.fake
        if method == "GET" and path.startswith(RULES + "/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in fake.alert_rules:
                return self._empty(404)  # Grafana 11 answers a missing rule with no body
            return self._answer(200, fake.alert_rules[uid])
        if (method, path) == ("POST", RULES):
            problem = _rule_problem(fake, body)
            if problem:
                return self._answer(400, {"message": problem})
            clash = [
                r
                for r in fake.alert_rules.values()
                if r["uid"] == body["uid"]
                or (r["folderUID"], r["title"]) == (body["folderUID"], body["title"])
            ]
            if clash:
                return self._answer(409, {"message": "a conflicting alert rule is found"})
            return self._answer(201, fake.save_rule(body))
        if method == "PUT" and path.startswith(RULES + "/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in fake.alert_rules:
                return self._answer(404, {"message": "could not find alert rule"})
            problem = _rule_problem(fake, {**body, "uid": uid})
            if problem:
                return self._answer(400, {"message": problem})
            previous = fake.alert_rules[uid]
            return self._answer(200, fake.save_rule({**body, "uid": uid, "id": previous["id"]}))
        match = re.fullmatch(r"/api/v1/provisioning/folder/([^/]+)/rule-groups/([^/]+)", path)
        if match and method == "GET":
            folder, group = match.groups()
            rules = fake.group_rules(folder, group)
            if not rules:
                return self._answer(404, {"message": "rule group not found"})
            interval = fake.rule_groups[(folder, group)]
            return self._answer(
                200, {"title": group, "folderUid": folder, "interval": interval, "rules": rules}
            )
        if match and method == "PUT":
            folder, group = match.groups()
            interval = body.get("interval")
            if not isinstance(interval, int) or interval <= 0 or interval % BASE_INTERVAL_S:
                return self._answer(
                    400,
                    {"message": f"interval must be a multiple of {BASE_INTERVAL_S}s: {interval}"},
                )
            for rule in body.get("rules", []):
                problem = _rule_problem(fake, rule)
                if problem is None and (rule["folderUID"], rule["ruleGroup"]) != (folder, group):
                    problem = "invalid alert rule: rule is not in the group of the URL"
                if problem:
                    return self._answer(400, {"message": problem})
            # The body's rules replace the group's: one the body lacks is deleted.
            kept = {r["uid"] for r in body.get("rules", [])}
            for rule in fake.group_rules(folder, group):
                if rule["uid"] not in kept:
                    del fake.alert_rules[rule["uid"]]
            for rule in body.get("rules", []):
                fake.save_rule(rule)
            fake.rule_groups[(folder, group)] = interval
            return self._answer(200, {**body, "rules": fake.group_rules(folder, group)})
        return self._answer(404, {"message": "Not found"})

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")


def _serve(fake: FakeGrafana) -> Iterator[FakeGrafana]:
    handler = type("FakeGrafanaHandler", (_Handler,), {"fake": fake})
    with serving(handler) as fake.port:
        yield fake


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


def _committed_rules() -> dict[str, dict[str, Any]]:
    (group,) = yaml.safe_load(render_files()[ALERTING_FILE])["groups"]
    return {r["uid"]: r for r in group["rules"]}


def _rule_payload() -> dict[str, Any]:
    """A rule as the push sends it, for the fake's validation (folder mtp-farm exists)."""
    return alert_rules()[0].render_for_api("mtp-farm")


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
        ("GET", f"{RULES}/mtp-farm-open-alerts"),
        ("POST", RULES),
        ("GET", f"{RULES}/mtp-farm-latest-sweep-failed-cells"),
        ("POST", RULES),
        ("GET", GROUP),
        ("PUT", GROUP),
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
        assert {r["folderUID"] for r in fake.alert_rules.values()} == {"team-npu-nightly"}
        assert fake.rule_groups == {("team-npu-nightly", ALERT_GROUP): ALERT_INTERVAL_S}


# --- alert rules ------------------------------------------------------------------------


def test_first_push_creates_the_alert_rules_file_provisioning_has(grafana: FakeGrafana) -> None:
    result = _push(grafana.url)
    assert result.exit_code == 0, result.output
    committed = _committed_rules()
    assert set(grafana.alert_rules) == set(committed)
    for uid, stored in grafana.alert_rules.items():
        sent = {k: v for k, v in stored.items() if k not in ("id", "provenance")}
        # The API's rule is the provisioned file's rule plus where it lives.
        assert sent == {
            **committed[uid],
            "folderUID": "mtp-farm",
            "ruleGroup": ALERT_GROUP,
            "orgID": 1,
        }
    assert grafana.rule_groups == {("mtp-farm", ALERT_GROUP): ALERT_INTERVAL_S}
    assert "created alert rule mtp-farm-open-alerts: Open farm alerts" in result.output
    assert (
        "created alert rule mtp-farm-latest-sweep-failed-cells: Latest sweep has failed cells"
        in result.output
    )
    assert "updated alert rule" not in result.output


def test_a_second_push_updates_the_alert_rules_without_duplicating_them(
    grafana: FakeGrafana,
) -> None:
    assert _push(grafana.url).exit_code == 0
    first_ids = {uid: r["id"] for uid, r in grafana.alert_rules.items()}
    grafana.calls.clear()
    again = _push(grafana.url, db=None)
    assert again.exit_code == 0, again.output
    assert ("POST", RULES) not in grafana.alert_paths()
    assert grafana.alert_paths().count(("PUT", f"{RULES}/mtp-farm-open-alerts")) == 1
    assert ("PUT", GROUP) not in grafana.alert_paths()  # the interval is already right
    assert {uid: r["id"] for uid, r in grafana.alert_rules.items()} == first_ids
    assert again.output.count("updated alert rule") == 2
    assert "created alert rule" not in again.output


def test_setting_the_interval_keeps_a_teams_own_rule_in_the_group(grafana: FakeGrafana) -> None:
    grafana.folders["mtp-farm"] = {"id": 1, "uid": "mtp-farm", "title": "MTP farm"}
    grafana.datasources[DATASOURCE_UID] = {"uid": DATASOURCE_UID}
    own = {**_rule_payload(), "uid": "team-own-rule", "title": "Our own rule"}
    grafana.save_rule(own)
    result = _push(grafana.url)
    assert result.exit_code == 0, result.output
    assert ("PUT", GROUP) in grafana.alert_paths()
    assert set(grafana.alert_rules) == {"team-own-rule", *_committed_rules()}
    assert grafana.rule_groups[("mtp-farm", ALERT_GROUP)] == ALERT_INTERVAL_S


def test_no_alerts_pushes_the_dashboards_only(grafana: FakeGrafana) -> None:
    result = _push(grafana.url, "--no-alerts")
    assert result.exit_code == 0, result.output
    assert set(grafana.dashboards) == set(_committed_dashboards())
    assert grafana.alert_paths() == []
    assert not grafana.alert_rules and "alert rule" not in result.output


def test_a_rule_grafana_refuses_is_named_with_grafanas_reason(
    grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, _ = alert_rules()
    too_long = AlertRule(
        uid="mtp-farm-" + "x" * 40,
        title="A rule with a uid too long",
        sql="SELECT 'x' AS job, 1::float8 AS n",
        severity="warning",
        summary="s",
        description="d",
    )
    monkeypatch.setattr("farm.cli.dashboards.alert_rules", lambda: (good, too_long))
    result = _push(grafana.url)
    assert result.exit_code == 2
    out = " ".join(result.output.split())  # rich wraps the error line
    assert (
        f"refused to save alert rule 'A rule with a uid too long' (uid {too_long.uid}) "
        "(HTTP 400): invalid alert rule: UID" in out
    )
    assert "--no-alerts" in out and "farm/dashboards/alerting.py" in out
    assert TOKEN not in result.output
    # What came before the refused rule was saved and reported.
    assert "pushed mtp-acceptance" in out and f"created alert rule {good.uid}" in out
    assert set(grafana.alert_rules) == {good.uid}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"uid": ""}, "UID '' is invalid"),
        ({"uid": "has space"}, "is invalid"),
        ({"title": ""}, "title is required"),
        ({"condition": "Z"}, "condition Z does not exist, must be one of [A,B,C]"),
        ({"data": []}, "no queries or expressions"),
        ({"data": [{"refId": "A", "model": {}}]}, "query A has no datasourceUid"),
        ({"folderUID": "nope"}, "folder nope does not exist"),
        ({"ruleGroup": None}, "ruleGroup is required"),
        ({"for": "five minutes"}, "not a valid duration"),
        ({"noDataState": "No Data"}, "unknown NoData state option No Data"),
        ({"execErrState": "Failing"}, "unknown Error state option Failing"),
        ({"orgID": None}, "orgID is required"),
    ],
)
def test_the_fake_refuses_rules_grafana_refuses(change: dict[str, Any], problem: str) -> None:
    fake = FakeGrafana(folders={"mtp-farm": {"uid": "mtp-farm"}})
    fake.datasources[DATASOURCE_UID] = {"uid": DATASOURCE_UID}
    assert _rule_problem(fake, _rule_payload()) is None
    refusal = _rule_problem(fake, {**_rule_payload(), **change})
    assert refusal is not None and problem in refusal


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

    with serving(NotGrafana) as port:
        result = _push(f"http://127.0.0.1:{port}")
    assert result.exit_code == 2
    assert "not like Grafana's HTTP API" in result.output

"""Grafana dashboards and alert rules as code: structure, committed files, interpolation.

Pure: no database and no Grafana. The queries themselves are run against a real
PostgreSQL in ``tests/integration/test_dashboard_queries.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.models import alerting as alerting_models
from typer.testing import CliRunner

from farm.cli.main import app
from farm.dashboards import (
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    Dashboard,
    Panel,
    alert_rules,
    all_dashboards,
    render_files,
    stale_files,
)
from farm.dashboards.alerting import ALERT_GROUP, ALERT_INTERVAL_S
from farm.dashboards.files import (
    ALERTING_FILE,
    DASHBOARD_PROVIDER_FILE,
    DATASOURCE_FILE,
    default_out_dir,
)
from farm.dashboards.macros import interpolate, referenced_variables
from farm.dashboards.model import sdk_problems

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
DAY = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, 12, 30, tzinfo=UTC))


def _dashboard_docs() -> list[dict[str, Any]]:
    return [json.loads(t) for rel, t in render_files().items() if rel.endswith(".json")]


def _yaml(rel: str) -> Any:
    return yaml.safe_load(render_files()[rel])


# --- dashboard structure -----------------------------------------------------------------


def test_dashboards_have_the_panels_a_team_needs() -> None:
    titles = {d["title"]: [p["title"] for p in d["panels"]] for d in _dashboard_docs()}
    assert set(titles) == {"MTP acceptance overview", "Farm health"}
    assert "Mean acceptance length (AL) per cell key" in titles["MTP acceptance overview"]
    assert "Latest sweep: acceptance per draft position" in titles["MTP acceptance overview"]
    assert {"Open alerts", "Open alerts by state", "Alert triage"} <= set(titles["Farm health"])
    overview = next(d for d in _dashboard_docs() if d["title"] == "MTP acceptance overview")
    names = [v["name"] for v in overview["templating"]["list"]]
    assert names == ["job", "engine", "model", "graph_mode", "mtp_depth", "thinking"]
    assert all(v["type"] == "query" for v in overview["templating"]["list"])


@pytest.mark.parametrize("doc", _dashboard_docs(), ids=lambda d: d["uid"])
def test_panels_have_unique_ids_and_fit_the_grid_without_overlap(doc: dict[str, Any]) -> None:
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    taken: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert set(g) == {"x", "y", "w", "h"}
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"panel {p['title']!r} overlaps another"
        taken |= cells


@pytest.mark.parametrize("doc", _dashboard_docs(), ids=lambda d: d["uid"])
def test_every_panel_and_variable_queries_the_farm_data_source(doc: dict[str, Any]) -> None:
    ref = {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
    for p in doc["panels"]:
        assert p["datasource"] == ref, p["title"]
        assert len(p["targets"]) == 1
        (target,) = p["targets"]
        assert target["datasource"] == ref and target["rawQuery"] is True
        assert target["format"] in ("time_series", "table")
        assert target["rawSql"].lstrip().upper().startswith(("SELECT", "WITH"))
        if target["format"] == "time_series":
            assert re.search(r'AS "time"', target["rawSql"]), p["title"]
    for v in doc["templating"]["list"]:
        assert v["datasource"] == ref, v["name"]


@pytest.mark.parametrize("doc", _dashboard_docs(), ids=lambda d: d["uid"])
def test_sql_uses_only_defined_variables_and_known_macros(doc: dict[str, Any]) -> None:
    """A variable may use only variables defined before it (Grafana resolves them in
    order); a panel any of them. Interpolation refuses any other $ form."""
    defined: list[str] = []
    for v in doc["templating"]["list"]:
        assert referenced_variables(v["query"]) <= set(defined), v["name"]
        defined.append(v["name"])
        interpolate(v["query"], DAY, {n: ["x"] for n in defined})
    for p in doc["panels"]:
        sql = p["targets"][0]["rawSql"]
        assert referenced_variables(sql) <= set(defined), p["title"]
        assert "$" not in interpolate(sql, DAY, {n: ["x"] for n in defined})
    all_sql = " ".join(p["targets"][0]["rawSql"] for p in doc["panels"])
    assert set(defined) <= referenced_variables(all_sql), "a variable no panel uses"


# Tables that grow with every sweep: a query that reads them must be bounded by the
# time range, a LIMIT or (alert rules) a fixed window, or it slows down month by month.
_HISTORY_TABLES = {
    "sweep",
    "cell",
    "excluded_cell",
    "variant_run",
    "metric",
    "request_numbers",
    "variant_summary",
    "verdict",
}
_READS = re.compile(r"\b(?:FROM|JOIN)\s+([a-z_]+)\b", re.IGNORECASE)
# "JOIN sweep s ON s.id = a.last_sweep_id": one row per row already read, not a scan.
_KEY_LOOKUP = re.compile(r"\bJOIN\s+sweep\s+(\w+)\s+ON\s+\1\.id\s*=\s*\w+\.\w+", re.IGNORECASE)
_BOUNDS = (r"\$__timeFilter\(", r"\bLIMIT\s+\d+", r"now\(\)\s*-\s*interval\s+'\d+ days'")


def _every_query() -> list[tuple[str, str]]:
    """``(where, sql)`` of every panel, variable and alert rule, as generated."""
    queries = [
        (f"{doc['uid']}/{p['title']}", p["targets"][0]["rawSql"])
        for doc in _dashboard_docs()
        for p in doc["panels"]
    ]
    queries += [
        (f"{doc['uid']}/${v['name']}", v["query"])
        for doc in _dashboard_docs()
        for v in doc["templating"]["list"]
    ]
    (group,) = _yaml(ALERTING_FILE)["groups"]
    queries += [(f"alert/{r['title']}", r["data"][0]["model"]["rawSql"]) for r in group["rules"]]
    return queries


@pytest.mark.parametrize(("where", "sql"), _every_query(), ids=[w for w, _ in _every_query()])
def test_every_query_that_reads_history_is_bounded(where: str, sql: str) -> None:
    scanned = set(_READS.findall(_KEY_LOOKUP.sub("", sql))) & _HISTORY_TABLES
    if scanned:
        assert any(re.search(b, sql) for b in _BOUNDS), f"{where} reads {scanned} unbounded"


def test_the_bound_check_catches_an_unbounded_query() -> None:
    unbounded = "SELECT s.job FROM sweep s GROUP BY s.job ORDER BY max(s.id) DESC"
    scanned = set(_READS.findall(_KEY_LOOKUP.sub("", unbounded))) & _HISTORY_TABLES
    assert scanned == {"sweep"} and not any(re.search(b, unbounded) for b in _BOUNDS)
    by_key = "SELECT a.id FROM alert a JOIN sweep s ON s.id = a.last_sweep_id"
    assert not set(_READS.findall(_KEY_LOOKUP.sub("", by_key))) & _HISTORY_TABLES


@pytest.mark.parametrize("doc", _dashboard_docs(), ids=lambda d: d["uid"])
def test_variables_follow_the_time_range(doc: dict[str, Any]) -> None:
    for v in doc["templating"]["list"]:
        assert "$__timeFilter(" in v["query"], v["name"]
        assert v["refresh"] == 2, v["name"]  # re-run when the time range changes


def test_cell_key_never_includes_the_build() -> None:
    for doc in _dashboard_docs():
        for p in doc["panels"]:
            sql = p["targets"][0]["rawSql"]
            # The build table, its id or the sweep-build link; "build_failed" is a status.
            assert not re.search(r"\bbuild(_id)?\b|sweep_build", sql), p["title"]


def test_a_row_wider_than_the_grid_is_refused() -> None:
    wide = Panel(title="w", kind="table", sql="SELECT 1", width=13)
    with pytest.raises(ValueError, match="wider than 24"):
        Dashboard(uid="x", title="x", description="", rows=((wide, wide),)).render()


# --- committed files ---------------------------------------------------------------------


def test_committed_files_equal_the_generated_ones() -> None:
    assert stale_files(default_out_dir()) == {}, "run `farm dashboards build`"
    assert default_out_dir() == REPO / "dashboards"


def test_build_then_check_and_check_finds_drift(tmp_path: Path) -> None:
    out = tmp_path / "dash"
    built = runner.invoke(app, ["dashboards", "build", "--out", str(out)])
    assert built.exit_code == 0, built.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(
        render_files()
    )
    ok = runner.invoke(app, ["dashboards", "check", "--out", str(out)])
    assert ok.exit_code == 0 and "match the code" in ok.output
    (out / "mtp-acceptance.json").write_text("{}\n")
    (out / DATASOURCE_FILE).unlink()
    (out / "old-dashboard.json").write_text("{}\n")
    (out / "provisioning" / "alerting" / "team-contact.yaml").write_text("apiVersion: 1\n")
    bad = runner.invoke(app, ["dashboards", "check", "--out", str(out)])
    assert bad.exit_code == 1
    assert "mtp-acceptance.json: differs" in bad.output
    assert "datasources/farm.yaml: missing" in bad.output
    assert "old-dashboard.json: not generated" in bad.output
    assert "team-contact" not in bad.output  # a team's own files are theirs
    assert "3 generated file(s) out of date" in bad.output


def test_the_generated_dashboards_are_what_grafanas_sdk_models_hold() -> None:
    for dashboard in all_dashboards():
        document = dashboard.render()
        assert sdk_problems(document) == [], dashboard.uid
        # Every SQL target reads back as the farm's PostgreSQL query, not a bag of keys.
        panel = document["panels"][0]
        assert panel["targets"][0]["rawSql"] and panel["targets"][0]["rawQuery"] is True


def test_alert_rules_are_what_grafanas_sdk_models_hold() -> None:
    for rule in alert_rules():
        assert sdk_problems(rule.render_for_api("folder"), alerting_models.Rule) == []
    document = alert_rules()[0].render_for_api("folder")
    document["data"][0]["relativeTimeRange"]["form"] = 1
    assert sdk_problems(document, alerting_models.Rule) == [
        "data[0].relativeTimeRange.form: not in the SDK's model (dropped)"
    ]


def test_a_key_the_sdk_does_not_model_is_named_by_its_path() -> None:
    document = all_dashboards()[0].render()
    # The round trip checks keys, not values: the SDK's models keep an enum value
    # they do not know as it is.
    document["panels"][1]["options"]["legend"]["bogus"] = 1
    document["panels"][2]["fieldConfig"]["defaults"]["custom"]["drawStlye"] = "bars"
    document["templating"]["list"][0]["refreshes"] = 2
    assert sdk_problems(document) == [  # in the document's order
        "templating.list[0].refreshes: not in the SDK's model (dropped)",
        "panels[1].options.legend.bogus: not in the SDK's model (dropped)",
        "panels[2].fieldConfig.defaults.custom.drawStlye: not in the SDK's model (dropped)",
    ]


def test_panels_keep_grafanas_legend_and_tooltip_where_they_name_none() -> None:
    # The SDK's typed options start with the legend hidden; Grafana's editor shows it.
    health = {p["title"]: p for p in all_dashboards()[1].render()["panels"]}
    legend = health["Sweeps per day by status"]["options"]["legend"]
    assert legend["showLegend"] is True and legend["placement"] == "bottom"


def test_rendering_is_deterministic() -> None:
    assert render_files() == render_files()
    assert [d.uid for d in all_dashboards()] == ["mtp-acceptance", "mtp-farm-health"]


# --- provisioning -------------------------------------------------------------------------


def test_datasource_provisioning_reads_connection_from_the_environment() -> None:
    doc = _yaml(DATASOURCE_FILE)
    assert doc["apiVersion"] == 1
    (ds,) = doc["datasources"]
    assert (ds["uid"], ds["type"]) == (DATASOURCE_UID, DATASOURCE_TYPE)
    assert ds["url"] == "${FARM_DB_HOST}" and ds["user"] == "${FARM_DB_USER}"
    assert ds["jsonData"]["database"] == "${FARM_DB_NAME}"
    assert ds["secureJsonData"] == {"password": "${FARM_DB_PASSWORD}"}
    # Every variable it reads is set for Grafana by the compose file.
    text = render_files()[DATASOURCE_FILE]
    used = set(re.findall(r"\$\{(\w+)\}", text))
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yaml").read_text())
    grafana = compose["services"]["grafana"]
    assert used <= set(grafana["environment"]), used - set(grafana["environment"])


def test_dashboard_provider_points_at_the_mounted_folder() -> None:
    (provider,) = _yaml(DASHBOARD_PROVIDER_FILE)["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"../dashboards:{provider['options']['path']}:ro" in mounts
    assert "../dashboards/provisioning:/etc/grafana/provisioning:ro" in mounts


def test_alert_rules_parse_and_query_the_farm_data_source() -> None:
    doc = _yaml(ALERTING_FILE)
    assert doc["apiVersion"] == 1
    (group,) = doc["groups"]
    assert group["folder"] and group["interval"]
    titles = {r["title"] for r in group["rules"]}
    assert titles == {"Open farm alerts", "Latest sweep has failed cells"}
    uids = [r["uid"] for r in group["rules"]]
    assert len(set(uids)) == len(uids)
    for rule in group["rules"]:
        refs = {d["refId"]: d for d in rule["data"]}
        assert rule["condition"] in refs
        query = refs["A"]
        assert query["datasourceUid"] == DATASOURCE_UID
        assert query["model"]["format"] == "table"
        # Alerting has no dashboard variables or time macros to interpolate.
        assert "$" not in query["model"]["rawSql"]
        assert all(d["datasourceUid"] == "__expr__" for r, d in refs.items() if r != "A")
        (cond,) = refs["C"]["model"]["conditions"]
        assert cond["evaluator"] == {"type": "gt", "params": [0]}
        assert rule["labels"]["team"] == "mtp-farm"
        # Provisioning would expand "$..." in labels as environment variables.
        assert "$" not in json.dumps(rule["labels"]) + json.dumps(rule["annotations"])
    assert "contactPoints" not in doc  # left for the team (documented in the header)
    assert "contact point" in render_files()[ALERTING_FILE].lower()


def test_alert_rules_for_the_api_are_the_file_rules_placed_in_folder_and_group() -> None:
    (group,) = _yaml(ALERTING_FILE)["groups"]
    assert (group["name"], group["interval"]) == (ALERT_GROUP, "5m")
    assert ALERT_INTERVAL_S == 300 and ALERT_INTERVAL_S % 10 == 0  # Grafana's base interval
    for rule in alert_rules():
        assert rule.render_for_api("some-folder") == {
            **rule.render(),
            "folderUID": "some-folder",
            "ruleGroup": ALERT_GROUP,
            "orgID": 1,
        }
        # Grafana refuses a uid longer than 40 or with other characters (400 on push).
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", rule.uid), rule.uid


# --- interpolation -------------------------------------------------------------------------


def test_interpolation_follows_grafanas_sql_formats() -> None:
    sql = (
        "SELECT 1 WHERE $__timeFilter(s.started_at) AND a > $__timeFrom() "
        "AND b < $__timeTo() AND j IN (${job:sqlstring})"
    )
    out = interpolate(sql, DAY, {"job": ["night's", "pr"]})
    assert out == (
        "SELECT 1 WHERE s.started_at BETWEEN '2026-03-01T00:00:00Z' AND "
        "'2026-03-02T12:30:00Z' AND a > '2026-03-01T00:00:00Z' AND "
        "b < '2026-03-02T12:30:00Z' AND j IN ('night''s','pr')"
    )
    # Bounds in another zone are sent as UTC; a value may itself hold a "$".
    east = tuple(t.astimezone(datetime.now().astimezone().tzinfo) for t in DAY)
    assert interpolate("$__timeFrom()", (east[0], east[1]), {}) == "'2026-03-01T00:00:00Z'"
    assert interpolate("${j:sqlstring}", DAY, {"j": ["$x"]}) == "'$x'"


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        ("SELECT ${nope:sqlstring}", "not a dashboard variable"),
        ("SELECT $job", "unsupported"),
        ("SELECT ${job:csv}", "unsupported"),
        ("SELECT $__timeGroup(t, '1h')", "unsupported"),
        ("SELECT ${job:sqlstring}", "has no value"),
    ],
)
def test_interpolation_refuses_forms_it_does_not_model(sql: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        interpolate(sql, DAY, {"job": []})


def test_interpolation_refuses_naive_time_bounds() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        interpolate("$__timeFrom()", (datetime(2026, 1, 1), datetime.now(UTC)), {})


# --- CLI and imports ----------------------------------------------------------------------


def test_push_without_a_token_is_refused_before_any_request() -> None:
    result = runner.invoke(
        app,
        ["dashboards", "push", "--url", "http://127.0.0.1:9"],
        env={"GRAFANA_TOKEN": "", "FARM_DB_URL": None},
    )
    assert result.exit_code == 2
    assert "set GRAFANA_TOKEN" in result.output


def test_the_cli_does_not_import_the_grafana_client_until_push() -> None:
    code = "import sys, farm.cli.main, farm.dashboards; print('grafana_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""The "Farm health" dashboard: are sweeps running, which cells fail, what is open."""

from __future__ import annotations

from farm.dashboards import queries as q
from farm.dashboards.model import Dashboard, Panel, QueryVariable

__all__ = [
    "HEALTH_UID",
    "NIGHTLY_VERDICTS",
    "PR_VERDICTS",
    "farm_health",
    "latest_spread_panel",
    "nightly_verdicts_panel",
    "pr_verdicts_panel",
    "stored_spread_panel",
]

HEALTH_UID = "mtp-farm-health"

_RED_ABOVE_ZERO = {
    "color": {"mode": "thresholds"},
    "thresholds": {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
    },
}
_STAT_OPTIONS = {
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    "colorMode": "background",
    "graphMode": "none",
    "textMode": "value",
}
_BARS = {"custom": {"drawStyle": "bars", "fillOpacity": 80, "stacking": {"mode": "normal"}}}


def _trouble_count(title: str, sql: str, description: str) -> Panel:
    """A small stat panel of a count that should be zero: red from one up."""
    return Panel(
        title=title,
        kind="stat",
        sql=sql,
        description=description,
        width=6,
        height=4,
        defaults=_RED_ABOVE_ZERO,
        options=_STAT_OPTIONS,
    )


# Verdicts of `farm nightly` and `farm pr` (table ``verdict``, farm.store.verdicts),
# coloured by outcome; the time range bounds them like every other panel here.
_VERDICT_COLORS = {
    "matcher": {"id": "byName", "options": "verdict"},
    "properties": [
        {"id": "custom.cellOptions", "value": {"type": "color-background"}},
        {
            "id": "mappings",
            "value": [
                {
                    "type": "value",
                    "options": {
                        "clean": {"color": "green", "index": 0},
                        "regression": {"color": "red", "index": 1},
                        "failed_cells": {"color": "orange", "index": 2},
                    },
                }
            ],
        },
    ],
}

NIGHTLY_VERDICTS = """SELECT s.id AS sweep, s.job, s.started_at AS started, v.outcome AS verdict,
  json_array_length(v.findings) AS findings, v.baseline_sweep_ids::text AS "baseline sweeps",
  v.created_at AS judged
FROM verdict v
JOIN sweep s ON s.id = v.sweep_id
WHERE v.kind = 'nightly'
  AND $__timeFilter(s.started_at)
  AND s.job IN (${job:sqlstring})
ORDER BY s.id DESC
LIMIT 14"""

PR_VERDICTS = """SELECT v.pr_number AS "PR", v.engine, left(v.head_sha, 12) AS "head",
  v.outcome AS verdict, json_array_length(v.findings) AS findings,
  json_array_length(v.reused_cells) AS "reused cells", s.id AS sweep, s.job,
  v.created_at AS judged
FROM verdict v
JOIN sweep s ON s.id = v.sweep_id
WHERE v.kind = 'pr'
  AND $__timeFilter(v.created_at)
  AND s.job IN (${job:sqlstring})
ORDER BY v.created_at DESC, v.id DESC"""


def nightly_verdicts_panel() -> Panel:
    """The job's last 14 nightlies in the time range, one row per night with its verdict."""
    return Panel(
        title="Last 14 nightlies: verdict per night",
        kind="table",
        sql=NIGHTLY_VERDICTS,
        description="`farm nightly` verdicts: clean, regression (alerts raised) or "
        "failed_cells, with the last good night each was compared with.",
        width=12,
        height=8,
        overrides=(_VERDICT_COLORS,),
    )


def pr_verdicts_panel() -> Panel:
    """PR validations in the time range, newest first, one row per run with its verdict."""
    return Panel(
        title="PR validations: verdict per PR",
        kind="table",
        sql=PR_VERDICTS,
        description="`farm pr` verdicts: the PR, engine and head commit validated, and how "
        "many baseline cells were reused from stored nightlies.",
        width=12,
        height=8,
        overrides=(_VERDICT_COLORS,),
    )


def stored_spread_panel() -> Panel:
    """Each key's stored night-to-night AL sd, relative to its AL, at each night."""
    return Panel(
        title="Stored AL night-to-night sd by key",
        kind="timeseries",
        format="time_series",
        sql=q.STORED_SPREAD_BY_SWEEP,
        description=(
            "The spread each night's verdict stored per key (`farm nightly`, A/A nights "
            "included): the robust night-to-night sd the AL thresholds are calibrated "
            "with, over the job's last `nightly.history` nights, relative to AL."
        ),
        width=12,
        height=8,
        unit="percentunit",
        defaults={"custom": {"drawStyle": "line", "showPoints": "always"}},
    )


def latest_spread_panel() -> Panel:
    """Each key's latest stored spread, its greedy flip rate and A/A false alarms."""
    return Panel(
        title="Latest stored spread per key",
        kind="table",
        sql=q.LATEST_STORED_SPREAD,
        description=(
            "Each key's spread as its newest night stored it: AL sd relative to AL, "
            "accuracy sd, the share of prompts whose greedy output changed from night to "
            "night, and the false alarms of its A/A nights (`farm nightly --aa`)."
        ),
        width=12,
        height=8,
        overrides=(
            {
                "matcher": {"id": "byName", "options": "AL sd, relative"},
                "properties": [{"id": "unit", "value": "percentunit"}],
            },
            {
                "matcher": {"id": "byName", "options": "flip rate"},
                "properties": [{"id": "unit", "value": "percentunit"}],
            },
        ),
    )


def farm_health() -> Dashboard:
    """Sweeps by status, failed cells with their errors, cell durations by node, and
    the store's open alerts."""
    return Dashboard(
        uid=HEALTH_UID,
        title="Farm health",
        description="Sweeps, failed cells, cell durations by node and open farm alerts.",
        tags=("mtp-farm", "health"),
        variables=(QueryVariable(name="job", label="job", sql=q.VARIABLE_JOBS),),
        rows=(
            _trouble_row(),
            (nightly_verdicts_panel(), pr_verdicts_panel()),
            (_sweeps_panel(),),
            (_failed_cells_panel(),),
            _durations_row(),
            _alert_state_row(),
            _device_hours_row(),
            (_al_spread_panel(),),
            (stored_spread_panel(), latest_spread_panel()),
            (_open_alerts_panel(),),
        ),
    )


def _trouble_row() -> tuple[Panel, ...]:
    """What should be zero (untriaged alerts, failed cells of the latest sweep), and the
    sweeps per day by status."""
    return (
        _trouble_count(
            "Untriaged alerts",
            q.OPEN_ALERT_COUNT,
            "Alerts nobody has triaged yet (`farm alerts triage`), of the selected jobs.",
        ),
        _trouble_count(
            "Failed cells in the latest sweep",
            q.LATEST_FAILED_CELLS,
            "failed + build_failed cells of each selected job's newest sweep.",
        ),
        Panel(
            title="Sweeps per day by status",
            kind="timeseries",
            format="time_series",
            sql=q.SWEEPS_BY_STATUS,
            width=12,
            height=8,
            decimals=0,
            defaults=_BARS,
        ),
    )


def _sweeps_panel() -> Panel:
    """The sweeps in the time range with their cells by outcome."""
    return Panel(
        title="Sweeps",
        kind="table",
        sql=q.RECENT_SWEEPS,
        description="Sweeps in the time range with their cells by outcome.",
        width=24,
        height=8,
        overrides=(
            {
                "matcher": {"id": "byName", "options": "duration"},
                "properties": [{"id": "unit", "value": "s"}],
            },
        ),
    )


def _failed_cells_panel() -> Panel:
    """Cells that failed or whose build failed, with the error."""
    return Panel(
        title="Failed cells",
        kind="table",
        sql=q.FAILED_CELLS,
        description="Cells that failed or whose build failed, with the error.",
        width=24,
        height=9,
        options={"showHeader": True, "cellHeight": "sm"},
    )


def _durations_row() -> tuple[Panel, ...]:
    """Start-up and generation seconds by node, and start-up time over time by node."""
    return (
        Panel(
            title="Cell durations by node",
            kind="barchart",
            sql=q.CELL_DURATIONS_BY_NODE,
            description="Engine start-up and generation seconds of cells that ran.",
            width=12,
            height=9,
            unit="s",
            options={"xField": "node", "showValue": "auto"},
            overrides=(
                {
                    "matcher": {"id": "byName", "options": "cells"},
                    "properties": [
                        {
                            "id": "custom.hideFrom",
                            "value": {"viz": True, "legend": True, "tooltip": False},
                        }
                    ],
                },
            ),
        ),
        Panel(
            title="Engine start-up time by node",
            kind="timeseries",
            format="time_series",
            sql=q.STARTUP_BY_NODE,
            width=12,
            height=9,
            unit="s",
            defaults={"custom": {"drawStyle": "points", "pointSize": 6}},
        ),
    )


def _alert_state_row() -> tuple[Panel, ...]:
    """Open alerts by triage state, and how triage went (false alarms, time to triage)."""
    return (
        Panel(
            title="Open alerts by state",
            kind="barchart",
            sql=q.OPEN_ALERTS_BY_STATE,
            description=(
                "Untriaged, acknowledged (someone is on it) and downstream (caused "
                "elsewhere) alerts of the selected jobs."
            ),
            width=8,
            height=8,
        ),
        Panel(
            title="Alert triage",
            kind="stat",
            sql=q.ALERT_TRIAGE,
            description=(
                "Of the alerts opened in the time range and triaged: the share "
                "called invalid (false alarms) and the median time from opening "
                "to triage."
            ),
            width=16,
            height=8,
            options=_STAT_OPTIONS,
        ),
    )


def _device_hours_row() -> tuple[Panel, ...]:
    """What the sweeps cost in device hours, and what each verdict cost."""
    return (
        Panel(
            title="Device hours per sweep",
            kind="timeseries",
            format="time_series",
            sql=q.DEVICE_HOURS_BY_SWEEP,
            description=(
                "What each sweep cost: every server's start-up and generation time "
                "on each NPU it held (a CPU host counts as one device)."
            ),
            width=12,
            height=8,
            unit="h",
            defaults={"custom": {"drawStyle": "bars", "fillOpacity": 60}},
        ),
        Panel(
            title="Device hours per verdict",
            kind="table",
            sql=q.DEVICE_HOURS_BY_VERDICT,
            description=(
                "Nightly and PR verdicts in the time range: their device hours in "
                "all, per verdict, and per regression they found."
            ),
            width=12,
            height=8,
        ),
    )


def _al_spread_panel() -> Panel:
    """Each key's AL and its run-to-run spread over the sweeps in the time range."""
    return Panel(
        title="Run-to-run AL spread by key",
        kind="table",
        sql=q.AL_SPREAD,
        description=(
            "Each key's AL over the sweeps in the time range and its standard "
            "deviation relative to AL (regressions included; `farm noise JOB` "
            "gives the robust night-to-night figure the thresholds use)."
        ),
        width=24,
        height=8,
    )


def _open_alerts_panel() -> Panel:
    """The store's open alerts, with how to triage them."""
    return Panel(
        title="Open alerts",
        kind="table",
        sql=q.OPEN_ALERTS,
        description=(
            "From the store's alert table (`farm alerts check`, `farm nightly`); "
            "triage with `farm alerts triage ID STATE --reason ... --link ...`."
        ),
        width=24,
        height=9,
    )

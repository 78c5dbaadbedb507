"""The "MTP acceptance overview" dashboard: acceptance per cell key over sweeps."""

from __future__ import annotations

from farm.dashboards import queries as q
from farm.dashboards.model import Dashboard, Panel, QueryVariable

__all__ = ["ACCEPTANCE_UID", "acceptance_overview", "acceptance_variables"]

ACCEPTANCE_UID = "mtp-acceptance"

_TIME_SERIES_OPTIONS = {
    "legend": {"displayMode": "table", "placement": "right", "showLegend": True},
    "tooltip": {"mode": "multi", "sort": "desc"},
}
# Sweeps are nightly at best: draw the points, joined, not a dense line.
_POINTS = {"custom": {"drawStyle": "line", "showPoints": "always", "pointSize": 6}}


def acceptance_variables() -> tuple[QueryVariable, ...]:
    """Job (one at a time: "latest" and "previous" sweep are per job), then the axes."""
    return (
        QueryVariable(
            name="job",
            label="job",
            sql=q.VARIABLE_JOB_LATEST_FIRST,
            multi=False,
            description="the sweep name (job spec `name`); the most recently run first",
        ),
        QueryVariable(name="engine", label="engine", sql=q.VARIABLE_ENGINE),
        QueryVariable(name="model", label="model", sql=q.VARIABLE_MODEL),
        QueryVariable(
            name="graph_mode",
            label="graph mode",
            sql=q.VARIABLE_GRAPH_MODE,
            description="the planned graph mode (the cell key's; remaps are on the cell)",
        ),
        QueryVariable(name="mtp_depth", label="MTP depth", sql=q.VARIABLE_MTP_DEPTH),
        QueryVariable(name="thinking", label="thinking", sql=q.VARIABLE_THINKING),
    )


def _change_colours() -> list[dict[str, object]]:
    """Colour the relative AL change: red from a 2% drop, the checks' minimum AL effect."""
    return [
        {
            "matcher": {"id": "byName", "options": "AL change rel"},
            "properties": [
                {"id": "unit", "value": "percentunit"},
                {"id": "decimals", "value": 1},
                {"id": "custom.cellOptions", "value": {"type": "color-text"}},
                {
                    "id": "thresholds",
                    "value": {
                        "mode": "absolute",
                        "steps": [
                            {"color": "red", "value": None},
                            {"color": "text", "value": -0.02},
                        ],
                    },
                },
            ],
        },
        {
            "matcher": {"id": "byRegexp", "options": "^(acceptance rate|accuracy)$"},
            "properties": [{"id": "unit", "value": "percentunit"}, {"id": "decimals", "value": 1}],
        },
    ]


def acceptance_overview() -> Dashboard:
    """Mean acceptance length and acceptance rate per cell key over sweeps, the latest
    sweep's cells with accuracy and change vs the previous sweep, per-position rates."""
    return Dashboard(
        uid=ACCEPTANCE_UID,
        title="MTP acceptance overview",
        description=(
            "Speculative decoding acceptance per cell key (engine, model, graph mode, MTP "
            "depth, sliding window, thinking, workload), one point per sweep."
        ),
        tags=("mtp-farm", "acceptance"),
        variables=acceptance_variables(),
        rows=(
            (_latest_sweep_panel(),),
            (_al_series_panel(),),
            (_rate_series_panel(),),
            (_latest_cells_panel(),),
            (_per_position_panel(),),
            (_by_category_panel(),),
            (_by_context_panel(),),
        ),
    )


def _latest_sweep_panel() -> Panel:
    """The job's newest sweep in the time range and how its cells ended."""
    return Panel(
        title="Latest sweep",
        kind="table",
        sql=q.LATEST_SWEEP,
        description="The job's newest sweep in the time range and how its cells ended.",
        width=24,
        height=4,
    )


def _al_series_panel() -> Panel:
    """AL per cell key, one point per sweep."""
    return Panel(
        title="Mean acceptance length (AL) per cell key",
        kind="timeseries",
        format="time_series",
        sql=q.SERIES_ACCEPTANCE_LENGTH,
        description=(
            "AL = 1 + accepted / drafts, counters summed over the key's "
            "variant runs in each sweep (ok cells, speculation on). Compare "
            "AL across MTP depths, rates only within one depth."
        ),
        width=24,
        height=10,
        decimals=3,
        defaults=_POINTS,
        options=_TIME_SERIES_OPTIONS,
    )


def _rate_series_panel() -> Panel:
    """Acceptance rate per cell key, one point per sweep."""
    return Panel(
        title="Acceptance rate per cell key",
        kind="timeseries",
        format="time_series",
        sql=q.SERIES_ACCEPTANCE_RATE,
        description="accepted / draft tokens; falls with MTP depth by design.",
        width=24,
        height=9,
        unit="percentunit",
        decimals=1,
        defaults=_POINTS,
        options=_TIME_SERIES_OPTIONS,
    )


def _latest_cells_panel() -> Panel:
    """The newest sweep's variants: AL, accuracy and change vs the previous sweep."""
    return Panel(
        title="Latest sweep: cells, AL, accuracy, change vs previous sweep",
        kind="table",
        sql=q.LATEST_SWEEP_CELLS,
        description=(
            "One row per planned variant of the newest sweep. Accuracy: share "
            "correct among scored requests that did not fail. Previous: the "
            "job's last earlier sweep in which the same cell key has an AL, "
            f"among the {q.PREVIOUS_WITHIN} sweeps before the latest."
        ),
        width=24,
        height=12,
        decimals=3,
        options={"showHeader": True, "cellHeight": "sm"},
        overrides=_change_colours(),
    )


def _per_position_panel() -> Panel:
    """The newest sweep's acceptance per draft position, one bar group per cell key."""
    return Panel(
        title="Latest sweep: acceptance per draft position",
        kind="barchart",
        sql=q.LATEST_SWEEP_PER_POSITION,
        description="accepted_per_pos[i] / drafts for each cell key.",
        width=24,
        height=10,
        unit="percentunit",
        decimals=1,
        options={
            "xField": "cell",
            "orientation": "horizontal",
            "showValue": "never",
            "legend": {"displayMode": "list", "placement": "bottom"},
        },
        # Rows are (cell, position, rate): one bar group per cell.
        transformations=(
            {
                "id": "groupingToMatrix",
                "options": {
                    "rowField": "cell",
                    "columnField": "position",
                    "valueField": "rate",
                },
            },
            {
                "id": "renameByRegex",
                "options": {"regex": "^cell\\\\position$", "renamePattern": "cell"},
            },
        ),
    )


def _by_category_panel() -> Panel:
    """The newest sweep's AL per prompt category, for workloads that have categories."""
    return Panel(
        title="Latest sweep: AL by prompt category",
        kind="table",
        sql=q.LATEST_SWEEP_BY_CATEGORY,
        description=(
            "For workloads whose prompt set has categories (MT-Bench, "
            "SPEED-Bench): AL over each category's requests, from their own "
            "counters. A drop confined to one kind of prompt shows here first."
        ),
        width=24,
        height=9,
        decimals=3,
        options={"showHeader": True, "cellHeight": "sm"},
    )


def _by_context_panel() -> Panel:
    """The newest sweep's AL per context length, one row per cell key and length."""
    return Panel(
        title="Latest sweep: AL by context length",
        kind="table",
        sql=q.LATEST_SWEEP_BY_CONTEXT,
        description=(
            "AL of each cell key at each length of the context axis (tokens placed "
            "before every prompt; 0: none). A drop that grows with length shows as the "
            "long rows of one key falling while its short ones hold."
        ),
        width=24,
        height=9,
        decimals=3,
        options={"showHeader": True, "cellHeight": "sm"},
    )

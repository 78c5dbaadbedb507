"""A small typed model of Grafana dashboards, rendered to Grafana's dashboard JSON.

Only what the farm's dashboards use: SQL panels (time series, table, bar chart, stat)
against one PostgreSQL data source, query variables, and a row-by-row layout on
Grafana's 24-column grid. Rendering is pure and deterministic (same model, same JSON),
so the committed files can be compared byte for byte with what the code generates.
Field names in the output follow Grafana's dashboard JSON model (schema version 39,
Grafana 11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DATASOURCE_TYPE",
    "DATASOURCE_UID",
    "GRID_COLUMNS",
    "Dashboard",
    "Panel",
    "QueryVariable",
    "datasource_ref",
]

DATASOURCE_TYPE = "grafana-postgresql-datasource"
# Fixed, so that dashboards, alert rules and the provisioned data source agree on it
# without a lookup by name.
DATASOURCE_UID = "mtp-farm-postgres"
GRID_COLUMNS = 24
_SCHEMA_VERSION = 39

PanelKind = Literal["timeseries", "table", "barchart", "stat"]
QueryFormat = Literal["time_series", "table"]
JSONObject = dict[str, Any]


def datasource_ref() -> JSONObject:
    """The reference every panel, target and variable uses for the farm's store."""
    return {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Panel(_Frozen):
    """One SQL panel. ``width``/``height`` are grid units (24 columns, rows of 30 px).

    ``options``, ``defaults`` (field config defaults beyond unit and decimals),
    ``overrides`` and ``transformations`` are passed through to Grafana as given.
    """

    title: str
    kind: PanelKind
    sql: str
    format: QueryFormat = "table"
    description: str = ""
    width: int = Field(default=12, ge=1, le=GRID_COLUMNS)
    height: int = Field(default=8, ge=1)
    unit: str | None = None
    decimals: int | None = None
    options: Mapping[str, Any] = Field(default_factory=dict)
    defaults: Mapping[str, Any] = Field(default_factory=dict)
    overrides: Sequence[Mapping[str, Any]] = ()
    transformations: Sequence[Mapping[str, Any]] = ()

    def render(self, panel_id: int, x: int, y: int) -> JSONObject:
        """Grafana's JSON for this panel at grid position (x, y)."""
        defaults: JSONObject = dict(self.defaults)
        if self.unit is not None:
            defaults["unit"] = self.unit
        if self.decimals is not None:
            defaults["decimals"] = self.decimals
        return {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": datasource_ref(),
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "targets": [
                {
                    "refId": "A",
                    "datasource": datasource_ref(),
                    "editorMode": "code",
                    "format": self.format,
                    "rawQuery": True,
                    "rawSql": self.sql,
                }
            ],
            "fieldConfig": {
                "defaults": defaults,
                "overrides": [dict(o) for o in self.overrides],
            },
            "options": dict(self.options),
            "transformations": [dict(t) for t in self.transformations],
        }


class QueryVariable(_Frozen):
    """A dashboard variable whose values come from a SQL query on the store.

    ``multi`` variables start at "All". Queries may use earlier variables, so a team
    that picks its job sees only its engines and models. The query's rows are kept in
    its own order (``sort: 0``): the SQL sorts.
    """

    name: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    label: str
    sql: str
    multi: bool = True
    description: str = ""

    def render(self) -> JSONObject:
        current: JSONObject = (
            {"selected": True, "text": ["All"], "value": ["$__all"]} if self.multi else {}
        )
        return {
            "name": self.name,
            "label": self.label,
            "description": self.description,
            "type": "query",
            "datasource": datasource_ref(),
            "query": self.sql,
            "definition": self.sql,
            # 2: refresh the values when the time range changes (and on load): the
            # variables offer what the sweeps in the range have.
            "refresh": 2,
            "multi": self.multi,
            "includeAll": self.multi,
            "current": current,
            "options": [],
            "sort": 0,
            "hide": 0,
            "regex": "",
            "skipUrlSync": False,
        }


class Dashboard(_Frozen):
    """A dashboard: rows of panels laid out top to bottom, and its variables.

    Panel ids are assigned in reading order starting at 1; each row starts below the
    tallest panel of the row before it. A row wider than 24 columns is refused.
    """

    uid: str = Field(pattern=r"^[a-z0-9-]{1,40}$")
    title: str
    description: str
    tags: tuple[str, ...] = ("mtp-farm",)
    rows: tuple[tuple[Panel, ...], ...]
    variables: tuple[QueryVariable, ...] = ()
    time_from: str = "now-30d"
    refresh: str = "5m"

    def panels(self) -> tuple[Panel, ...]:
        return tuple(p for row in self.rows for p in row)

    def render(self) -> JSONObject:
        """Grafana's dashboard JSON (without ``id``: Grafana assigns it)."""
        panels: list[JSONObject] = []
        y = 0
        for row in self.rows:
            if sum(p.width for p in row) > GRID_COLUMNS:
                raise ValueError(f"dashboard {self.uid}: a row is wider than {GRID_COLUMNS}")
            x = 0
            for panel in row:
                panels.append(panel.render(len(panels) + 1, x, y))
                x += panel.width
            y += max((p.height for p in row), default=0)
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "editable": False,
            "graphTooltip": 1,
            "schemaVersion": _SCHEMA_VERSION,
            "version": 1,
            "timezone": "utc",
            "time": {"from": self.time_from, "to": "now"},
            "refresh": self.refresh,
            "links": [],
            "annotations": {"list": []},
            "templating": {"list": [v.render() for v in self.variables]},
            "panels": panels,
        }

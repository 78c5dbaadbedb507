"""The farm's dashboards, declared as small typed panels and built with Grafana's own
SDK (``grafana-foundation-sdk``: its dashboard, panel and variable builders, and each
panel kind's typed options), rendered to Grafana's dashboard JSON.

Only what the farm's dashboards use: SQL panels (time series, table, bar chart, stat)
against one PostgreSQL data source, query variables, and a row-by-row layout on
Grafana's 24-column grid. Rendering is pure and deterministic (same model, same JSON),
so the committed files can be compared byte for byte with what the code generates.

The SDK has no query type for Grafana's PostgreSQL data source (it models Prometheus,
Loki, Elasticsearch, BigQuery, Athena and others, not the SQL data sources), so the
farm adds one (:class:`PostgresQuery`) and registers it with the SDK's runtime, which
then reads such targets back too. :func:`sdk_problems` holds a dashboard JSON against
the SDK's models: every key the farm writes must survive a round trip through them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import plugins as cogplugins
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as sdkm
from pydantic import Field

from farm.frozen import Frozen

__all__ = [
    "DATASOURCE_TYPE",
    "DATASOURCE_UID",
    "GRID_COLUMNS",
    "Dashboard",
    "Panel",
    "PostgresQuery",
    "QueryVariable",
    "datasource_ref",
    "sdk_problems",
]

DATASOURCE_TYPE = "grafana-postgresql-datasource"
# Fixed, so that dashboards, alert rules and the provisioned data source agree on it
# without a lookup by name.
DATASOURCE_UID = "mtp-farm-postgres"
GRID_COLUMNS = 24
# Grafana 11's schema: the SDK's builder starts at 36, which Grafana would migrate.
_SCHEMA_VERSION = 39

PanelKind = Literal["timeseries", "table", "barchart", "stat"]
QueryFormat = Literal["time_series", "table"]
JSONObject = dict[str, Any]
_T = TypeVar("_T")


def datasource_ref() -> JSONObject:
    """The reference every panel, target and variable uses for the farm's store."""
    return {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}


def _ref() -> sdkm.DataSourceRef:
    return sdkm.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)


class PostgresQuery(cogvariants.Dataquery):
    """A raw SQL target of Grafana's PostgreSQL data source (code editor mode)."""

    def __init__(self, sql: str, fmt: str = "table", ref_id: str = "A") -> None:
        self.sql = sql
        self.fmt = fmt
        self.ref_id = ref_id

    def to_json(self) -> dict[str, object]:
        return {
            "refId": self.ref_id,
            "datasource": datasource_ref(),
            "editorMode": "code",
            "format": self.fmt,
            "rawQuery": True,
            "rawSql": self.sql,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(str(data.get("rawSql", "")), str(data.get("format", "table")), data["refId"])


class _Built(cogbuilder.Builder[_T], Generic[_T]):
    """A model the farm has already made, where the SDK's API takes a builder."""

    def __init__(self, built: _T) -> None:
        self._built = built

    def build(self) -> _T:
        return self._built


@cache
def _runtime() -> None:
    """The SDK's panel kinds, and the farm's PostgreSQL target, known to its runtime."""
    cogplugins.register_default_plugins()
    cogruntime.register_dataquery_variant(
        cogruntime.DataqueryConfig(
            identifier=DATASOURCE_TYPE, from_json_hook=PostgresQuery.from_json
        )
    )


def _typed(kind: str, part: Literal["options", "custom"], value: Mapping[str, Any]) -> Any:
    """``value`` as the SDK's typed model of panel ``kind``'s options or custom field
    config (a plain mapping where the SDK has none for that kind)."""
    _runtime()
    config = cogruntime.panelcfg_config(kind)
    hook = None
    if config is not None:
        hook = (
            config.options_from_json_hook
            if part == "options"
            else config.field_config_from_json_hook
        )
    return hook(dict(value)) if hook is not None else dict(value)


# What Grafana's own panel editor starts a legend and a tooltip at. The SDK's typed
# options start elsewhere (legend hidden, tooltip sorted ascending): left to them, a
# panel that names no legend would lose the one it has in Grafana.
_GRAFANA_LEGEND = {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []}
_GRAFANA_TOOLTIP = {"mode": "single", "sort": "none"}


def _with_grafana_defaults(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` over Grafana's defaults of the legend and tooltip, for the kinds that
    have them."""
    if kind not in ("timeseries", "barchart"):
        return dict(options)
    return {
        **options,
        "legend": {**_GRAFANA_LEGEND, **options.get("legend", {})},
        "tooltip": {**_GRAFANA_TOOLTIP, **options.get("tooltip", {})},
    }


def _to_json(model: object) -> Any:
    return json.loads(json.dumps(model, cls=JSONEncoder))


class Panel(Frozen):
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

    def build(self, panel_id: int, x: int, y: int) -> sdk.Panel:
        """The SDK's builder of this panel at grid position (x, y)."""
        defaults = dict(self.defaults)
        panel = (
            sdk.Panel()
            .id(panel_id)
            .type(self.kind)
            .title(self.title)
            .description(self.description)
            .datasource(_ref())
            .grid_pos(sdkm.GridPos(h=self.height, w=self.width, x=x, y=y))
            .with_target(_Built(PostgresQuery(self.sql, self.format)))
            .options(_typed(self.kind, "options", _with_grafana_defaults(self.kind, self.options)))
            .transformations(
                [sdkm.DataTransformerConfig.from_json(dict(t)) for t in self.transformations]
            )
        )
        if self.unit is not None:
            panel.unit(self.unit)
        if self.decimals is not None:
            panel.decimals(self.decimals)
        if "color" in defaults:
            panel.color_scheme(_Built(sdkm.FieldColor.from_json(defaults.pop("color"))))
        if "thresholds" in defaults:
            panel.thresholds(_Built(sdkm.ThresholdsConfig.from_json(defaults.pop("thresholds"))))
        if "custom" in defaults:
            panel.custom(_typed(self.kind, "custom", defaults.pop("custom")))
        if defaults:
            raise ValueError(
                f"panel {self.title!r}: field defaults the farm does not set: {sorted(defaults)}"
            )
        panel.overrides([])
        for override in self.overrides:
            panel.with_override(
                sdkm.MatcherConfig.from_json(override["matcher"]),
                [sdkm.DynamicConfigValue.from_json(p) for p in override["properties"]],
            )
        return panel


class QueryVariable(Frozen):
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

    def build(self) -> sdk.QueryVariable:
        """The SDK's builder of this variable."""
        variable = (
            sdk.QueryVariable(self.name)
            .label(self.label)
            .description(self.description)
            .datasource(_ref())
            .query(self.sql)
            # Refresh the values when the time range changes (and on load): the
            # variables offer what the sweeps in the range have.
            .refresh(sdkm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(self.multi)
            .include_all(self.multi)
            .options([])
            .sort(sdkm.VariableSort.DISABLED)
            .hide(sdkm.VariableHide.DONT_HIDE)
            .regex("")
        )
        if self.multi:
            variable.current(sdkm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        return variable


class Dashboard(Frozen):
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

    def build(self) -> sdkm.Dashboard:
        """The SDK's model of this dashboard."""
        board = (
            sdk.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags(list(self.tags))
            .readonly()
            .tooltip(sdkm.DashboardCursorSync.CROSSHAIR)
            .timezone("utc")
            .time(self.time_from, "now")
            .refresh(self.refresh)
            .version(1)
            .links([])
            .annotations([])
        )
        for variable in self.variables:
            board.with_variable(variable.build())
        y = 0
        count = 0
        for row in self.rows:
            if sum(p.width for p in row) > GRID_COLUMNS:
                raise ValueError(f"dashboard {self.uid}: a row is wider than {GRID_COLUMNS}")
            x = 0
            for panel in row:
                count += 1
                board.with_panel(panel.build(count, x, y))
                x += panel.width
            y += max((p.height for p in row), default=0)
        built = board.build()
        built.schema_version = _SCHEMA_VERSION
        return built

    def render(self) -> JSONObject:
        """Grafana's dashboard JSON (without ``id``: Grafana assigns it)."""
        document: JSONObject = _to_json(self.build())
        return document


class _FromJson(Protocol):
    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Any: ...


def sdk_problems(document: Mapping[str, Any], model: type[_FromJson] = sdkm.Dashboard) -> list[str]:
    """Where ``document`` (a dashboard's JSON, or what ``model`` of the SDK reads) is not
    what the SDK's models hold: each path whose value a round trip through
    ``model.from_json`` loses or changes."""
    _runtime()
    again = _to_json(model.from_json(dict(document)))
    problems: list[str] = []
    _differences(dict(document), again, "", problems)
    return problems


def _differences(before: Any, after: Any, path: str, out: list[str]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            where = f"{path}.{key}" if path else str(key)
            # A default the SDK adds (a key only ``after`` has) is no problem of the
            # document's.
            if key not in after:
                out.append(f"{where}: not in the SDK's model (dropped)")
            else:
                _differences(before[key], after[key], where, out)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            _differences(b, a, f"{path}[{i}]", out)
    elif before != after:
        out.append(f"{path}: {before!r} reads back as {after!r}")

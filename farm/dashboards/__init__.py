"""Grafana dashboards and alert rules as code, on the farm's PostgreSQL store.

``model`` is a small typed dashboard model rendered to Grafana's JSON; ``queries``
holds the SQL; ``acceptance`` and ``health`` define the dashboards; ``alerting`` the
alert rules; ``provisioning`` the data source and dashboard provider; ``files``
renders, writes and checks the generated ``dashboards/`` folder; ``macros`` replays
Grafana's SQL interpolation (for tests); ``push`` uploads through Grafana's HTTP API
(imported on its own: it pulls in the HTTP client).
"""

from farm.dashboards.acceptance import acceptance_overview
from farm.dashboards.alerting import AlertRule, alert_provisioning, alert_rules
from farm.dashboards.files import all_dashboards, render_files, stale_files, write_files
from farm.dashboards.health import farm_health
from farm.dashboards.model import DATASOURCE_TYPE, DATASOURCE_UID, Dashboard, Panel, QueryVariable

__all__ = [
    "DATASOURCE_TYPE",
    "DATASOURCE_UID",
    "AlertRule",
    "Dashboard",
    "Panel",
    "QueryVariable",
    "acceptance_overview",
    "alert_provisioning",
    "alert_rules",
    "all_dashboards",
    "farm_health",
    "render_files",
    "stale_files",
    "write_files",
]

"""Grafana provisioning documents: the farm's data source and the dashboard provider.

Grafana expands ``${VAR}`` from its environment in data source provisioning, so the
store's address and credentials come from ``FARM_DB_HOST``, ``FARM_DB_NAME``,
``FARM_DB_USER``, ``FARM_DB_PASSWORD`` and ``FARM_DB_SSLMODE`` (set by
``deploy/docker-compose.yaml``) and never sit in a file. The user is the store's
read-only role (``deploy/postgres/readonly-role.sql``), never its owner, and the
compose file defaults ``FARM_DB_SSLMODE`` to ``require`` (Grafana documents no default
syntax for provisioning variables, so the default lives there).
"""

from __future__ import annotations

from typing import Any

from farm.dashboards.model import DATASOURCE_TYPE, DATASOURCE_UID

__all__ = [
    "DASHBOARDS_PATH",
    "DASHBOARD_FOLDER",
    "DASHBOARD_FOLDER_UID",
    "DATASOURCE_NAME",
    "dashboard_provider",
    "datasource",
    "datasource_provisioning",
]

DATASOURCE_NAME = "mtp-farm store"
DASHBOARD_FOLDER = "MTP farm"
DASHBOARD_FOLDER_UID = "mtp-farm"
# Where deploy/docker-compose.yaml mounts the repository's dashboards/ folder.
DASHBOARDS_PATH = "/var/lib/grafana/dashboards"


def datasource(
    host: str = "${FARM_DB_HOST}",
    database: str = "${FARM_DB_NAME}",
    user: str = "${FARM_DB_USER}",
    sslmode: str = "${FARM_DB_SSLMODE}",
) -> dict[str, Any]:
    """The PostgreSQL data source (without its password), as provisioning and the HTTP
    API (``POST /api/datasources``) both take it. ``user`` should be a read-only role
    and ``sslmode`` one that encrypts (``require``, ``verify-full``)."""
    return {
        "name": DATASOURCE_NAME,
        "uid": DATASOURCE_UID,
        "type": DATASOURCE_TYPE,
        "access": "proxy",
        "url": host,
        "user": user,
        "jsonData": {
            "database": database,
            "sslmode": sslmode,
            "postgresVersion": 1500,
            "timescaledb": False,
            "maxOpenConns": 10,
        },
    }


def datasource_provisioning() -> dict[str, Any]:
    """``provisioning/datasources/farm.yaml``: the data source, password from the env."""
    entry = {
        **datasource(),
        "orgId": 1,
        "isDefault": True,
        "editable": False,
        "secureJsonData": {"password": "${FARM_DB_PASSWORD}"},
    }
    return {"apiVersion": 1, "datasources": [entry]}


def dashboard_provider() -> dict[str, Any]:
    """``provisioning/dashboards/farm.yaml``: load every JSON file of ``dashboards/``."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "mtp-farm",
                "orgId": 1,
                "folder": DASHBOARD_FOLDER,
                "folderUid": DASHBOARD_FOLDER_UID,
                "type": "file",
                "disableDeletion": True,
                # The files are generated (`farm dashboards build`): edits belong in code.
                "allowUiUpdates": False,
                "updateIntervalSeconds": 60,
                "options": {"path": DASHBOARDS_PATH, "foldersFromFilesStructure": False},
            }
        ],
    }

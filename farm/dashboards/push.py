"""Upload the farm's dashboards and alert rules to a running Grafana through its HTTP API.

Uses the ``grafana-client`` library; each step names the API it calls:

- ``GET /api/health`` - is it Grafana, is it up (needs no token);
- ``GET /api/folders/:uid``, ``POST /api/folders`` - the folder, created if missing;
- ``GET /api/datasources/uid/:uid``, ``POST /api/datasources`` - the farm's PostgreSQL
  data source under its fixed uid, created if missing (an existing one is left as is);
- ``POST /api/dashboards/db`` - each dashboard, ``overwrite: true``, into the folder;
- ``GET /api/v1/provisioning/alert-rules/:uid``, then ``POST /api/v1/provisioning/alert-rules``
  or ``PUT /api/v1/provisioning/alert-rules/:uid`` - each alert rule under its fixed uid,
  so a second push updates it instead of adding a copy;
- ``GET``/``PUT /api/v1/provisioning/folder/:folderUid/rule-groups/:group`` - the rule
  group's evaluation interval (a group made by the first rule gets Grafana's default).

See https://grafana.com/docs/grafana/latest/developers/http_api/alerting_provisioning/
for the alerting endpoints' contract.

The token (a service account token) is sent as a bearer token and never appears in
an error message: every message is scrubbed of it before it is raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import requests
from grafana_client import GrafanaApi  # type: ignore[import-untyped]
from grafana_client.client import (  # type: ignore[import-untyped]
    GrafanaClientError,
    GrafanaException,
    TokenAuth,
)
from pydantic import SecretStr
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from farm.dashboards.alerting import ALERT_GROUP, ALERT_INTERVAL_S, AlertRule
from farm.dashboards.model import DATASOURCE_UID, Dashboard
from farm.dashboards.provisioning import DASHBOARD_FOLDER, DASHBOARD_FOLDER_UID, datasource
from farm.errors import FarmError
from farm.frozen import Frozen

__all__ = [
    "GrafanaError",
    "PushResult",
    "PushedRule",
    "StoreConnection",
    "folder_uid",
    "push_alert_rules",
    "push_dashboards",
    "store_connection",
]

# Enough for a Grafana on the LAN under load; a wrong host fails in seconds, not minutes.
DEFAULT_TIMEOUT_S = 10.0
_T = TypeVar("_T")


class GrafanaError(FarmError):
    """Grafana could not be reached, refused the token, or refused a request."""


class StoreConnection(Frozen):
    """How Grafana reaches the farm's PostgreSQL store (for creating the data source)."""

    host: str  # HOST:PORT as Grafana's network sees it
    database: str
    user: str
    password: SecretStr | None = None
    sslmode: str = "disable"


class PushResult(Frozen):
    """What a push did: the folder, whether the data source was created, dashboard URLs."""

    folder_uid: str
    folder_created: bool
    datasource_created: bool
    dashboards: tuple[tuple[str, str], ...]  # (uid, URL path Grafana answered)


class PushedRule(Frozen):
    """One alert rule a push saved, and whether Grafana had it before."""

    uid: str
    title: str
    action: Literal["created", "updated"]


def folder_uid(name: str) -> str:
    """A folder uid from its name: the farm's default folder keeps its fixed uid."""
    if name == DASHBOARD_FOLDER:
        return DASHBOARD_FOLDER_UID
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]
    if not slug:
        raise GrafanaError(f"folder name {name!r} has no letter or digit to make a uid of")
    return slug


def _api(url: str, token: str, timeout: float) -> GrafanaApi:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GrafanaError(
            f"bad Grafana URL {url!r}: expected http(s)://HOST[:PORT][/PATH], "
            "for example http://localhost:3000"
        )
    if parts.username or parts.password:
        raise GrafanaError(
            "the Grafana URL carries credentials; pass the token in GRAFANA_TOKEN instead"
        )
    try:
        port = parts.port
    except ValueError:
        raise GrafanaError(f"bad Grafana URL {url!r}: the port is not a number") from None
    prefix = parts.path.strip("/")
    return GrafanaApi(
        auth=TokenAuth(token),
        host=parts.hostname,
        port=port,
        # grafana-client appends "api" right after the prefix: it needs the slash.
        url_path_prefix=f"{prefix}/" if prefix else "",
        protocol=parts.scheme,
        timeout=timeout,
    )


def _refusal(exc: GrafanaException) -> str:
    """Grafana's own reason: the ``message`` of its JSON error body when it has one
    (grafana-client's message for a 400 is the whole body's repr)."""
    body = exc.response
    if isinstance(body, dict) and body.get("message"):
        return f"(HTTP {exc.status_code}): {body['message']}"
    return f"(HTTP {exc.status_code}): {exc.message}"


def _call(what: str, url: str, token: str, call: Callable[[], _T], *, hint: str = "") -> _T:
    """Run one API call; turn every failure into a GrafanaError without the token.

    ``hint`` (what to do) is added when Grafana refuses the request itself.
    """

    def fail(message: str) -> GrafanaError:
        return GrafanaError(message.replace(token, "***") if token else message)

    try:
        return call()
    except GrafanaException as exc:
        code = exc.status_code
        if code in (401, 403):
            raise fail(
                f"Grafana at {url} refused the token in GRAFANA_TOKEN (HTTP {code}) while "
                f"trying to {what}; use a service account token with the Editor role "
                "(or Admin, to create the data source; before Grafana 11, also to "
                "provision alert rules)"
            ) from None
        advice = f"; {hint}" if hint else ""
        raise fail(f"Grafana at {url} refused to {what} {_refusal(exc)}{advice}") from None
    except requests.exceptions.InvalidURL as exc:
        raise fail(f"bad Grafana URL {url!r}: {exc}") from None
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        reason = type(exc).__name__
        raise fail(
            f"Grafana at {url} is unreachable ({reason}) while trying to {what}; "
            "is it running, and is the URL right?"
        ) from None
    except ValueError:
        # A JSON decoding error (requests' is a ValueError too): something answered,
        # but not Grafana's API.
        raise fail(
            f"{url} answered, but not like Grafana's HTTP API, while trying to {what}"
        ) from None
    except requests.exceptions.RequestException as exc:
        raise fail(f"request to Grafana at {url} failed while trying to {what}: {exc}") from None


def _exists(what: str, url: str, token: str, lookup: Callable[[], Any]) -> bool:
    """True when the lookup finds the object, False on 404; other failures raise."""

    def probe() -> bool:
        try:
            lookup()
        except GrafanaClientError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True

    return _call(what, url, token, probe)


def push_dashboards(
    url: str,
    token: str,
    dashboards: Sequence[Dashboard],
    *,
    folder: str = DASHBOARD_FOLDER,
    store: StoreConnection | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> PushResult:
    """Ensure the folder and the data source exist, then upload ``dashboards``.

    ``store`` is needed only when the data source does not exist yet. Raises
    GrafanaError for a bad URL, an unreachable server, a refused token (401/403), a
    missing ``store`` when the data source must be created, or any refused request.
    """
    if not token:
        raise GrafanaError("no Grafana token: set GRAFANA_TOKEN to a service account token")
    api = _api(url, token, timeout)
    _call("check its health", url, token, api.health.check)

    uid = folder_uid(folder)
    folder_found = _exists(f"look up folder {uid}", url, token, lambda: api.folder.get_folder(uid))
    if not folder_found:
        _call(
            f"create folder {folder!r}", url, token, lambda: api.folder.create_folder(folder, uid)
        )

    ds_found = _exists(
        f"look up data source {DATASOURCE_UID}",
        url,
        token,
        lambda: api.datasource.get_datasource_by_uid(DATASOURCE_UID),
    )
    if not ds_found:
        if store is None:
            raise GrafanaError(
                f"Grafana at {url} has no data source {DATASOURCE_UID!r} and no PostgreSQL "
                "store was given to create it from (--db or FARM_DB_URL)"
            )
        payload = _datasource_payload(store)
        _call(
            f"create data source {DATASOURCE_UID}",
            url,
            token,
            lambda: api.datasource.create_datasource(payload),
        )

    pushed = []
    for dashboard in dashboards:
        body = {
            "dashboard": dashboard.render(),
            "folderUid": uid,
            "overwrite": True,
            "message": "farm dashboards push",
        }
        answer = _call(
            f"save dashboard {dashboard.uid}",
            url,
            token,
            partial(api.dashboard.update_dashboard, body),
        )
        path = answer.get("url", "") if isinstance(answer, dict) else ""
        pushed.append((dashboard.uid, str(path)))
    return PushResult(
        folder_uid=uid,
        folder_created=not folder_found,
        datasource_created=not ds_found,
        dashboards=tuple(pushed),
    )


def push_alert_rules(
    url: str,
    token: str,
    rules: Sequence[AlertRule],
    *,
    folder_uid: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_saved: Callable[[PushedRule], None] | None = None,
) -> tuple[PushedRule, ...]:
    """Create or update each rule, by its uid, in group ``ALERT_GROUP`` of the folder,
    then set the group's evaluation interval to ``ALERT_INTERVAL_S`` seconds.

    Run it after :func:`push_dashboards`: the folder and the data source the rules query
    must exist. Rules are saved without ``X-Disable-Provenance``, so Grafana's UI shows
    them as provisioned and read-only, like the file-provisioned ones: they are edited
    in code. ``on_saved`` hears of each rule as soon as it is saved, so a caller can
    report the rules saved before a failure. Raises GrafanaError as
    :func:`push_dashboards` does; a refused rule is named with Grafana's reason.
    """
    if not token:
        raise GrafanaError("no Grafana token: set GRAFANA_TOKEN to a service account token")
    provisioning = _api(url, token, timeout).alertingprovisioning
    pushed = []
    for rule in rules:
        body = rule.render_for_api(folder_uid)
        found = _exists(
            f"look up alert rule {rule.uid}",
            url,
            token,
            partial(provisioning.get_alertrule, rule.uid),
        )
        save = (
            partial(provisioning.update_alertrule, rule.uid, body)
            if found
            else partial(provisioning.create_alertrule, body)
        )
        _call(
            f"save alert rule {rule.title!r} (uid {rule.uid})",
            url,
            token,
            save,
            hint="the rule is generated by farm/dashboards/alerting.py; "
            "`farm dashboards push --no-alerts` pushes the dashboards without it",
        )
        saved = PushedRule(uid=rule.uid, title=rule.title, action="updated" if found else "created")
        pushed.append(saved)
        if on_saved is not None:
            on_saved(saved)
    if rules:
        _set_group_interval(provisioning, url, token, folder_uid)
    return tuple(pushed)


def _set_group_interval(provisioning: Any, url: str, token: str, folder_uid: str) -> None:
    group = _call(
        f"read alert rule group {ALERT_GROUP!r}",
        url,
        token,
        partial(provisioning.get_rule_group, folder_uid, ALERT_GROUP),
    )
    if not isinstance(group, dict):
        raise GrafanaError(
            f"{url} answered, but not like Grafana's HTTP API, while trying to read "
            f"alert rule group {ALERT_GROUP!r}"
        )
    if group.get("interval") == ALERT_INTERVAL_S:
        return
    # The PUT replaces the group's rules with the body's, so the body keeps every rule
    # the group holds, a team's own ones included.
    body = {**group, "title": ALERT_GROUP, "folderUid": folder_uid, "interval": ALERT_INTERVAL_S}
    _call(
        f"set the evaluation interval of alert rule group {ALERT_GROUP!r}",
        url,
        token,
        partial(provisioning.update_rule_group, folder_uid, ALERT_GROUP, body),
    )


def _datasource_payload(store: StoreConnection) -> dict[str, Any]:
    payload = datasource(
        host=store.host, database=store.database, user=store.user, sslmode=store.sslmode
    )
    if store.password is not None:
        payload["secureJsonData"] = {"password": store.password.get_secret_value()}
    return payload


def store_connection(db_url: str) -> StoreConnection:
    """The data source settings of a ``postgresql://USER:PASSWORD@HOST:PORT/DB`` URL.

    ``?sslmode=`` is kept (default ``disable``). Raises GrafanaError for another
    database: Grafana reads the store through its PostgreSQL data source only.
    """
    try:
        url = make_url(db_url)
    except (ArgumentError, ValueError):
        raise GrafanaError("--db is not a database URL; expected postgresql://...") from None
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise GrafanaError(
            f"--db is a {url.get_backend_name()} store; Grafana's data source needs the "
            "PostgreSQL store (postgresql://USER:PASSWORD@HOST:PORT/DB)"
        )
    if not url.host or not url.database or not url.username:
        raise GrafanaError("--db must name the host, database and user of the PostgreSQL store")
    sslmode = url.query.get("sslmode", "disable")
    return StoreConnection(
        host=f"{url.host}:{url.port or 5432}",
        database=url.database,
        user=url.username,
        password=SecretStr(url.password) if url.password else None,
        sslmode=sslmode if isinstance(sslmode, str) else sslmode[0],
    )

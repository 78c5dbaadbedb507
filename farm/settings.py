"""Every setting the farm reads from the environment, in one place.

One frozen :class:`Settings` is assembled from small per-service classes (after
Apache Otava's ``config.py``), each declaring its environment variables with a
description. Nothing else in ``farm/`` reads these variables: stages call
:func:`get_settings`. An empty variable counts as unset. Secrets (tokens, webhook URLs,
the store URL, which may carry a password) are ``SecretStr``: masked in ``repr``,
``str`` and model dumps; only the code that uses one calls ``get_secret_value()``.

Subprocesses (engines, the eval harness, build steps) get an explicit environment
from :mod:`farm.engines.environment` and :mod:`farm.builds.environment`: what they
need, never these secrets.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from farm.errors import FarmError
from farm.frozen import Frozen
from farm.job_text import user_path

__all__ = [
    "ENV_VARS",
    "BuildSettings",
    "GitHubSettings",
    "GrafanaSettings",
    "NotifySettings",
    "PathSettings",
    "RaySettings",
    "Settings",
    "SettingsError",
    "StoreSettings",
    "env_vars",
    "get_settings",
    "load_settings",
]


class SettingsError(FarmError):
    """An environment variable holds a value the farm cannot use; names the variable."""


class _Service(BaseSettings):
    """Base of the per-service classes: exact variable names, empty means unset."""

    # case_sensitive: the names are matched exactly, as ``os.environ.get`` did before.
    # validate_by_name: tests build a service by field name, without the environment.
    model_config = SettingsConfigDict(
        frozen=True,
        extra="ignore",
        case_sensitive=True,
        env_ignore_empty=True,
        validate_by_name=True,
        validate_by_alias=True,
        # A timeout of inf or nan is no timeout (and overflows where it is made an int).
        allow_inf_nan=False,
    )


class PathSettings(_Service):
    """Where the farm keeps its files."""

    home: Path = Field(
        Path("~/.mtp-farm"),
        validation_alias="FARM_HOME",
        validate_default=True,
        description="The farm's folder: SQLite store, engine builds, wheels, spool, logs "
        "(default ~/.mtp-farm; ~ is expanded).",
    )
    patches_dir: Path | None = Field(
        None,
        validation_alias="FARM_PATCHES_DIR",
        description="Folder of the engine patch series (<engine>/series.yaml) used instead "
        "of the repository's patches/.",
    )

    @field_validator("home", "patches_dir")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return user_path(value) if value is not None else None


class StoreSettings(_Service):
    """The SQL store."""

    db_url: SecretStr | None = Field(
        None,
        validation_alias="FARM_DB_URL",
        description="SQLAlchemy URL of the store: sqlite:///PATH or "
        "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (default: SQLite FARM_HOME/farm.db). "
        "Secret: it may carry a password.",
    )
    connect_timeout_s: float = Field(
        10.0,
        ge=2,
        validation_alias="FARM_DB_CONNECT_TIMEOUT_S",
        description="Seconds to wait for a PostgreSQL connection (libpq's connect_timeout; "
        "2 at least). A connect_timeout in the store URL wins.",
    )
    statement_timeout_s: float = Field(
        60.0,
        gt=0,
        validation_alias="FARM_DB_STATEMENT_TIMEOUT_S",
        description="Seconds one PostgreSQL statement may run (the server's statement_timeout). "
        "The driver gives up on a store call that has not answered after this plus the "
        "connect timeout (a silent network) and spools the result.",
    )
    keepalive_idle_s: int = Field(
        30,
        gt=0,
        validation_alias="FARM_DB_KEEPALIVE_IDLE_S",
        description="Seconds a PostgreSQL connection may be idle before TCP keepalive probes "
        "start (3 probes, 10 s apart; unacknowledged data gets the same total).",
    )
    heartbeat_s: float = Field(
        30.0,
        gt=0,
        validation_alias="FARM_SWEEP_HEARTBEAT_S",
        description="Seconds between the heartbeats a running sweep's driver writes to the "
        "store; `farm run --resume` refuses a sweep whose heartbeat is younger than 3 of them.",
    )


class NotifySettings(_Service):
    """Alert channels; a channel is on when its URL is set."""

    webhook_url: SecretStr | None = Field(
        None,
        validation_alias="FARM_NOTIFY_WEBHOOK_URL",
        description=(
            "generic webhook: the alert JSON, one POST per alert; a notice (`farm bisect"
            ' --notify`) in one POST whose JSON has "type": "notice"'
        ),
    )
    webhook_secret: SecretStr | None = Field(
        None,
        validation_alias="FARM_NOTIFY_WEBHOOK_SECRET",
        description="optional: HMAC-SHA256 signature header for the webhook",
    )
    slack_url: SecretStr | None = Field(
        None, validation_alias="FARM_NOTIFY_SLACK_URL", description="Slack incoming webhook URL"
    )
    feishu_url: SecretStr | None = Field(
        None,
        validation_alias="FARM_NOTIFY_FEISHU_URL",
        description="Feishu/Lark custom bot webhook URL",
    )
    feishu_secret: SecretStr | None = Field(
        None,
        validation_alias="FARM_NOTIFY_FEISHU_SECRET",
        description="optional: the Feishu bot's signing secret",
    )
    # A plain string, checked by the notifier registry when the channels are built: a
    # typo here fails `farm alerts check`, not every command that reads a setting.
    feishu_format: str = Field(
        "interactive",
        validation_alias="FARM_NOTIFY_FEISHU_FORMAT",
        description="optional: interactive (default) or text",
    )
    wecom_url: SecretStr | None = Field(
        None,
        validation_alias="FARM_NOTIFY_WECOM_URL",
        description="WeCom group bot webhook URL (with key=...)",
    )


class GitHubSettings(_Service):
    """Posting `farm compare` to a pull request."""

    token: SecretStr | None = Field(
        None,
        validation_alias="GITHUB_TOKEN",
        description="GitHub token with write access to the repository's issues and pull "
        "requests (`farm compare --post-github`).",
    )
    api_url: str | None = Field(
        None,
        validation_alias="FARM_GITHUB_API",
        description="GitHub REST API base URL, for GitHub Enterprise "
        "(default: farm.notify.github.DEFAULT_API_URL, https://api.github.com).",
    )
    repository: str | None = Field(
        None,
        validation_alias="GITHUB_REPOSITORY",
        description="OWNER/REPO that `farm pr` posts to when --repo is not given (GitHub "
        "Actions sets it); default: the repository of the source the PR replaces.",
    )
    login: str | None = Field(
        None,
        validation_alias="FARM_GITHUB_LOGIN",
        description="Login of GITHUB_TOKEN's user (an app's bot, NAME[bot]); default: "
        "asked of GET /user. Only its comments are updated by `farm pr`.",
    )
    publish_url: str | None = Field(
        None,
        validation_alias="FARM_PUBLISH_URL",
        description="URL the report folder is served at: `farm pr` links its commit "
        "status to the report there (or --publish-url).",
    )


class GrafanaSettings(_Service):
    """`farm dashboards push`."""

    url: str | None = Field(
        None, validation_alias="GRAFANA_URL", description="Grafana's base URL (or --url)."
    )
    token: SecretStr | None = Field(
        None,
        validation_alias="GRAFANA_TOKEN",
        description="Grafana service account token; never printed.",
    )


class RaySettings(_Service):
    """The Ray cluster's job server (`farm submit`)."""

    api_server_address: str = Field(
        "http://127.0.0.1:8265",
        validation_alias="RAY_API_SERVER_ADDRESS",
        description="The head's dashboard URL, where the job server listens (or --address).",
    )
    auth_token: SecretStr | None = Field(
        None,
        validation_alias="RAY_AUTH_TOKEN",
        description="Bearer token of a cluster with token authentication (Ray >= 2.52).",
    )
    client_timeout_s: float = Field(
        60.0,
        gt=0,
        validation_alias="FARM_RAY_CLIENT_TIMEOUT_S",
        description="Seconds `farm submit` waits for the job server to answer one request "
        "(connect, and each wait for data; an upload that keeps sending is not cut).",
    )


class BuildSettings(_Service):
    """Deadlines of the build stage's subprocesses (git, pip, GNU patch)."""

    git_timeout_s: float = Field(
        900.0,
        gt=0,
        validation_alias="FARM_GIT_TIMEOUT_S",
        description="Seconds one git command of a build may take (a first fetch of a large "
        "engine repository over a slow link is the longest).",
    )
    pip_timeout_s: float = Field(
        7200.0,
        gt=0,
        validation_alias="FARM_PIP_TIMEOUT_S",
        description="Seconds one pip or Python step of a build may take (an engine compiled "
        "from source is the longest).",
    )
    patch_timeout_s: float = Field(
        120.0,
        gt=0,
        validation_alias="FARM_PATCH_TIMEOUT_S",
        description="Seconds one GNU patch run may take.",
    )
    kill_wait_s: float = Field(
        30.0,
        gt=0,
        validation_alias="FARM_KILL_WAIT_S",
        description="Seconds to wait for a timed-out step's processes to exit after SIGKILL "
        "before giving up on them with an error.",
    )


_SERVICES: dict[str, type[_Service]] = {
    "paths": PathSettings,
    "store": StoreSettings,
    "notify": NotifySettings,
    "github": GitHubSettings,
    "grafana": GrafanaSettings,
    "ray": RaySettings,
    "builds": BuildSettings,
}


class Settings(Frozen):
    """All the farm's settings, one field per service."""

    paths: PathSettings
    store: StoreSettings
    notify: NotifySettings
    github: GitHubSettings
    grafana: GrafanaSettings
    ray: RaySettings
    builds: BuildSettings


def env_vars(service: type[BaseSettings]) -> dict[str, str]:
    """The environment variables of one service class, with their descriptions."""
    out = {}
    for field in service.model_fields.values():
        assert isinstance(field.validation_alias, str), "every setting names its variable"
        out[field.validation_alias] = field.description or ""
    return out


ENV_VARS: dict[str, str] = {
    name: doc for service in _SERVICES.values() for name, doc in env_vars(service).items()
}
"""Every environment variable the farm reads, with its description."""


def load_settings() -> Settings:
    """Read every setting from the environment now. Raises SettingsError naming the
    variable whose value is unusable."""
    try:
        parts = {name: service() for name, service in _SERVICES.items()}
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise SettingsError(
            f"unusable environment setting: {problems}; fix or unset the variable"
        ) from None
    return Settings.model_validate(parts)


@functools.lru_cache(maxsize=4)
def _cached(_snapshot: tuple[str | None, ...]) -> Settings:
    return load_settings()


def get_settings() -> Settings:
    """The settings for the current environment, read once per distinct environment.

    The cache is keyed by the values of :data:`ENV_VARS`, so a test that sets or
    removes one of them (``monkeypatch.setenv``, ``CliRunner(env=...)``) gets fresh
    settings without resetting anything.
    """
    return _cached(tuple(os.environ.get(name) for name in ENV_VARS))

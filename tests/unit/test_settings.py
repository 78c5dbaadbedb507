"""farm.settings: one place reads the environment; names, defaults and masking."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from farm.builds.series import bundled_patches_dir
from farm.paths import farm_home
from farm.settings import ENV_VARS, Settings, get_settings, load_settings
from farm.store import default_db_url

FARM = Path(__file__).resolve().parents[2] / "farm"

# The names the README, deploy files and users' shells already use: never renamed.
NAMES = {
    "FARM_HOME",
    "FARM_DB_URL",
    "FARM_PATCHES_DIR",
    "FARM_NOTIFY_WEBHOOK_URL",
    "FARM_NOTIFY_WEBHOOK_SECRET",
    "FARM_NOTIFY_SLACK_URL",
    "FARM_NOTIFY_FEISHU_URL",
    "FARM_NOTIFY_FEISHU_SECRET",
    "FARM_NOTIFY_FEISHU_FORMAT",
    "FARM_NOTIFY_WECOM_URL",
    "GITHUB_TOKEN",
    "FARM_GITHUB_API",
    "FARM_GITHUB_LOGIN",
    "GITHUB_REPOSITORY",
    "FARM_PUBLISH_URL",
    "GRAFANA_URL",
    "GRAFANA_TOKEN",
    "RAY_API_SERVER_ADDRESS",
    "RAY_AUTH_TOKEN",
    "FARM_DB_CONNECT_TIMEOUT_S",
    "FARM_DB_STATEMENT_TIMEOUT_S",
    "FARM_DB_KEEPALIVE_IDLE_S",
    "FARM_SWEEP_HEARTBEAT_S",
    "FARM_RAY_CLIENT_TIMEOUT_S",
    "FARM_GIT_TIMEOUT_S",
    "FARM_PIP_TIMEOUT_S",
    "FARM_PATCH_TIMEOUT_S",
    "FARM_KILL_WAIT_S",
}
SECRETS = {
    "FARM_DB_URL": "postgresql://farm:pg-Secret-1@db/farm",
    "FARM_NOTIFY_WEBHOOK_URL": "https://hooks.example/wh-Secret-2",
    "FARM_NOTIFY_WEBHOOK_SECRET": "wh-Secret-3",
    "FARM_NOTIFY_SLACK_URL": "https://hooks.slack.com/services/T/B/sl-Secret-4",
    "FARM_NOTIFY_FEISHU_URL": "https://open.feishu.cn/hook/fs-Secret-5",
    "FARM_NOTIFY_FEISHU_SECRET": "fs-Secret-6",
    "FARM_NOTIFY_WECOM_URL": "https://qyapi.weixin.qq.com/send?key=wc-Secret-7",
    "GITHUB_TOKEN": "ghp_Secret-8",
    "GRAFANA_TOKEN": "glsa_Secret-9",
    "RAY_AUTH_TOKEN": "ray-Secret-10",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_every_variable_is_declared_once_with_a_description() -> None:
    assert set(ENV_VARS) == NAMES
    assert all(doc.strip() for doc in ENV_VARS.values())


def test_defaults_are_what_they_always_were(clean_env: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.paths.home == Path("~/.mtp-farm").expanduser()
    assert s.paths.patches_dir is None
    assert s.store.db_url is None
    assert s.notify.feishu_format == "interactive"
    assert s.github.token is None and s.github.api_url is None
    assert s.grafana.url is None and s.grafana.token is None
    assert s.ray.api_server_address == "http://127.0.0.1:8265"
    assert s.ray.auth_token is None
    assert bundled_patches_dir() == FARM.parent / "patches"


def test_each_variable_reaches_its_field(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in SECRETS.items():
        clean_env.setenv(name, value)
    clean_env.setenv("FARM_HOME", str(tmp_path / "home"))
    clean_env.setenv("FARM_PATCHES_DIR", str(tmp_path / "patches"))
    clean_env.setenv("FARM_NOTIFY_FEISHU_FORMAT", "text")
    clean_env.setenv("FARM_GITHUB_API", "https://ghe.example/api/v3")
    clean_env.setenv("GRAFANA_URL", "http://grafana:3000")
    clean_env.setenv("RAY_API_SERVER_ADDRESS", "http://head:8265")
    s = get_settings()
    assert farm_home() == tmp_path / "home" and (tmp_path / "home").is_dir()
    assert bundled_patches_dir() == tmp_path / "patches"
    assert default_db_url() == SECRETS["FARM_DB_URL"]
    assert s.notify.feishu_format == "text"
    assert s.github.api_url == "https://ghe.example/api/v3"
    assert s.grafana.url == "http://grafana:3000"
    assert s.ray.api_server_address == "http://head:8265"
    revealed = {
        "FARM_NOTIFY_WEBHOOK_URL": s.notify.webhook_url,
        "FARM_NOTIFY_WEBHOOK_SECRET": s.notify.webhook_secret,
        "FARM_NOTIFY_SLACK_URL": s.notify.slack_url,
        "FARM_NOTIFY_FEISHU_URL": s.notify.feishu_url,
        "FARM_NOTIFY_FEISHU_SECRET": s.notify.feishu_secret,
        "FARM_NOTIFY_WECOM_URL": s.notify.wecom_url,
        "GITHUB_TOKEN": s.github.token,
        "GRAFANA_TOKEN": s.grafana.token,
        "RAY_AUTH_TOKEN": s.ray.auth_token,
    }
    for name, secret in revealed.items():
        assert isinstance(secret, SecretStr) and secret.get_secret_value() == SECRETS[name]


def test_secrets_are_masked_in_repr_str_and_dumps(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        clean_env.setenv(name, value)
    s = get_settings()
    shown = [repr(s), str(s), s.model_dump_json(), str(s.model_dump())]
    for text in shown:
        for value in SECRETS.values():
            assert value not in text
            assert "Secret-" not in text


def test_an_empty_variable_counts_as_unset(clean_env: pytest.MonkeyPatch) -> None:
    for name in ("FARM_HOME", "FARM_DB_URL", "GITHUB_TOKEN", "FARM_NOTIFY_FEISHU_FORMAT"):
        clean_env.setenv(name, "")
    s = get_settings()
    assert s.paths.home == Path("~/.mtp-farm").expanduser()
    assert s.store.db_url is None and s.github.token is None
    assert s.notify.feishu_format == "interactive"


def test_get_settings_is_cached_and_follows_the_environment(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = get_settings()
    assert get_settings() is first  # read once per environment
    clean_env.setenv("FARM_HOME", str(tmp_path))
    changed = get_settings()
    assert changed is not first and changed.paths.home == tmp_path
    clean_env.delenv("FARM_HOME")
    assert get_settings().paths.home == first.paths.home


def test_settings_assemble_from_the_services() -> None:
    assert list(Settings.model_fields) == [
        "paths",
        "store",
        "notify",
        "github",
        "grafana",
        "ray",
        "builds",
    ]


_READ = re.compile(r"""(?:os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["']([A-Z0-9_]+)""")


def test_nothing_else_in_farm_reads_these_variables() -> None:
    offenders = []
    for path in sorted(FARM.rglob("*.py")):
        if path.name == "settings.py" and path.parent == FARM:
            continue
        text = path.read_text()
        offenders += [f"{path}: {m}" for m in _READ.findall(text) if m in NAMES]
        if "envvar=" in text:  # typer options reading the environment on their own
            offenders.append(f"{path}: envvar=")
    assert offenders == []

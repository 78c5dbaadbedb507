"""Build steps run untrusted code: they see none of the driver's secrets, and a hung one
is killed at its deadline with a message naming it.

The engine is the fake ``vllm`` package of test_source_builds (it satisfies the vLLM
adapter's import check), built for real from a source tree by pip: its ``setup.py`` and
its server module write the environment they see to files, as a pull request's code
could send it anywhere.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.builds.environment import StepTimeoutError
from farm.builds.sources import SourceError, resolve_source
from farm.builds.venv import ensure_build
from farm.spec import EngineSpec

# The driver's secrets and other secret-looking names.
SECRETS = {
    "FARM_DB_URL": "postgresql://farm:pg-BuildSecret-1@db.invalid/farm",
    "FARM_DB_PASSWORD": "pg-BuildSecret-2",
    "RAY_AUTH_TOKEN": "ray-BuildSecret-3",
    "GITHUB_TOKEN": "ghp_BuildSecret4",
    "GRAFANA_TOKEN": "glsa_BuildSecret5",
    "FARM_NOTIFY_SLACK_URL": "https://hooks.slack.invalid/services/BuildSecret6",
    "FARM_NOTIFY_WEBHOOK_SECRET": "wh-BuildSecret-7",
    "AWS_SECRET_ACCESS_KEY": "aws-BuildSecret-8",
    "PIP_PASSWORD": "pip-BuildSecret-9",
    "SOME_SERVICE_API_KEY": "key-BuildSecret-10",
}
PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "0.0.1"

[tool.setuptools.packages.find]
include = ["vllm*"]
"""
DUMP = """\
import json, os
with open({path!r}, "w") as f:
    json.dump(dict(os.environ), f)
"""


def _fake_vllm(root: Path, setup_py: str, server_py: str = "") -> Path:
    api = root / "vllm" / "entrypoints" / "openai"
    api.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    for init in (root / "vllm" / "entrypoints", api):
        (init / "__init__.py").write_text("")
    (api / "api_server.py").write_text(server_py or "# the fake engine's server\n")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "setup.py").write_text(setup_py)
    return root


def _tree_engine(name: str, root: Path) -> EngineSpec:
    spec = {"name": name, "family": "vllm", "package": "vllm"}
    return EngineSpec.model_validate({**spec, "source": {"kind": "tree", "path": str(root)}})


def test_build_steps_see_none_of_the_drivers_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: pip (and so the tree's setup.py) and the import check inherited the whole
    environment: the store password and every token."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    at_install, at_import = tmp_path / "install-env.json", tmp_path / "import-env.json"
    setup = DUMP.format(path=str(at_install)) + "from setuptools import setup\nsetup()\n"
    tree = _fake_vllm(tmp_path / "src", setup, DUMP.format(path=str(at_import)))
    build = ensure_build(_tree_engine("fake-vllm-env", tree), tmp_path / "cache")
    assert Path(build.python).exists()
    for seen in (at_install, at_import):
        env = json.loads(seen.read_text())
        text = json.dumps(env)
        leaked = [name for name, value in SECRETS.items() if value in text or name in env]
        assert not leaked, f"{seen.name}: {leaked}"
        assert env["PATH"] and env["HOME"] == os.environ["HOME"]
        for name in ("PIP_FIND_LINKS", "LANG", "TMPDIR", "https_proxy"):
            if name in os.environ:  # passed on: pip and downloads need them
                assert env[name] == os.environ[name], name


def test_a_hanging_install_is_killed_at_the_pip_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: pip had no timeout, so a build backend that hung held the sweep for good."""
    pid_file = tmp_path / "setup.pid"
    hang = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
    hang += "time.sleep(3600)\n"
    tree = _fake_vllm(tmp_path / "src", hang)
    monkeypatch.setenv("FARM_PIP_TIMEOUT_S", "45")
    started = time.monotonic()
    with pytest.raises(StepTimeoutError) as info:
        ensure_build(_tree_engine("fake-vllm-hang", tree), tmp_path / "cache")
    took = time.monotonic() - started
    message = str(info.value)
    assert "no end after 45 s, killed:" in message and "FARM_PIP_TIMEOUT_S" in message
    assert message.startswith("could not install the engine: no end after 45 s")
    assert took < 45 * 2 + 30  # once, not retried
    # The backend ran, and went with pip's process group.
    pid = int(pid_file.read_text())
    time.sleep(1)
    assert not Path(f"/proc/{pid}").exists() or " Z " in Path(f"/proc/{pid}/stat").read_text()


@pytest.fixture
def silent_git_server() -> Iterator[str]:
    """A git:// address that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"git://127.0.0.1:{server.getsockname()[1]}/vllm.git"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def test_a_git_remote_that_never_answers_fails_at_the_git_deadline(
    silent_git_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `git ls-remote` against a silent server hung `farm plan` and every build."""
    monkeypatch.setenv("FARM_GIT_TIMEOUT_S", "2")
    engine = EngineSpec.model_validate(
        {
            "name": "fake-vllm-git",
            "family": "vllm",
            "package": "vllm",
            "source": {"kind": "git", "repo": silent_git_server, "ref": "main"},
        }
    )
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        resolve_source(engine)
    assert time.monotonic() - started < 20
    message = str(info.value)
    assert message.startswith(f"engine fake-vllm-git: source git {silent_git_server}@main:")
    assert "could not run git ls-remote: no end after 2 s, killed" in message
    assert "FARM_GIT_TIMEOUT_S" in message

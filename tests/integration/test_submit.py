"""`farm submit` against a real Ray head with its dashboard job server.

The head is `ray start --head --block` in its own process group, on free ports, with
token authentication on (RAY_AUTH_MODE=token and a token made for the test, as the
deploy files do with RAY_AUTH_TOKEN). The submitted job is `farm run jobs/local.yaml
--dry-run`: a real `farm run` entrypoint, run by the job server from the uploaded
checkout, that plans and stops (no engine on a 2-core test machine).

The head has its own FARM_DB_URL (as the deploy files give it, from a secret): the job
finds its store there, and nothing the job server returns about a job holds a secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.cli.submit import SubmitError, make_submission
from farm.orchestrate.jobs import JobServer

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
CLUSTER_DB_URL = "postgresql://farm:cluster-Pg-Secret@db.invalid:5432/farm"
# What the submitting machine holds: none of it may reach the job's description.
SUBMITTER_SECRETS = {
    "FARM_DB_URL": "postgresql://farm:submitter-Pg-Secret@db.invalid:5432/farm",
    "GITHUB_TOKEN": "ghp_submitterSecret123",
    "GRAFANA_TOKEN": "glsa_submitterSecret456",
    "FARM_NOTIFY_SLACK_URL": "https://hooks.slack.invalid/services/submitterSecret789",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the head's process group, then SIGKILL what is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    # ray start may exit before all its children (gcs_server, dashboard) have.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture()
def ray_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head with the job server; yields its dashboard URL and the client's env."""
    # A short temp dir: Ray's socket paths must fit in 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="farm-ray-"))
    token = secrets.token_hex(32)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        # The cluster's own store, as deploy/ sets it on the head.
        "FARM_DB_URL": CLUSTER_DB_URL,
    }
    dashboard = _free_port()
    # Every port the head opens is chosen here: the defaults (6379, 8265, 10001,
    # 52365 ...) may be held by another Ray on the machine.
    ports = {
        "--port": _free_port(),
        "--dashboard-port": dashboard,
        "--dashboard-agent-listen-port": _free_port(),
        "--dashboard-agent-grpc-port": _free_port(),
        "--metrics-export-port": _free_port(),
        "--runtime-env-agent-port": _free_port(),
        "--ray-client-server-port": _free_port(),
        "--node-manager-port": _free_port(),
        "--object-manager-port": _free_port(),
    }
    argv = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        "--num-cpus=1",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--temp-dir={temp}",
        *(f"{k}={v}" for k, v in ports.items()),
    ]
    log = open(tmp_path / "ray-head.log", "wb")  # noqa: SIM115 - closed in the finally
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                tail = (tmp_path / "ray-head.log").read_text()[-3000:]
                pytest.fail(f"ray start exited {proc.returncode}: {tail}")
            try:
                headers = {"Authorization": f"Bearer {token}"}
                if httpx.get(f"{url}/api/version", headers=headers, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the Ray dashboard did not answer within 120 s")
            time.sleep(1)
        yield url, {"RAY_AUTH_TOKEN": token, "RAY_AUTH_MODE": None}  # type: ignore[dict-item]
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_submitted_sweep_runs_as_a_ray_job_and_succeeds(
    ray_head: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, env = ray_head
    job = str(REPO / "jobs" / "local.yaml")
    args = ["submit", job, "--address", url, "--working-dir", str(REPO), "--dry-run"]
    # The job server's agent may take a few seconds after the dashboard answers.
    deadline = time.monotonic() + 90
    while True:
        result = runner.invoke(
            app, [*args, "--wait"], env={**env, **SUBMITTER_SECRETS, "COLUMNS": "200"}
        )
        if result.exit_code == 0 or time.monotonic() > deadline:
            break
        if "No available agent" not in result.output + str(result.exception):
            break
        time.sleep(3)
    assert result.exit_code == 0, result.output + repr(result.exception)
    job_id = next(
        line.split()[1].rstrip(":")
        for line in result.output.splitlines()
        if line.startswith("submitted ")
    )
    assert f"{job_id}: SUCCEEDED" in result.output
    status = runner.invoke(app, ["submit", "--address", url, "--status", job_id], env=env)
    assert status.exit_code == 0 and "SUCCEEDED" in status.output, status.output
    logs = runner.invoke(app, ["submit", "--address", url, "--logs", job_id], env=env)
    # The job's own output: the plan of jobs/local.yaml, made on the cluster.
    assert "local: 16 server cells" in logs.output, logs.output[-2000:]

    # What any reader of the job API gets back about the job: no secret of the submitter.
    auth = {"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}
    described = httpx.get(f"{url}/api/jobs/{job_id}", headers=auth, timeout=10)
    assert described.status_code == 200 and job_id in described.text
    for name, secret in SUBMITTER_SECRETS.items():
        assert secret not in described.text, name
    assert "FARM_DB_URL" not in json.dumps(described.json().get("runtime_env") or {})

    # A job run by the head sees the head's own FARM_DB_URL: where the sweep finds its store.
    monkeypatch.setenv("RAY_AUTH_TOKEN", env["RAY_AUTH_TOKEN"])
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    server = JobServer(url)
    probe = "import os; print('store url is', os.environ.get('FARM_DB_URL'))"
    probe_id = server.submit(shlex.join([sys.executable, "-c", probe]), {}, {})
    assert server.wait(probe_id, poll_s=0.5) == "SUCCEEDED", server.logs(probe_id)
    assert f"store url is {CLUSTER_DB_URL}" in server.logs(probe_id)

    without_token = runner.invoke(
        app,
        ["submit", "--address", url, "--status", job_id],
        env={"RAY_AUTH_TOKEN": None, "RAY_AUTH_MODE": "disabled"},
    )
    assert without_token.exit_code == 2
    assert "cannot reach the Ray job server" in without_token.output


def test_submission_runs_farm_run_from_the_uploaded_checkout(tmp_path: Path) -> None:
    spec = make_submission(
        REPO / "jobs" / "local.yaml",
        REPO,
        only=["mtp_depth=1"],
        db_url="postgresql://farm@db:5432/farm",
        resume=7,
    )
    assert spec.entrypoint == (
        "farm run jobs/local.yaml --ray-address auto --only mtp_depth=1 --resume 7"
    )
    assert spec.runtime_env["working_dir"] == str(REPO)
    assert ".venv" in spec.runtime_env["excludes"]
    assert spec.runtime_env["env_vars"] == {"FARM_DB_URL": "postgresql://farm@db:5432/farm"}
    with pytest.raises(SubmitError, match="outside the working directory"):
        make_submission(REPO / "jobs" / "local.yaml", tmp_path)


def test_the_submission_payload_carries_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `--db URL` put the URL, password and all, in runtime_env.env_vars, which the
    job server returns to every reader. Now the payload holds no secret of the submitter,
    and a URL with a password is refused with what to do instead."""
    for name, value in {**SUBMITTER_SECRETS, "RAY_AUTH_TOKEN": "ray-submitterSecret"}.items():
        monkeypatch.setenv(name, value)
    job = REPO / "jobs" / "local.yaml"
    spec = make_submission(job, REPO, only=["mtp_depth=1"], resume=3, dry_run=True)
    payload = json.dumps(dataclasses.asdict(spec))
    for secret in [*SUBMITTER_SECRETS.values(), "ray-submitterSecret"]:
        assert secret not in payload
    assert "env_vars" not in spec.runtime_env  # the job reads the cluster's FARM_DB_URL

    for url in (
        "postgresql://farm:pg-Secret@db:5432/farm",
        "postgresql://farm@db/farm?password=pg-Secret",
    ):
        with pytest.raises(SubmitError, match="holds a password") as info:
            make_submission(job, REPO, db_url=url)
        assert "pg-Secret" not in str(info.value)
        assert "cluster's own FARM_DB_URL" in str(info.value)
    refused = runner.invoke(
        app,
        [
            "submit",
            str(job),
            "--address",
            "http://127.0.0.1:9",
            "--db",
            SUBMITTER_SECRETS["FARM_DB_URL"],
        ],
    )
    assert refused.exit_code == 2
    assert "holds a password" in refused.output
    assert "submitter-Pg-Secret" not in refused.output


def test_a_job_server_that_never_answers_times_out_naming_the_request() -> None:
    """Before: the SDK sent requests without a timeout, so a head that accepted the
    connection and never answered held `farm submit` for good."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts (the kernel does), never answers
        address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(SubmitError, match=r"did not answer GET /api/version within 1 s"):
            JobServer(address, timeout_s=1)
        assert time.monotonic() - started < 10
        result = runner.invoke(
            app,
            ["submit", "--address", address, "--status", "raysubmit_x"],
            env={"FARM_RAY_CLIENT_TIMEOUT_S": "1"},
        )
    assert result.exit_code == 2
    assert "FARM_RAY_CLIENT_TIMEOUT_S" in result.output

"""Secrets stay in the driver: build steps get an explicit environment, and what the farm
shows or stores (plans, job files, command lines, errors) has its secrets masked; a
build step that hangs is killed at its deadline, naming the command."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from farm.builds.environment import (
    StepTimeoutError,
    build_environment,
    git_environment,
    run_step,
    stream_step,
)
from farm.cli.main import app
from farm.masking import MASK, mask_argv, mask_env, mask_job_yaml, mask_text

REPO = Path(__file__).resolve().parents[2]

# What a driver's environment holds, and what else looks secret.
SECRETS = {
    "FARM_DB_URL": "postgresql://farm:pg-Secret-1@db/farm",
    "FARM_DB_PASSWORD": "pg-Secret-2",
    "RAY_AUTH_TOKEN": "ray-Secret-3",
    "GITHUB_TOKEN": "ghp_Secret4",
    "GRAFANA_TOKEN": "glsa_Secret5",
    "FARM_NOTIFY_SLACK_URL": "https://hooks.slack.com/services/T/B/sl-Secret-6",
    "FARM_NOTIFY_WEBHOOK_SECRET": "wh-Secret-7",
    "AWS_SECRET_ACCESS_KEY": "aws-Secret-8",
    "PIP_PASSWORD": "pip-Secret-9",
    "GIT_TOKEN": "git-Secret-10",
    "MY_SERVICE_API_KEY": "key-Secret-11",
}
NEEDED = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/farm",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/var/tmp",
    "https_proxy": "http://proxy:3128",
    "NO_PROXY": "localhost",
    "PIP_FIND_LINKS": "/opt/wheels",
    "PIP_INDEX_URL": "https://pypi.example/simple",
    "GIT_SSL_CAINFO": "/etc/ssl/ca.pem",
    "MAX_JOBS": "8",
}


def test_a_build_step_gets_what_builds_need_and_no_secret() -> None:
    inherited = {**SECRETS, **NEEDED, "SSH_AUTH_SOCK": "/run/agent", "VIRTUAL_ENV": "/x"}
    env = build_environment({"STEP": "1", "HF_TOKEN": "job-set"}, inherited)
    for name, value in NEEDED.items():
        assert env[name] == value, name
    assert not set(SECRETS) & set(env)
    assert not any(secret in "\n".join(env.values()) for secret in SECRETS.values())
    assert "SSH_AUTH_SOCK" not in env and "VIRTUAL_ENV" not in env
    assert env["STEP"] == "1" and env["HF_TOKEN"] == "job-set"  # what the step sets wins


def test_the_farms_own_git_gets_the_ssh_agent_and_never_prompts() -> None:
    env = git_environment(inherited={**SECRETS, **NEEDED, "SSH_AUTH_SOCK": "/run/agent"})
    assert env["SSH_AUTH_SOCK"] == "/run/agent"
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["GIT_SSL_CAINFO"] == "/etc/ssl/ca.pem"
    assert not set(SECRETS) & set(env)


def test_urls_lose_their_credentials() -> None:
    assert mask_text("postgresql://farm:p@ss@db:5432/farm") == "postgresql://farm:***@db:5432/farm"
    assert mask_text("fetch https://x-access-token:ghs_1@github.com/o/r") == (
        "fetch https://x-access-token:***@github.com/o/r"
    )
    assert mask_text("https://ghp_abc@github.com/o/r.git") == "https://***@github.com/o/r.git"
    # A login is no secret: ssh://git@ and scp-like git@host: stay readable.
    assert mask_text("ssh://git@host/r git@github.com:o/r") == "ssh://git@host/r git@github.com:o/r"


def test_env_and_argv_are_masked_where_shown() -> None:
    shown = mask_env({"HF_TOKEN": "hf_1", "STORE": "postgresql://u:pw@h/d", "OMP_NUM_THREADS": "4"})
    assert shown == {"HF_TOKEN": MASK, "STORE": "postgresql://u:***@h/d", "OMP_NUM_THREADS": "4"}
    argv = ["serve", "--api-key", "sk-1", "--hf-token=hf_2", "--tokenizer", "/m"]
    argv += ["--max-num-batched-tokens", "256", "https://u:pw@h/x"]
    assert mask_argv(argv) == [
        "serve",
        "--api-key",
        MASK,
        f"--hf-token={MASK}",
        "--tokenizer",
        "/m",
        "--max-num-batched-tokens",
        "256",
        "https://u:***@h/x",
    ]


JOB = """\
# a job with secrets in its env (comments and layout are kept)
name: leaky
engines:
  - name: e
    family: vllm
    package: vllm
    version: 0.11.0
    source: {kind: git, repo: "https://ghp_inUrl1@github.com/o/vllm", ref: main}
    env: {HF_TOKEN: hf_inFlow2, VLLM_USE_V1: "1"}
workloads:
  - name: w
    max_tokens: 256
    harness:
      env:
        OPENAI_API_KEY: &k sk-inBlock3
        DB_PASSWORD: |
          multi-line-Secret4
        SEED: "256"
"""


def test_a_stored_job_file_keeps_its_layout_and_loses_its_secrets() -> None:
    masked = mask_job_yaml(JOB)
    for secret in ("ghp_inUrl1", "hf_inFlow2", "sk-inBlock3", "multi-line-Secret4"):
        assert secret not in masked
    assert masked.splitlines()[0] == JOB.splitlines()[0]  # the comment is kept
    loaded = yaml.safe_load(masked)
    assert loaded["engines"][0]["env"] == {"HF_TOKEN": MASK, "VLLM_USE_V1": "1"}
    harness = loaded["workloads"][0]["harness"]["env"]
    assert harness == {"OPENAI_API_KEY": MASK, "DB_PASSWORD": MASK, "SEED": "256"}
    assert loaded["workloads"][0]["max_tokens"] == 256  # a non-env key with "token" is data
    assert loaded["engines"][0]["source"]["repo"] == "https://***@github.com/o/vllm"
    assert mask_job_yaml("not: [valid") == "not: [valid"


def test_farm_plan_shows_no_secret_env_value(tmp_path: Path) -> None:
    job = (REPO / "jobs" / "local.yaml").read_text()
    job = job.replace(
        'VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "1"\n      HF_TOKEN: hf_planSecret'
    )
    job = job.replace("../", f"{REPO}/")
    (tmp_path / "job.yaml").write_text(job)
    only = ["graph_mode=eager", "mtp_depth=1", "sliding_window=on", "thinking=on"]
    args = ["plan", str(tmp_path / "job.yaml"), *(x for o in only for x in ("--only", o))]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert re.search(r"HF_TOKEN='?\*\*\*'?", result.output)  # shell-quoted or not
    assert "hf_planSecret" not in result.output


# --- deadlines ---------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_step_past_its_deadline_is_killed_with_its_children(tmp_path: Path) -> None:
    """Before: git, pip and patch ran without a timeout; a hung step hung the build."""
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; echo started; wait"
    started = time.monotonic()
    with pytest.raises(StepTimeoutError) as info:
        run_step(
            ["sh", "-c", script],
            what="run the hanging step",
            timeout_s=1,
            kill_wait_s=5,
            setting="FARM_TEST_TIMEOUT_S",
            env=build_environment(),
        )
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert message.startswith("could not run the hanging step: no end after 1 s, killed: sh -c")
    assert "FARM_TEST_TIMEOUT_S" in message
    grandchild = int(pids.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)  # the whole group went, not just sh


def test_a_streamed_step_past_its_deadline_is_killed(tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(StepTimeoutError, match=r"could not install: no end after 1 s"):
        stream_step(
            ["sh", "-c", "echo one; sleep 300"],
            lines.append,
            what="install",
            timeout_s=1,
            kill_wait_s=5,
            setting="FARM_PIP_TIMEOUT_S",
            env=build_environment(),
        )
    assert lines == ["one"]
    done = run_step(
        ["sh", "-c", "echo ok; exit 3"],
        what="x",
        timeout_s=5,
        kill_wait_s=5,
        setting="S",
        env=build_environment(),
    )
    assert (done.returncode, done.stdout) == (3, "ok\n")


def test_a_timed_out_command_line_is_shown_masked() -> None:
    with pytest.raises(StepTimeoutError) as info:
        run_step(
            ["sh", "-c", "sleep 30", "https://user:pw-Secret@h/x", "--token", "tok-Secret"],
            what="wait",
            timeout_s=0.5,
            kill_wait_s=5,
            setting="S",
            env=build_environment(),
        )
    assert "sh -c sleep 30 https://user:***@h/x --token ***" in str(info.value)
    assert not re.search(r"pw-Secret|tok-Secret", str(info.value))

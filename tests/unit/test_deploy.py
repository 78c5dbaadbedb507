"""The deploy files parse and agree with what the farm relies on.

NPU counts declared to Ray match the Ascend device-plugin limits, the pools the job
specs use exist as node labels, schedules are valid, and every scheduled command is
a real `farm` command line (parsed by the CLI itself, not just grepped).
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from farm.cli.main import app

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ASCEND = "huawei.com/Ascend910"


def _yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def _check_farm_argv(argv: list[str]) -> Any:
    """Parse ``argv`` (``farm <command> ...``) with the farm's own CLI; fail if it cannot.

    Returns the parsed context (``.params``); raises the CLI's UsageError on bad options.
    """
    assert Path(argv[0]).name == "farm", argv
    commands = get_command(app).commands  # type: ignore[attr-defined]
    command = commands.get(argv[1])
    assert command is not None, f"`farm {argv[1]}` is not a farm command"
    return command.make_context(f"farm {argv[1]}", list(argv[2:]))


def _job_pools() -> set[str]:
    """Pools that job specs pin cells to (engines' pools, resources.label_selector.pool)."""
    pools: set[str] = set()
    for path in (REPO / "jobs").glob("*.yaml"):
        job = yaml.safe_load(path.read_text())
        for engine in job.get("engines", []):
            pools.update(engine.get("pools", []))
        selector = (job.get("resources") or {}).get("label_selector", {}).get("pool")
        if selector:
            body = selector.lstrip("!")
            pools.update(body[3:-1].split(",") if body.startswith("in(") else [body])
    return {p.strip() for p in pools}


_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _valid_cron(expr: str) -> bool:
    fields = expr.split()
    if len(fields) != 5:
        return False
    for field, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        for part in field.split(","):
            base, _, step = part.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return False
            if base == "*":
                continue
            bounds = base.split("-")
            if not all(b.isdigit() and low <= int(b) <= high for b in bounds) or len(bounds) > 2:
                return False
    return True


def test_cron_checker_refuses_bad_schedules() -> None:
    assert _valid_cron("0 1 * * *") and _valid_cron("*/15 0-6 1,15 * 1-5")
    assert not _valid_cron("0 25 * * *") and not _valid_cron("0 1 * *")
    assert not _valid_cron("61 1 * * *") and not _valid_cron("0 1 * * */0")


def test_kuberay_npu_resources_match_the_ascend_limits_and_pools_cover_the_jobs() -> None:
    cluster = _yaml("kuberay-raycluster.yaml")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    spec = cluster["spec"]
    head = spec["headGroupSpec"]
    assert json.loads(json.loads(head["rayStartParams"]["resources"])) == {"NPU": 0}
    pools = set()
    for group in spec["workerGroupSpecs"]:
        params = group["rayStartParams"]
        # KubeRay passes the value to `ray start --resources` as written: a quoted
        # JSON string that holds the JSON object.
        declared = json.loads(json.loads(params["resources"]))
        (container,) = group["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        assert declared["NPU"] == limits[ASCEND] == container["resources"]["requests"][ASCEND]
        assert declared["NPU"] > 0, group["groupName"]
        labels = dict(kv.split("=", 1) for kv in params["labels"].split(","))
        assert labels["pool"] == group["groupName"]
        pools.add(labels["pool"])
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
    assert _job_pools() <= pools, f"jobs use pools the cluster lacks: {_job_pools() - pools}"


def test_ray_up_config_declares_npus_pools_and_token_auth() -> None:
    config = _yaml("ray-cluster.yaml")
    assert config["provider"]["type"] == "local"
    assert config["max_workers"] == len(config["provider"]["worker_ips"])
    head = " ".join(config["head_start_ray_commands"])
    assert "--head" in head and "--dashboard-port=8265" in head
    assert "--resources='{\"NPU\": 0}'" in head
    (worker,) = [c for c in config["worker_start_ray_commands"] if "ray start" in c]
    assert '--resources="{\\"NPU\\": ${FARM_NPUS}}"' in worker
    assert '--labels="pool=${FARM_POOL}"' in worker
    for command in (head, worker):
        assert "RAY_AUTH_MODE=token" in command
    assert "~/.ray/auth_token" in config["file_mounts"]


def test_compose_runs_postgresql_and_grafana() -> None:
    services = _yaml("docker-compose.yaml")["services"]
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:")
    assert "5432:5432" in pg["ports"]
    assert pg["environment"]["POSTGRES_DB"] == "farm"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    assert grafana["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_nightly_cronjob_runs_a_real_farm_command_on_schedule() -> None:
    cron = _yaml("nightly-cronjob.yaml")
    assert cron["kind"] == "CronJob"
    assert _valid_cron(cron["spec"]["schedule"])
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    ctx = _check_farm_argv(container["command"])
    assert container["command"][1] == "nightly" and ctx.params["publish"] is not None
    assert ctx.params["ray_address"].startswith("ray://")
    assert (REPO / ctx.params["job_file"]).is_file()
    assert ctx.params["job_file"].name == "nightly-ascend.yaml"
    env = {e["name"]: e for e in container["env"]}
    assert "secretKeyRef" in env["FARM_DB_URL"]["valueFrom"]
    assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def test_systemd_timer_starts_the_service_that_runs_the_nightly() -> None:
    service = _unit("mtp-farm-nightly.service")
    timer = _unit("mtp-farm-nightly.timer")
    assert service["Service"]["Type"] == "oneshot"
    argv = shlex.split(service["Service"]["ExecStart"])
    ctx = _check_farm_argv(argv)
    assert argv[1] == "nightly" and ctx.params["job_file"].name == "nightly-ascend.yaml"
    assert (REPO / ctx.params["job_file"]).is_file()
    assert re.fullmatch(r"[\d.]+:\d+", ctx.params["ray_address"])
    assert timer["Timer"]["Unit"] == "mtp-farm-nightly.service"
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d", timer["Timer"]["OnCalendar"])
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_github_nightly_workflow_runs_farm_nightly_on_a_self_hosted_runner() -> None:
    flow = yaml.safe_load((DEPLOY / "github" / "nightly.yml").read_text())
    on = flow[True]  # YAML 1.1 reads the bare key `on` as a boolean
    [schedule] = on["schedule"]
    assert _valid_cron(schedule["cron"]) and "workflow_dispatch" in on
    [job] = flow["jobs"].values()
    assert "self-hosted" in job["runs-on"] and flow["concurrency"]["cancel-in-progress"] is False
    for name in ("FARM_DB_URL", "RAY_AUTH_TOKEN"):
        assert job["env"][name] == "${{ secrets." + name + " }}"
    run = next(s for s in job["steps"] if "run" in s)["run"]
    line = next(x for x in run.splitlines() if x.strip().startswith("args=("))
    words = shlex.split(line.strip()[len("args=(") : -1])
    values = {"$JOB": "jobs/nightly-ascend.yaml", "$RAY_ADDRESS_VAR": "h:6379", "$SITE": "/s"}
    ctx = _check_farm_argv(["farm", *(values.get(w, w) for w in words)])
    assert words[0] == "nightly" and (REPO / ctx.params["job_file"]).is_file()
    assert ctx.params["publish"] is not None


def test_a_wrong_command_line_is_caught() -> None:
    with pytest.raises(AssertionError, match="not a farm command"):
        _check_farm_argv(["farm", "runn", "jobs/nightly-ascend.yaml"])
    with pytest.raises(Exception, match="No such option") as info:
        _check_farm_argv(["farm", "run", "jobs/nightly-ascend.yaml", "--ray-adress", "x"])
    assert type(info.value).__name__ == "NoSuchOption"


def _compose_default(value: str) -> str:
    """The default of a compose ``${VAR:-default}`` value (the value itself otherwise)."""
    m = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
    return m.group(1) if m else value


def test_grafana_reads_the_store_as_a_read_only_role_over_tls() -> None:
    """Before: Grafana used the store's owner (it could write and drop results) with
    sslmode=disable by default."""
    services = _yaml("docker-compose.yaml")["services"]
    pg, grafana = services["postgres"], services["grafana"]
    env = grafana["environment"]
    owner = pg["environment"]["POSTGRES_USER"]
    assert env["FARM_DB_USER"] == "farm_grafana" != owner
    assert "FARM_DB_PASSWORD" not in env["FARM_DB_PASSWORD"]  # not the owner's password
    assert _compose_default(env["FARM_DB_SSLMODE"]) in ("require", "verify-ca", "verify-full")
    assert "ssl=on" in pg["command"]  # the server can answer require
    mounts = " ".join(pg["volumes"])
    assert "/docker-entrypoint-initdb.d/" in mounts and "readonly-role.sql" in mounts

    sql = (DEPLOY / "postgres" / "readonly-role.sql").read_text()
    statements = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    grants = [line for line in statements if "GRANT" in line.upper()]
    assert grants and all(
        re.search(r"GRANT (SELECT|CONNECT|USAGE) ON", g, re.IGNORECASE) for g in grants
    ), grants
    assert "default_transaction_read_only = on" in sql
    assert "farm_grafana" in sql and "SUPERUSER" not in "\n".join(statements).upper()
    init = (DEPLOY / "postgres" / "init-readonly-role.sh").read_text()
    assert "readonly-role.sql" in init and "FARM_GRAFANA_DB_PASSWORD" in init


def test_the_store_url_lives_on_the_clusters_head_only() -> None:
    """`farm submit` sends no store URL: the head must have its own, and workers (where
    engines and builds run) none."""
    head_start = " ".join(_yaml("ray-cluster.yaml")["head_start_ray_commands"])
    assert ". /etc/mtp-farm/env" in head_start and head_start.index("env") < head_start.index(
        "ray start --head"
    )
    cluster = _yaml("kuberay-raycluster.yaml")["spec"]
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert "secretKeyRef" in {e["name"]: e for e in head["env"]}["FARM_DB_URL"]["valueFrom"]
    for group in cluster["workerGroupSpecs"]:
        for container in group["template"]["spec"]["containers"]:
            assert "FARM_DB_URL" not in {e["name"] for e in container["env"]}


def test_github_pr_workflow_runs_farm_pr_for_members_or_a_label() -> None:
    flow = yaml.safe_load((DEPLOY / "github" / "pr-validate.yml").read_text())
    on = flow[True]  # YAML 1.1 reads the bare key `on` as a boolean
    assert on["issue_comment"]["types"] == ["created"]
    assert on["pull_request_target"]["types"] == ["labeled"]
    assert flow["permissions"]["statuses"] == "write" and flow["permissions"]["issues"] == "write"
    [job] = flow["jobs"].values()
    condition = job["if"]
    assert "'/farm validate'" in condition and "'farm-validate'" in condition
    for who in ("OWNER", "MEMBER", "COLLABORATOR"):
        assert f'"{who}"' in condition
    assert "self-hosted" in job["runs-on"]
    for name in ("FARM_DB_URL", "RAY_AUTH_TOKEN", "GITHUB_TOKEN"):
        assert job["env"][name] == "${{ secrets." + name + " }}"
    step = next(s for s in job["steps"] if "run" in s)
    # Event text (a comment body) never enters the script itself.
    assert "${{" not in step["run"]
    line = next(x for x in step["run"].splitlines() if x.strip().startswith("args=("))
    words = shlex.split(line.strip()[len("args=(") : -1])
    values = {
        "$JOB": "jobs/pr-ascend.yaml",
        "$ENGINE": "vllm-ascend",
        "$PR": "8210",
        "$GITHUB_REPOSITORY": "vllm-project/vllm-ascend",
        "$RAY_ADDRESS_VAR": "h:6379",
        "$SITE": "/s",
        "$BASE": "merge-base",
    }
    ctx = _check_farm_argv(["farm", *(values.get(w, w) for w in words)])
    assert words[0] == "pr" and (REPO / ctx.params["job_file"]).is_file()
    assert ctx.params["base"] == "merge-base"
    assert step["env"]["BASE"] == "${{ vars.FARM_PR_BASE || 'branch' }}"
    assert ctx.params["pr_number"] == 8210 and ctx.params["engine"] == "vllm-ascend"
    assert ctx.params["repo"] == "vllm-project/vllm-ascend" and ctx.params["publish"] is not None

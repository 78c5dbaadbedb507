"""No secret leaves through a URL. One masking function
(farm.masking.mask_secrets) for user information and secret-looking query parameters,
used by every printer, error, spool file and comment; spool files are the user's alone
(0600)."""

from __future__ import annotations

import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.masking import MASK, mask_env, mask_secrets, mask_text, mask_url, secret_values
from farm.records import CellResult
from farm.store.spool import spool_result

S = "S3cretValue9"
REPO = Path(__file__).resolve().parents[2]

LEAKY = [
    f"postgresql://u@127.0.0.1:1/db?password={S}",
    f"postgresql+psycopg://u@127.0.0.1:1/db?sslmode=require&sslpassword={S}",
    f"postgresql://u:{S}@127.0.0.1:1/db",
    f"http://u:{S}@127.0.0.1:1",
    f"https://{S}@example.org/x",
    f"http://x?key={S}",
    f"https://h/p?api_key={S}&model=m",
    f"https://h/p?ACCESS_TOKEN={S}",
    f"https://bucket.s3.example/o?X-Amz-Signature={S}&X-Amz-Date=1",
    f"https://acct.blob.example/c?sv=1&sig={S}",
    f"https://h/hook?auth_token={S}#frag",
    f"see https://u:{S}@h/p and ?secret={S}",
]


@pytest.mark.parametrize("text", LEAKY)
def test_every_url_credential_is_masked(text: str) -> None:
    for masked in (mask_secrets(text), mask_text(text)):
        assert S not in masked and MASK in masked
    assert S in secret_values(text)


@pytest.mark.parametrize(
    "text",
    [
        "https://h/p?model=m&max_tokens=256&keepalives=1",
        "postgresql://u@h/db?sslmode=require&target_session_attrs=read-write",
        "ssh://git@github.com/o/r",
        "no url here, key=value",
    ],
)
def test_what_holds_no_secret_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_a_store_url_loses_its_query_password() -> None:
    shown = mask_url(f"postgresql+psycopg://u@h/db?password={S}&sslmode=require")
    assert S not in shown and "sslmode=require" in shown


def test_plan_masks_env_values_by_their_url_too() -> None:
    shown = mask_env({"OPENAI_API_BASE": f"http://x?key={S}", "HF_TOKEN": S, "A": "1"})
    assert shown == {"OPENAI_API_BASE": f"http://x?key={MASK}", "HF_TOKEN": MASK, "A": "1"}


@pytest.mark.parametrize(
    "args",
    [["sweeps"], ["db", "upgrade"], ["spool", "list"], ["report", "1"], ["spool", "flush"]],
)
def test_store_commands_never_print_the_query_password(args: list[str], tmp_path: Path) -> None:
    url = f"postgresql://u@127.0.0.1:1/db?password={S}&connect_timeout=1"
    result = CliRunner().invoke(
        app, args, env={"FARM_DB_URL": url, "FARM_HOME": str(tmp_path), "COLUMNS": "200"}
    )
    assert S not in result.output, result.output
    assert result.exit_code != 0 or args == ["spool", "list"]


def test_submit_never_echoes_the_address_password(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["submit", "--status", "raysubmit_1", "--address", f"http://u:{S}@127.0.0.1:1"],
        env={"FARM_HOME": str(tmp_path), "FARM_RAY_CLIENT_TIMEOUT_S": "2"},
    )
    assert result.exit_code != 0
    assert S not in result.output, result.output


def test_farm_plan_masks_a_url_in_an_env_value(tmp_path: Path) -> None:
    job = (REPO / "jobs" / "local.yaml").read_text()
    job = job.replace(
        'VLLM_CPU_KVCACHE_SPACE: "1"',
        f'VLLM_CPU_KVCACHE_SPACE: "1"\n      OPENAI_API_BASE: "http://x?key={S}"',
    )
    job = job.replace("../", f"{REPO}/")
    (tmp_path / "job.yaml").write_text(job)
    only = ["graph_mode=eager", "mtp_depth=1", "sliding_window=on", "thinking=on"]
    args = ["plan", str(tmp_path / "job.yaml"), *(x for o in only for x in ("--only", o))]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert S not in result.output
    assert re.search(r"key=\\?\*\\?\*\\?\*|key=\*\*\*", result.output)


def test_a_spool_file_is_private_and_names_the_store_masked(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    result = CellResult(
        cell_id="c1", status="failed", started_at=now, finished_at=now, error="boom"
    )
    path = spool_result(tmp_path, f"postgresql://u@h/db?password={S}", 3, result)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0
    assert S not in path.read_text()

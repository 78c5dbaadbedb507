"""Weak errors. Each message names the command's own option, the
command that helps, and what actually happened: `farm sweeps` lists sweeps; `bisect
--resume 5` is about --resume; a missing schema revision is not "a newer mtp-farm";
`dashboards push --timeout 0` is refused as a timeout; a URL that is no http(s) URL is
not retried three times."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.notify.http import NotifyError, RetryPolicy, post_json
from farm.notify.slack import SlackNotifier
from tests.support.stores import fill_store

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fill_store(url)
    return url


def _run(url: str, *argv: str) -> tuple[int, str]:
    result = runner.invoke(app, list(argv), env={"FARM_DB_URL": url, "COLUMNS": "250"})
    return result.exit_code, result.output


def test_a_missing_sweep_points_at_farm_sweeps(db: str) -> None:
    code, output = _run(db, "report", "99")
    assert code == 2 and "`farm sweeps` lists them" in output, output


def test_a_missing_bisection_is_named_by_the_option_given(db: str) -> None:
    from farm import store
    from farm.store.bisections import get_bisection

    engine = store.open_store(db)
    try:
        with store.Session(engine) as session, pytest.raises(Exception, match=r"^--resume 5:"):
            get_bisection(session, 5, "--resume")
    finally:
        engine.dispose()
    code, output = _run(db, "report", "--bisection", "5")
    assert code == 2 and "--bisection 5: no such bisection" in output


def test_a_store_without_its_revision_row_says_so(db: str, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "farm.db") as c:
        c.execute("DELETE FROM alembic_version")
    code, output = _run(db, "sweeps")
    assert code == 2 and "holds no revision" in output, output
    assert "newer mtp-farm" not in output


def test_a_zero_timeout_is_refused_as_a_timeout() -> None:
    result = runner.invoke(
        app, ["dashboards", "push", "--timeout", "0", "--url", "http://127.0.0.1:1"]
    )
    assert result.exit_code == 2 and "not a number of seconds" in result.output
    assert "not like Grafana" not in result.output


@pytest.mark.parametrize(
    "bad", ["ftp://h/x", "htps://hooks.example/x", "hooks.example/x", "http:///x"]
)
def test_a_url_that_is_no_http_url_is_not_retried(bad: str) -> None:
    tries: list[float] = []
    policy = RetryPolicy(attempts=3, backoff_s=0.0, sleep=tries.append)
    with pytest.raises(NotifyError, match="not an http\\(s\\) URL"):
        post_json(bad, {}, service="slack", error=NotifyError, policy=policy)
    with pytest.raises(NotifyError, match="not an http\\(s\\) URL"):
        SlackNotifier(bad, policy=policy).send_notice(
            __import__("farm.notify.message", fromlist=["Notice"]).Notice(title="t")
        )
    assert tries == []  # no second attempt

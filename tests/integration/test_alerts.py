"""Alerts in the SQL store (SQLite and PostgreSQL) and the CLI around them.

Sweeps are synthetic (``tests.fakes.simulate``) and stored through the repository,
so no engine runs. PostgreSQL must be reachable as for ``test_store.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from typer.testing import CliRunner

from farm.analysis.check_rules import CheckConfig
from farm.analysis.checks import check_sweep
from farm.cli.alerts import alerts_app
from farm.cli.reports import compare, report_files
from farm.errors import StoreError
from farm.notify import AlertRecord, NotifyError
from farm.notify.message import Notice, headline
from farm.store import (
    Session,
    load_sweep,
    normalize_url,
    open_store,
)
from farm.store.alerts import (
    acknowledge,
    get_alert,
    list_alerts,
    mark_notified,
    pending_notifications,
    raise_alerts,
    resolve,
    settle_early_alerts,
)
from farm.store.export import EXPORT_FORMAT, read_sweep_export
from farm.store.tables import metadata
from farm.workflows.alerts.steps import check_alerts
from tests.fakes.receiver import Receiver
from tests.support.alerts import candidates_of, cli_env, synthetic_sweep
from tests.support.stores import save_sweep

FAST = CheckConfig(resamples=300)
runner = CliRunner()


# --- test data ---------------------------------------------------------------------------


# --- schema ------------------------------------------------------------------------------


def test_migration_0002_matches_the_alert_table_and_downgrades(db_url: str) -> None:
    engine = open_store(db_url)
    try:
        with engine.connect() as conn:
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
            assert version is not None and version >= "0002"  # later revisions add tables
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
            about_alerts = [d for d in diffs if "alert" in repr(d)]
            assert about_alerts == []
            inspector = sa.inspect(conn)
            assert {u["name"] for u in inspector.get_unique_constraints("alert")} == {
                "uq_alert_key"
            }
    finally:
        engine.dispose()
    from alembic import command

    from farm.store.db import _alembic_config

    url = normalize_url(db_url)
    command.downgrade(_alembic_config(url), "0001")
    check = sa.create_engine(url)
    try:
        with check.connect() as conn:
            assert "alert" not in sa.inspect(conn).get_table_names()
            assert "sweep" in sa.inspect(conn).get_table_names()
    finally:
        check.dispose()
    open_store(db_url).dispose()  # and up again


# --- lifecycle ---------------------------------------------------------------------------


def test_alerts_survive_a_restart_and_a_rerun_does_not_duplicate(db_url: str) -> None:
    first = save_sweep(db_url, synthetic_sweep(1))
    candidates = candidates_of(first)
    assert {c.kind for c in candidates} == {"graph_vs_eager", "depth_invariance"}
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            raised = raise_alerts(s, first.sweep_id, candidates)
            assert [a.key for a in raised] == [c.key for c in candidates]
            assert all(a.state == "untriaged" and a.opened_by(first.sweep_id) for a in raised)
    finally:
        engine.dispose()

    engine = open_store(db_url)  # a new process: new engine, new session
    try:
        with Session(engine) as s:
            stored = list_alerts(s)
            assert sorted(a.key for a in stored) == sorted(c.key for c in candidates)
            a = get_alert(s, raised[0].id)
            assert a.details == candidates[0].details  # figures and intervals round-trip
            assert a.created_at.tzinfo is not None
            again = raise_alerts(s, first.sweep_id, candidates_of(first))
            assert [x.id for x in again] == [x.id for x in raised]
            assert all(x.occurrences == 1 for x in again)
            assert len(list_alerts(s)) == len(candidates)
    finally:
        engine.dispose()


def test_next_sweep_updates_ack_sticks_resolve_and_reopen(db_url: str) -> None:
    s1 = save_sweep(db_url, synthetic_sweep(2))
    s2 = save_sweep(db_url, synthetic_sweep(3))
    s3 = save_sweep(db_url, synthetic_sweep(4))
    s4 = save_sweep(db_url, synthetic_sweep(5))
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            [a1, *_] = raise_alerts(s, s1.sweep_id, candidates_of(s1))
            key = a1.key
            pick = [c for c in candidates_of(s2) if c.key == key]
            [a2] = raise_alerts(s, s2.sweep_id, pick)
            assert a2.id == a1.id
            assert (a2.first_sweep_id, a2.last_sweep_id, a2.occurrences) == (
                s1.sweep_id,
                s2.sweep_id,
                2,
            )
            assert a2.details.sweep_id == s2.sweep_id  # the latest evidence
            assert not a2.opened_by(s2.sweep_id)  # still the same alert: no new page

            acked = acknowledge(s, a1.id, "alice", "bisecting vllm-ascend#8210")
            assert (acked.state, acked.triaged_by) == ("acknowledged", "alice")
            [a3] = raise_alerts(s, s3.sweep_id, [c for c in candidates_of(s3) if c.key == key])
            assert a3.state == "acknowledged" and a3.last_sweep_id == s3.sweep_id
            assert a3.note == "bisecting vllm-ascend#8210"

            done = resolve(s, a1.id, "fixed: pre_tokens=sliding_window, next_tokens=0")
            assert done.state == "fixed" and done.triaged_at is not None
            with pytest.raises(StoreError, match="already fixed"):
                resolve(s, a1.id)
            with pytest.raises(StoreError, match="is fixed"):
                acknowledge(s, a1.id, "bob")
            # re-analysing an older sweep does not undo the resolution ...
            [old] = raise_alerts(s, s2.sweep_id, pick)
            assert old.state == "fixed"
            # ... a newer sweep with the same regression re-opens it
            [back] = raise_alerts(s, s4.sweep_id, [c for c in candidates_of(s4) if c.key == key])
            assert back.id == a1.id and back.state == "untriaged"
            assert back.opened_by(s4.sweep_id) and back.triaged_by is None
            assert back.occurrences == 4
            assert [a.id for a in list_alerts(s, ["untriaged"])].count(a1.id) == 1
            assert a1.id not in [a.id for a in list_alerts(s, ["fixed"])]
    finally:
        engine.dispose()


def test_store_refuses_unknown_sweeps_and_alerts(db_url: str) -> None:
    sweep = save_sweep(db_url, synthetic_sweep(6))
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            with pytest.raises(StoreError, match="no sweep 999"):
                raise_alerts(s, 999, candidates_of(sweep))
            assert list_alerts(s) == []  # nothing half-written
            with pytest.raises(StoreError, match="no alert 42"):
                acknowledge(s, 42, "alice")
            with pytest.raises(StoreError, match="no alert 42"):
                resolve(s, 42)
            with pytest.raises(ValueError, match="states must be among"):
                list_alerts(s, ["closed"])  # type: ignore[list-item]
            # the key is unique in the schema itself, whoever writes
            raise_alerts(s, sweep.sweep_id, candidates_of(sweep)[:1])
            conn = s.connection()
            row = conn.execute(sa.text("SELECT * FROM alert")).mappings().one()
            values = {k: v for k, v in row.items() if k != "id"}
            with pytest.raises(sa.exc.IntegrityError):
                conn.execute(
                    sa.text(
                        f"INSERT INTO alert ({', '.join(values)}) "
                        f"VALUES ({', '.join(':' + k for k in values)})"
                    ),
                    {k: json.dumps(v) if isinstance(v, dict) else v for k, v in values.items()},
                )
            s.rollback()
    finally:
        engine.dispose()


# --- CLI ---------------------------------------------------------------------------------


def test_cli_check_notifies_once_then_ack_and_resolve(db_url: str, receiver: Receiver) -> None:
    sweep = save_sweep(db_url, synthetic_sweep(7))
    env = cli_env(db_url, FARM_NOTIFY_WEBHOOK_URL=receiver.url("/alerts"))
    receiver.answer((400, "bad request"))  # the channel refuses: the alerts stay pending
    refused = runner.invoke(alerts_app, ["check", str(sweep.sweep_id)], env=env)
    assert refused.exit_code == 4, refused.output
    assert "notification failed: webhook POST http://127.0.0.1:" in refused.output
    assert "/alerts" not in refused.output  # the URL is masked
    receiver.requests.clear()
    result = runner.invoke(alerts_app, ["check", str(sweep.sweep_id)], env=env)
    assert result.exit_code == 0, result.output
    # `alerts check` runs the default checks: depth invariance is off by default.
    assert "1 alert(s) raised, 1 not yet notified" in result.output
    groups = [r.json() for r in receiver.requests if r.path == "/alerts"]
    assert len(groups) == 1 and groups[0]["type"] == "alerts"  # one cause, one POST
    posted = groups[0]["alerts"]
    assert posted and all(b["state"] == "untriaged" for b in posted)
    assert {b["kind"] for b in posted} == {"graph_vs_eager"}

    assert len(posted) == 1 and "sent 1 alert(s) to webhook" in result.output
    # The cause is the attribution's conjunction, without the coverage that grows as
    # a night's cells land.
    assert posted[0]["details"]["attribution"].startswith(groups[0]["cause"] + ": covers ")

    again = runner.invoke(alerts_app, ["check", "latest"], env=env)
    assert again.exit_code == 0, again.output
    assert "1 alert(s) raised, 0 not yet notified" in again.output
    assert "sent" not in again.output
    assert len(receiver.requests) == len(groups)  # no second page for the same alerts

    listed = runner.invoke(alerts_app, ["list", "--state", "open"], env=env)
    assert listed.exit_code == 0, listed.output
    first_id = min(b["id"] for b in posted)
    assert "full_decode_only" in listed.output and "critical" in listed.output

    ack = runner.invoke(
        alerts_app, ["ack", str(first_id), "--note", "on it", "--by", "carol"], env=env
    )
    assert ack.exit_code == 0 and "acknowledged by carol" in ack.output
    res = runner.invoke(alerts_app, ["resolve", str(first_id), "--note", "fixed"], env=env)
    assert res.exit_code == 0 and f"alert {first_id} fixed" in res.output
    resolved = runner.invoke(alerts_app, ["list", "--state", "fixed"], env=env)
    assert "why: fixed" in resolved.output
    missing = runner.invoke(alerts_app, ["resolve", "9999"], env=env)
    assert missing.exit_code == 2 and "no alert 9999" in missing.output


def _compare_app() -> Any:
    import typer

    app = typer.Typer()
    app.command()(compare)
    return app


def test_cli_compare_posts_the_markdown_to_github(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    base = save_sweep(url, synthetic_sweep(8, regressed=False))
    cand = save_sweep(url, synthetic_sweep(8, regressed=True))
    receiver.answer((201, '{"html_url": "https://github.com/o/r/pull/7#c1"}'))
    env = cli_env(url, GITHUB_TOKEN="ghp_testtoken123456", FARM_GITHUB_API=receiver.url("/gh"))
    out = tmp_path / "compare.md"
    args = [str(base.sweep_id), str(cand.sweep_id), "--post-github", "o/r#7", "--out", str(out)]
    result = runner.invoke(_compare_app(), [*args, "--fail-on-regression"], env=env)
    assert result.exit_code == 1, result.output  # regressions fail the CI step
    assert ":x: **AL regressed**" in result.output
    [request] = receiver.requests
    body = request.json()
    assert request.path == "/gh/repos/o/r/issues/7/comments"
    assert request.headers["Authorization"] == "Bearer ghp_testtoken123456"
    assert body["body"] == out.read_text() == result.stdout.rstrip("\n") + "\n"
    assert "| :x: regress | base.synthetic.full_decode_only.mtp3.swa-on" in body["body"]
    assert "ghp_testtoken123456" not in result.output

    no_token = runner.invoke(_compare_app(), args, env=cli_env(url))
    # Asked to post and cannot: refused before comparing, never a pass.
    assert no_token.exit_code == 2
    assert "--post-github o/r#7: GITHUB_TOKEN is not set" in no_token.output
    assert len(receiver.requests) == 1
    bad = runner.invoke(_compare_app(), [*args[:2], "--post-github", "o/r"], env=env)
    assert bad.exit_code == 2 and "OWNER/REPO#NUMBER" in bad.output


def test_report_files_write_markdown_and_html(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    for seed in (9, 10, 11):
        save_sweep(url, synthetic_sweep(seed, regressed=seed == 11))
    paths = report_files("latest", url, tmp_path / "out", ("md", "html"), history=3)
    assert [p.name for p in paths] == ["sweep-3.md", "sweep-3.html"]
    md, page = (p.read_text() for p in paths)
    assert md.startswith("## mtp-farm sweep 3: synthetic") and "### AL trend per cell" in md
    assert page.startswith("<!DOCTYPE html>") and page.count('class="trend"') == 4


def test_export_writes_the_stored_sweep_as_json_that_reads_back_equal(tmp_path: Path) -> None:
    from farm.cli.main import app

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    stored = save_sweep(url, synthetic_sweep(12, regressed=True))
    out = tmp_path / "sweep.json"
    result = runner.invoke(app, ["export", "latest", "--out", str(out), "--db", url])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["format_version"] == EXPORT_FORMAT
    back = read_sweep_export(out)
    assert back.sweep_id == stored.sweep_id and len(back.cells) == len(stored.cells)
    requests = [r for c in back.cells if c.result for v in c.result.variants for r in v.requests]
    assert len(requests) == 4 * 40 and all(r.counters is not None for r in requests)
    # The exported sweep is what the analysis reads from the store: same findings.
    engine = open_store(url)
    try:
        with Session(engine) as session:
            loaded = load_sweep(session, stored.sweep_id)
    finally:
        engine.dispose()
    assert back == loaded
    assert check_sweep(back).regressions
    missing = runner.invoke(app, ["export", "99", "--db", url])
    assert missing.exit_code == 2 and "99" in missing.output


# --- the check-alert-notify stage --------------------------------------------------------


@dataclass
class FakeNotifier:
    """A FAKE channel: records what it was given; fails while ``broken``."""

    name: str = "fake"
    broken: bool = False
    batches: list[list[int]] = field(default_factory=list)

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        self.batches.append([a.id for a in alerts])
        if self.broken:
            raise NotifyError("fake channel is down")

    def send_notice(self, notice: Notice) -> None:
        raise AssertionError(f"an alert check sent a notice: {notice.title}")


def test_check_alerts_is_a_stage_with_a_typed_outcome(db_url: str) -> None:
    sweep = save_sweep(db_url, synthetic_sweep(13))
    channel = FakeNotifier(broken=True)
    engine = open_store(db_url)
    try:
        with Session(engine) as session:
            failed = check_alerts(session, sweep.sweep_id, notifiers=[channel])
            assert failed.sweep_id == sweep.sweep_id and failed.findings >= 1
            assert failed.comparisons > failed.findings
            assert len(failed.raised) == len(failed.fresh) == 1
            assert failed.errors == ("fake channel is down",) and not failed.delivered
            channel.broken = False
            sent = check_alerts(session, sweep.sweep_id, notifiers=[channel])
            assert sent.delivered and [a.id for a in sent.sent] == channel.batches[-1]
            assert sent.channels == ("fake",)
            quiet = check_alerts(session, sweep.sweep_id, notifiers=[channel])
            assert quiet.fresh == () and quiet.sent == () and len(channel.batches) == 2
            silent = check_alerts(session, sweep.sweep_id, history=3, notifiers=())
            assert silent.channels == () and len(silent.raised) == 1
    finally:
        engine.dispose()


def test_early_alerts_the_verdict_does_not_confirm_are_withdrawn_and_told_so(
    db_url: str,
) -> None:
    # Night 1 opens two alerts early (as its cells land); one was told, one not yet.
    # An older alert, opened by night 1, is refreshed early by night 2 and not confirmed.
    first = save_sweep(db_url, synthetic_sweep(11))
    second = save_sweep(db_url, synthetic_sweep(12))
    found = candidates_of(first)
    assert len(found) == 2
    # A third key: the same cause on another (made-up) key, so one alert stays untold.
    candidates = [*found, found[1].model_copy(update={"key": found[1].key + "#other"})]
    engine = open_store(db_url)
    try:
        with Session(engine) as s:
            older = raise_alerts(s, first.sweep_id, candidates[:1])[0]
            early = raise_alerts(s, second.sweep_id, candidates)
            told, untold = early[1], early[2]
            mark_notified(s, [told.id, older.id])
            confirmed: set[str] = set()
            label = older.details.cell.label
            settled = settle_early_alerts(s, second.sweep_id, {(older.kind, label)}, confirmed)
            by_id = {a.id: a for a in settled}
            assert by_id[told.id].state == "withdrawn" and by_id[told.id].needs_notification
            assert "did not confirm" in (by_id[told.id].news or "")
            assert by_id[untold.id].state == "withdrawn"
            assert not by_id[untold.id].needs_notification  # never told: closed quietly
            assert by_id[older.id].state == "recovered"  # open before the night
            pending = {a.id for a in pending_notifications(s)}
            assert told.id in pending and untold.id not in pending
            kept = settle_early_alerts(s, second.sweep_id, set(), {early[0].key})
            assert kept == []  # confirmed by the verdict: nothing settled (and no repeat)
            assert headline([by_id[told.id]]).startswith("mtp-farm: 1 early alert withdrawn")
    finally:
        engine.dispose()


def test_alerts_check_refuses_a_sweep_as_its_own_baseline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    sweep = save_sweep(url, synthetic_sweep(21))
    env = cli_env(url)
    raised = runner.invoke(alerts_app, ["check", str(sweep.sweep_id)], env=env)
    assert raised.exit_code == 0, raised.output
    engine = open_store(url)
    try:
        with Session(engine) as s:
            before = [(a.id, a.state) for a in list_alerts(s)]
    finally:
        engine.dispose()
    assert before and all(state == "untriaged" for _, state in before)
    own = runner.invoke(
        alerts_app, ["check", str(sweep.sweep_id), "--baseline", str(sweep.sweep_id)], env=env
    )
    assert own.exit_code != 0
    assert "cannot be judged against itself" in own.output
    engine = open_store(url)
    try:
        with Session(engine) as s:
            assert [(a.id, a.state) for a in list_alerts(s)] == before  # nothing recovered
    finally:
        engine.dispose()

"""Alert triage. Seen on the real engine before: a second, different
regression on a cell with an open alert was folded into it and nobody was told; an
alert whose cell recovered stayed open; every alert was a message of its own.

Four simulated nights through `farm nightly`'s workflow (SQLite, no engine), notified
to a real local HTTP receiver (the generic webhook channel): a clean night; a graph
mode regression (two causes: the within-sweep graph check, explained by its axes, and
the drop against the last good night: one POST each); the same drop from another
build (news: both alerts are sent again, saying so); a clean night from that build
(both recover, and say so, once). Triage states round-trip through `farm alerts
triage` and the store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from farm.cli.main import app
from farm.store import Session, open_store
from farm.store.alerts import list_alerts
from tests.fakes.receiver import Receiver
from tests.support.nights import nightly_resume, store_night

runner = CliRunner()


def _posts(receiver: Receiver) -> list[dict[str, object]]:
    bodies = [r.json() for r in receiver.requests]
    receiver.requests.clear()
    return bodies


def test_news_recovery_groups_and_triage(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    monkeypatch.setenv("FARM_NOTIFY_WEBHOOK_URL", receiver.url("/alerts"))

    one = store_night(url, 1, regressed=False, build="build-a")
    assert nightly_resume(url, one, notify=True).check.raised == ()
    assert _posts(receiver) == []

    two = store_night(url, 2, regressed=True, build="build-a")
    night = nightly_resume(url, two, notify=True).check
    assert {a.kind for a in night.raised} == {"graph_vs_eager", "nightly_vs_last_good"}
    groups = _posts(receiver)
    # one POST per cause, not one per alert or per cell
    assert len(groups) == len({a.cause for a in night.raised}) == 2
    assert all(g["type"] == "alerts" for g in groups)
    within = next(g for g in groups if "graph_mode=full_decode_only" in str(g["cause"]))
    assert {a["kind"] for a in within["alerts"]} == {"graph_vs_eager"}  # type: ignore[index]

    # The same drop from another build: news on both open alerts, sent again.
    three = store_night(url, 3, regressed=True, build="build-b")
    night = nightly_resume(url, three, notify=True).check
    resent = [a for g in _posts(receiver) for a in g["alerts"]]  # type: ignore[attr-defined]
    assert {a["id"] for a in resent} == {a.id for a in night.raised}
    assert all("another build (build-a -> build-b)" in a["news"] for a in resent)
    assert all(a["state"] == "untriaged" for a in resent)

    # The same again, same build: nothing new, nothing sent.
    again = store_night(url, 4, regressed=True, build="build-b")
    nightly_resume(url, again, notify=True)
    assert _posts(receiver) == []

    # A clean night of that build: both alerts recover, and say so once.
    clean = store_night(url, 5, regressed=False, build="build-b")
    night = nightly_resume(url, clean, notify=True).check
    assert night.raised == ()
    assert {a.state for a in night.recovered} == {"recovered"} and len(night.recovered) == 2
    bodies = _posts(receiver)
    recovered = [a for g in bodies for a in g["alerts"]]  # type: ignore[attr-defined]
    assert sorted(a["id"] for a in recovered) == sorted(a.id for a in night.recovered)
    assert all(a["recovered_sweep_id"] == clean for a in recovered)
    assert all(str(g["headline"]).endswith(f"recovered in sweep {clean}") for g in bodies)
    nightly_resume(url, store_night(url, 6, regressed=False, build="build-b"), notify=True)
    assert _posts(receiver) == []  # a recovery is told once

    # Triage through the CLI: reason, link and who, kept by the store.
    env = {"FARM_DB_URL": url, "COLUMNS": "250", "FARM_HOME": str(tmp_path / "home")}
    alert_id = str(night.recovered[0].id)
    done = runner.invoke(
        app,
        [
            "alerts", "triage", alert_id, "invalid",
            "--reason", "run-to-run noise", "--link", "https://bugs.example/1", "--by", "erin",
        ],
        env=env,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert f"alert {alert_id} invalid by erin" in done.output
    engine = open_store(url)
    try:
        with Session(engine) as session:
            [stored] = [a for a in list_alerts(session, ["invalid"])]
    finally:
        engine.dispose()
    assert (stored.triaged_by, stored.note, stored.link) == (
        "erin",
        "run-to-run noise",
        "https://bugs.example/1",
    )
    assert stored.triaged_at is not None and stored.triaged_at >= stored.created_at
    listed = runner.invoke(app, ["alerts", "list", "--state", "invalid"], env=env)
    assert "link: https://bugs.example/1" in listed.output and "by erin" in listed.output
    reopen = runner.invoke(app, ["alerts", "triage", alert_id, "acknowledged"], env=env)
    assert reopen.exit_code == 2 and "re-opens it" in reopen.output
    bad_link = runner.invoke(
        app, ["alerts", "triage", alert_id, "fixed", "--link", "javascript:x"], env=env
    )
    assert bad_link.exit_code == 2 and "expected an http(s) URL" in bad_link.output
    not_mine = runner.invoke(app, ["alerts", "triage", alert_id, "recovered"], env=env)
    assert not_mine.exit_code == 2  # the farm's state, not a person's
    assert json.dumps(stored.model_dump(mode="json"))  # the record stays JSON-able


def test_farm_noise_shows_each_keys_spread_over_the_jobs_last_nights(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    for seed in (1, 2, 3):
        store_night(url, seed, regressed=False, build="build-a")
    env = {"FARM_DB_URL": url, "COLUMNS": "250", "FARM_HOME": str(tmp_path / "home")}
    shown = runner.invoke(app, ["noise", "synthetic", "--nights", "2"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "run-to-run noise of synthetic: sweeps 2..3" in shown.output
    assert "base(vllm).synthetic.full_decode_only.mtp3.swa-on" in shown.output
    missing = runner.invoke(app, ["noise", "nosuch"], env=env)
    assert missing.exit_code == 2 and "no sweep of job 'nosuch'" in missing.output


def test_a_key_with_a_flaky_history_is_quarantined_shown_and_not_alerted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    # Twelve nights whose verdict on the regressed keys flips night after night.
    for seed in range(1, 13):
        nightly_resume(url, store_night(url, seed, regressed=seed % 2 == 0, build="build-a"))
    night = nightly_resume(url, store_night(url, 13, regressed=False, build="build-a")).check
    assert night.verdict.outcome == "clean"
    last = nightly_resume(url, store_night(url, 14, regressed=True, build="build-a")).check
    held = [f for f in last.verdict.findings if f.quarantined]
    assert held, last.verdict.findings  # measured and stored ...
    assert last.verdict.outcome == "clean"  # ... but no regression of the verdict
    assert not any(a.last_sweep_id == last.verdict.sweep_id for a in last.raised)
    notes = [n for n in last.verdict.notes if n.startswith("quarantined: ")]
    assert notes and all("verdict flip rate 100%" in n for n in notes)


def test_triage_states_migrate_down_and_up_with_the_alerts_they_hold(
    db_url: str,  # the fixture
) -> None:
    from alembic import command

    from farm.store.alerts import raise_alerts, triage
    from farm.store.db import _alembic_config
    from farm.store.urls import normalize_url
    from tests.support.alerts import candidates_of, synthetic_sweep
    from tests.support.stores import save_sweep

    engine = open_store(db_url)
    try:
        sweep = save_sweep(db_url, synthetic_sweep(3))
        with Session(engine) as s:
            ids = [a.id for a in raise_alerts(s, sweep.sweep_id, candidates_of(sweep))]
            assert len(ids) == 2, ids  # (untriaged -> open: tests/data's migrated store)
            triage(s, ids[0], "acknowledged", "ann")
            triage(s, ids[1], "fixed", "ann", "patched")
    finally:
        engine.dispose()
    url = normalize_url(db_url)
    command.downgrade(_alembic_config(url), "0010")  # before triage states
    old = sa.create_engine(url)
    try:
        with old.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT id, state FROM alert")).all())
    finally:
        old.dispose()
    assert (rows[ids[0]], rows[ids[1]]) == ("acknowledged", "resolved")
    engine = open_store(db_url)  # upgrades to head again
    try:
        with Session(engine) as s:
            states = {a.id: (a.state, a.triaged_at is not None) for a in list_alerts(s)}
    finally:
        engine.dispose()
    assert states[ids[0]] == ("acknowledged", True)
    assert states[ids[1]] == ("fixed", True)

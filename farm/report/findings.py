"""Terminal table of a sweep's within-sweep check findings."""

from __future__ import annotations

from rich.table import Table

from farm.analysis.check_rules import CheckReport

__all__ = ["render_findings"]


def render_findings(report: CheckReport) -> Table:
    """One row per failed verdict: check, candidate vs reference, difference with interval."""
    table = Table(
        title=f"sweep {report.sweep_id}: {len(report.regressions)} finding(s) "
        f"in {len(report.verdicts)} comparisons"
    )
    for col in ("check", "metric", "candidate", "reference", "cand.", "ref.", "difference"):
        table.add_column(col, overflow="fold")
    for v in report.regressions:
        metric = v.metric + (f"[{v.position}]" if v.position is not None else "")
        table.add_row(
            v.check,
            metric,
            v.candidate.label,
            v.reference.label,
            str(v.candidate_value),
            str(v.reference_value),
            str(v.difference),
        )
    return table

"""The comment a PR run posts on the pull request: its verdict and comparison, and
while the sweep runs, how far it is. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from farm.analysis.compare import SweepComparison
from farm.inert import github_markdown as md
from farm.inert import untrusted
from farm.report.markdown import render_comparison
from farm.results.verdict import SweepVerdict

__all__ = ["render_pr_comment", "render_pr_progress"]

# An http(s) URL with none of the characters that would end or change a <...> autolink.
_LINKABLE = re.compile(r"https?://[^\s<>\"'`\x00-\x1f\x7f]+")


def render_pr_comment(
    verdict: SweepVerdict,
    comparison: SweepComparison,
    *,
    marker: str,
    candidate_label: str,
    base_label: str,
    dropped: Sequence[str] = (),
    report_url: str | None = None,
    cost: str | None = None,
    quarantined: Mapping[str, float] | None = None,
) -> str:
    """The PR comment: the hidden marker, the verdict, what was built and reused,
    the keys quarantined (label -> verdict flip rate in the job's nightlies), what
    the confirmation reruns decided, the findings, then the comparison table of
    ``farm compare``. Everything that came
    from an engine, a repository or a user is inert Markdown (:mod:`farm.inert`)."""
    v = verdict
    icon = {"clean": ":white_check_mark:", "regression": ":x:", "failed_cells": ":warning:"}
    lines = [
        marker,
        f"## mtp-farm: PR #{v.pr_number} on {md(v.engine or '')}: {icon[v.outcome]} {v.outcome}",
        "",
        f"- candidate: {md(candidate_label)}"
        + (f" (head {md(v.head_sha[:12])})" if v.head_sha else ""),
        f"- baseline: {md(base_label)}",
    ]
    if v.reused_cells:
        lines.append(
            f"- {len(v.reused_cells)} baseline cell(s) reused from sweep(s) "
            + ", ".join(map(str, v.baseline_sweep_ids))
            + "; the rest ran beside the candidate in sweep "
            + str(v.sweep_id)
        )
    else:
        lines.append(f"- every baseline cell ran beside the candidate in sweep {v.sweep_id}")
    if cost:
        lines.append(f"- {md(cost)} in sweep {v.sweep_id}")
    if dropped:
        lines.append("- bundled patches dropped: " + "; ".join(md(d) for d in dropped))
    if report_url:
        # A link the farm was given (--publish-url), shown as a link to itself.
        shown = untrusted(report_url)  # never a credential of the publishing host
        link = f"<{shown}>" if _LINKABLE.fullmatch(shown) else md(shown)
        lines.append(f"- report: {link}")
    if quarantined:
        lines.append(
            f"- {len(quarantined)} key(s) quarantined (their nightly verdicts flip: "
            "measured and shown, failing no PR): "
            + "; ".join(f"{md(k)} (flip rate {r:.0%})" for k, r in sorted(quarantined.items()))
        )
    lines += _confirmations(comparison)
    if v.findings:
        lines += ["", "### Findings", ""]
        lines += [f"- **{md(f.shown_check)}** {md(f.summary)}" for f in v.findings]
    lines += ["", render_comparison(comparison)]
    return "\n".join(lines)


def _confirmations(comparison: SweepComparison) -> list[str]:
    """Each suspicious cell that was rerun, head and base interleaved on one node, and
    what its runs decided (the verdict is theirs, not the first run's)."""
    rows = [r for r in comparison.rows if r.confirmation is not None]
    if not rows:
        return []
    return [
        "",
        "### Confirmation reruns",
        "",
        "Suspicious under the key's run-to-run noise, rerun with the head's and the base's "
        "builds interleaved on one node:",
        "",
        *(f"- {md(r.label)}: {md(r.confirmation.describe())}" for r in rows if r.confirmation),
    ]


def render_pr_progress(
    *,
    marker: str,
    number: int,
    engine: str,
    finished: int,
    total: int,
    failed: int,
    regressed: Sequence[str],
    stopping: bool = False,
) -> str:
    """The PR comment while its sweep runs (the same marker: the verdict replaces it):
    cells finished of those planned, cells failed, and each candidate cell already
    confirmed below its base."""
    lines = [
        marker,
        f"## mtp-farm: PR #{number} on {md(engine)}: :hourglass: running",
        "",
        f"- {finished} of {total} cell(s) finished" + (f", {failed} failed" if failed else ""),
    ]
    if regressed:
        lines.append(f"- regressed so far ({len(regressed)}):")
        lines.extend(f"  - {md(r)}" for r in regressed)
    else:
        lines.append("- no regression confirmed so far")
    if stopping:
        lines.append("- `--fail-fast`: no other cell starts; the cells running finish")
    lines += ["", "_The verdict replaces this comment when the sweep ends._"]
    return "\n".join(lines)

"""Each count on the HTML report names what it counts: the verdict's
comparisons (against the last good night, within the sweep, against goldens) and the
within-sweep checks' own, never two bare "N comparisons" one above the other."""

from __future__ import annotations

import html
import re

import numpy as np

from farm.analysis.check_rules import CheckReport
from farm.analysis.summary import summarize_sweep
from farm.report.html import render_html
from farm.results.verdict import SweepVerdict
from tests.fakes.simulate import simulate_sweep

_SWEEP = simulate_sweep(
    rng=np.random.default_rng(3),
    graph_modes=("eager",),
    depths=(0, 3),
    sliding_windows=("on",),
    thinking=("off",),
    prompts=20,
    sweep_id=5,
)
_NONE_WITHIN = CheckReport(sweep_id=5, verdicts=(), notes=())


def _text(page: str) -> str:
    """The page's text as a reader sees it (tags and <wbr> dropped, spaces collapsed)."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def _page(verdict: SweepVerdict | None, report: CheckReport = _NONE_WITHIN) -> str:
    return render_html(_SWEEP, summarize_sweep(_SWEEP), report, verdict=verdict)


def test_the_nightly_verdict_and_the_within_sweep_checks_each_name_their_count() -> None:
    verdict = SweepVerdict(
        sweep_id=5,
        job="synthetic",
        kind="nightly",
        outcome="clean",
        comparisons=6,
        baseline_sweep_ids=(4,),
        history=5,
    )
    page = _page(verdict)
    assert (
        "compared with sweep 4 (the last good night) · 6 comparisons in this verdict "
        "(against the last good night, within the sweep, and against goldens) · "
        "history of 5 sweeps"
    ) in page
    assert (
        "Within the sweep: no regression found in 0 comparisons of a variant with its "
        "reference in this sweep."
    ) in page
    assert "<b>0</b>comparisons within the sweep</div>" in page
    # No count of comparisons on the page says nothing of what it counts.
    for match in re.finditer(r"(\d+) comparisons?\b(.{0,30})", _text(page)):
        assert match.group(2).startswith((" in this verdict", " of a variant", " within the")), (
            match.group(0)
        )


def test_a_pr_verdict_says_it_compared_with_the_base() -> None:
    verdict = SweepVerdict(
        sweep_id=5,
        job="pr",
        kind="pr",
        outcome="clean",
        comparisons=1,
        baseline_sweep_ids=(2, 3),
        pr_number=8210,
    )
    page = html.unescape(_page(verdict))
    assert (
        "compared with the base's cells run in this sweep and reused from sweeps 2, 3 · "
        "1 comparison in this verdict (the candidate's cells against the base's, and "
        "against goldens)"
    ) in page
    no_earlier = SweepVerdict(sweep_id=5, job="j", kind="nightly", outcome="clean")
    assert "no earlier good night to compare with · 0 comparisons in this verdict" in _page(
        no_earlier
    )


def test_without_a_verdict_the_within_sweep_count_still_says_what_it_counts() -> None:
    page = _page(None)
    assert "in this verdict" not in page
    assert "Within the sweep: no regression found in 0 comparisons" in page


def test_a_reference_bars_chart_says_so_first_and_labels_may_wrap() -> None:
    page = _page(None)
    # eager at depth 3 is its own reference in a graph-mode grid
    assert ">ref: base · think-off · synthetic</text>" in page
    assert "(reference)</text>" not in page

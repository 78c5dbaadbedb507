"""A gate that cannot pass by accident. `farm compare` with nothing
compared (an engine map to a name no sweep ran, sweeps of different engines), a sweep
compared with itself, or `--post-github` that cannot post, is not a pass; nor is a PR
run in which no candidate variant met a base variant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from farm.analysis.rules import pr_rules
from farm.cli.main import app
from tests.fakes.simulate import simulate_sweep
from tests.support.alerts import cli_env, synthetic_sweep
from tests.support.stores import save_sweep

runner = CliRunner()


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int]:
    url = f"sqlite:///{tmp_path_factory.mktemp('gate') / 'farm.db'}"
    base = save_sweep(url, synthetic_sweep(8, regressed=False))
    cand = save_sweep(url, synthetic_sweep(8, regressed=True))
    return url, base.sweep_id, cand.sweep_id


def _compare(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["compare", *args], env=cli_env(url))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--map-engine", "base=nosuch"], "the baseline sweep ran no engine 'nosuch'"),
        (["--map-engine", "nosuch=base"], "the candidate sweep ran no engine 'nosuch'"),
        (["--post-github", "o/r#7"], "GITHUB_TOKEN is not set"),
    ],
)
def test_a_comparison_that_cannot_be_made_or_posted_is_refused(
    two_sweeps: tuple[str, int, int], extra: list[str], fragment: str
) -> None:
    url, base, cand = two_sweeps
    for gate in ([], ["--fail-on-regression"]):
        code, output = _compare(url, str(base), str(cand), *extra, *gate)
        assert code == 2 and fragment in output, output
        assert "no AL regression" not in output


def test_a_sweep_compared_with_itself_is_refused(two_sweeps: tuple[str, int, int]) -> None:
    url, base, _ = two_sweeps
    code, output = _compare(url, str(base), str(base), "--fail-on-regression")
    assert code == 2 and "compared with itself" in output


def test_nothing_compared_is_no_pass(two_sweeps: tuple[str, int, int], tmp_path: Path) -> None:
    url, base, _ = two_sweeps
    # Other MTP depths: no variant of one sweep has a comparable variant in the other.
    other = simulate_sweep(
        rng=np.random.default_rng(9),
        graph_modes=("eager",),
        depths=(2,),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=40,
    )
    renamed = save_sweep(url, other)
    code, output = _compare(url, str(base), str(renamed.sweep_id), "--fail-on-regression")
    assert code == 2, output
    assert "nothing was compared" in output and "not a pass" in output
    assert "nothing compared" in output  # the Markdown says so too
    assert "no AL regression" not in output


def test_a_pr_run_with_nothing_compared_is_an_error_status_not_success() -> None:
    from farm.workflows.pr.decide import commit_status, judge_pr
    from tests.support.sweeps import CAND, PR_FAST, pr_sweep

    judged = judge_pr(
        pr_sweep(5),
        base="nosuch",
        candidate=CAND,
        reused=(),
        job="j",
        number=7,
        rules=pr_rules(candidate=CAND, base="nosuch", check=PR_FAST),
    )
    verdict = judged.verdict
    assert verdict.outcome != "clean" and verdict.exit_status != 0
    assert [f.check for f in verdict.findings] == ["nothing_compared"]
    status = commit_status(verdict)
    assert status.state == "error" and "nothing compared" in status.description

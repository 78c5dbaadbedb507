"""A stored sweep held to the goldens teams keep, on a real SQLite store: `farm goldens
check` through typer's CliRunner, and `farm nightly`'s judging of a stored night with
the goldens its job names (no engine: the sweep is synthetic, tests/fakes/simulate.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from farm.cli.common import open_session
from farm.cli.main import app
from farm.plan import Plan
from farm.records import SweepRecord
from farm.spec.goldens import bind_goldens, read_goldens
from farm.store import create_sweep, finish_sweep, open_store, save_cell_result
from farm.store.verdicts import get_verdict
from farm.workflows.nightly.run import NightlyDeps, NightlyRequest, run_nightly
from tests.fakes.simulate import simulate_sweep

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "data" / "goldens"
SYNTHETIC = GOLDENS / "synthetic-mtp3.yaml"
DEPTH3 = "base.synthetic.eager.mtp3.swa-on"


def _sweep() -> SweepRecord:
    # One depth-3 variant (eager, thinking off): the synthetic golden holds it.
    return simulate_sweep(
        rng=np.random.default_rng(24),
        graph_modes=("eager",),
        depths=(0, 1, 3),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=30,
    )


@pytest.fixture
def stored(tmp_path: Path) -> tuple[str, int]:
    """A SQLite store holding the synthetic sweep: (url, sweep id)."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    sweep = _sweep()
    engine = open_store(url)
    try:
        with Session(engine) as session:
            plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
            sweep_id = create_sweep(session, plan, "name: synthetic\n", "test-host")
            for cell in sweep.cells:
                assert cell.result is not None
                save_cell_result(session, sweep_id, cell.result)
            finish_sweep(session, sweep_id, "ok")
    finally:
        engine.dispose()
    return url, sweep_id


def test_farm_goldens_check_names_the_missed_position_and_exits_1(
    stored: tuple[str, int],
) -> None:
    url, sweep_id = stored
    result = CliRunner().invoke(
        app,
        ["goldens", "check", str(sweep_id), "--goldens", str(GOLDENS), "--db", url],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 1, result.output
    # The folder's GLM golden is for no model of the sweep; the synthetic one (model
    # farm-tests/synthetic, by its last path part) holds the one depth-3 variant.
    assert f"sweep {sweep_id} (synthetic): 1 golden(s), 1 golden x variant pair(s)" in result.output
    misses = [line for line in result.output.splitlines() if line.startswith("  golden golden:")]
    assert len(misses) == 1, result.output
    (miss,) = misses
    assert f"{DEPTH3}[think-off.synthetic]: acceptance at position 2 is" in miss
    assert "below golden synthetic-mtp3's 0.750 - 0.050 = 0.700" in miss
    assert f"({SYNTHETIC}:13: mtp k=3 on farm-tests/synthetic, batch 4)" in miss
    assert "request-level bootstrap over 30 requests" in miss


def test_farm_goldens_check_passes_a_sweep_that_holds_and_refuses_bad_input(
    stored: tuple[str, int], tmp_path: Path
) -> None:
    url, sweep_id = stored
    held = tmp_path / "held.yaml"
    held.write_text(SYNTHETIC.read_text().replace("[0.70, 0.55, 0.75]", "[0.70, 0.55, 0.40]"))
    runner = CliRunner()
    ok = runner.invoke(
        app, ["goldens", "check", str(sweep_id), "--goldens", str(held), "--db", url]
    )
    assert ok.exit_code == 0, ok.output
    assert "0 position(s) missed" in ok.output
    # Goldens for another model: nothing to hold, not a pass.
    glm = str(GOLDENS / "glm52-w4a8-mtp-a3.yaml")
    other = runner.invoke(app, ["goldens", "check", str(sweep_id), "--goldens", glm, "--db", url])
    assert other.exit_code == 2
    assert "no golden is for a model of sweep" in other.output and "--model" in other.output
    # ... unless --model says which of the sweep's models they are for; k=3 holds
    # the depth-3 variant, which misses the GLM golden's 0.86 at position 0.
    forced = runner.invoke(
        app,
        ["goldens", "check", str(sweep_id), "--goldens", glm, "--model", "synthetic", "--db", url],
    )
    assert forced.exit_code == 1, forced.output
    assert "acceptance at position 0" in forced.output
    unknown = runner.invoke(
        app,
        ["goldens", "check", str(sweep_id), "--goldens", glm, "--model", "glm52", "--db", url],
    )
    assert unknown.exit_code == 2 and "sweep 1 ran no such model" in unknown.output


def test_a_nightly_verdict_holds_the_night_to_the_jobs_goldens(stored: tuple[str, int]) -> None:
    url, sweep_id = stored
    goldens = bind_goldens(read_goldens(SYNTHETIC), {"synthetic": ("synthetic",)})
    request = NightlyRequest(
        job="synthetic", url=url, history=0, resume=sweep_id, notify=False, goldens=goldens
    )

    def no_run(sweep: int | None, stored: object) -> int:
        raise AssertionError("the stored night is finished: nothing runs")

    deps = NightlyDeps(
        open_session=open_session,
        run_sweep=no_run,
        check_resume=lambda sweep: None,
        judged=lambda check: None,
    )
    outcome = run_nightly(request, deps)
    assert outcome.exit_status == 1
    verdict = outcome.check.verdict
    assert verdict.outcome == "regression"
    assert [f.check for f in verdict.findings] == ["golden"]
    with open_session(url) as session:
        stored_verdict = get_verdict(session, sweep_id, "nightly")
    assert stored_verdict is not None and stored_verdict.findings[0].source == "golden"
    assert stored_verdict.findings[0].fallen_positions[0].position == 2

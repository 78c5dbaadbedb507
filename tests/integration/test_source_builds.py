"""Builds from a pull request, a source tree and a wheel, installed for real with pip.

The "engine" here is a fake: a tiny package named ``vllm`` whose modules satisfy the
vLLM adapter's import check (``vllm.entrypoints.openai.api_server``), so the real
build path (venv, pip install, import check, patch derivation) runs in seconds with
no engine. Its ``MARK`` says which commit was installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.builds.sources import SourceError
from farm.builds.venv import ensure_build, plan_builds
from farm.cli.main import app
from farm.errors import BuildError
from farm.records import BuildInfo
from farm.spec import EngineSpec
from tests.fakes.plugin_repo import git as _git

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "0.0.1"

[tool.setuptools.packages.find]
include = ["vllm*"]
"""
SERIES = """\
patches:
  - id: pr7-fix
    file: pr7-fix.patch
    purpose: fix
    fixes: a test of patches on a pull request build
    applies_to: {{commits: ["{commit}"]}}
    root: package
    strip: 1
"""
PATCH = """\
--- a/vllm/__init__.py
+++ b/vllm/__init__.py
@@ -1,2 +1,2 @@
 __version__ = "0.0.1"
-MARK = "pr7"
+MARK = "pr7-patched"
"""


def _commit_mark(repo: Path, mark: str) -> str:
    (repo / "vllm" / "__init__.py").write_text(f'__version__ = "0.0.1"\nMARK = "{mark}"\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", mark)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def upstream(tmp_path: Path) -> Path:
    """The fake engine's repository: ``main`` has MARK = "main"."""
    repo = tmp_path / "fake-vllm"
    api = repo / "vllm" / "entrypoints" / "openai"
    api.mkdir(parents=True)
    for init in (repo / "vllm" / "entrypoints", api):
        (init / "__init__.py").write_text("")
    (api / "api_server.py").write_text("# the fake engine's server module\n")
    (repo / "pyproject.toml").write_text(PYPROJECT)
    _git(repo, "init", "-q", "-b", "main")
    _commit_mark(repo, "main")
    return repo


def _push_pr(upstream: Path, mirror: Path, mark: str) -> str:
    """Commit MARK = ``mark`` on a PR branch and publish it as refs/pull/7/head."""
    _git(upstream, "checkout", "-q", "-B", "pr7", "main")
    head = _commit_mark(upstream, mark)
    _git(upstream, "checkout", "-q", "main")
    _git(upstream, "push", "-q", "--force", str(mirror), "pr7:refs/pull/7/head")
    return head


def _mark(build: BuildInfo) -> str:
    argv = [build.python, "-c", "import vllm; print(vllm.MARK)"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _fake(name: str, source: dict[str, object], **extra: object) -> EngineSpec:
    spec = {"name": name, "family": "vllm", "package": "vllm", "source": source, **extra}
    return EngineSpec.model_validate(spec)


def test_pull_request_from_a_mirror_builds_patches_and_moves_with_the_pr(
    upstream: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "mirror.git"
    _git(tmp_path, "clone", "-q", "--bare", str(upstream), str(mirror))
    head = _push_pr(upstream, mirror, "pr7")
    home = tmp_path / "home"
    cache = home / "cache"
    engine = _fake("fake-vllm-pr7", {"kind": "pr", "number": 7, "mirror": str(mirror)})

    lines: list[str] = []
    build = ensure_build(engine, cache, lines.append)
    assert build.build_id == plan_builds([engine])[0].build_id
    assert _mark(build) == "pr7"
    assert build.version == "0.0.1"  # what pip installed; the job declared none
    assert any("fetching refs/pull/7/head" in line for line in lines)
    lines.clear()
    assert ensure_build(engine, cache, lines.append) == build  # cached: nothing fetched
    assert not lines

    listing = CliRunner().invoke(
        app, ["builds", "list"], env={"FARM_HOME": str(home), "COLUMNS": "250"}
    )
    assert listing.exit_code == 0, listing.output
    assert build.build_id in listing.output and "pull request #7" in listing.output

    # A patch written for this commit applies to the installed package (hard-link derive).
    patches = tmp_path / "patches" / "vllm"
    patches.mkdir(parents=True)
    (patches / "series.yaml").write_text(SERIES.format(commit=head))
    (patches / "pr7-fix.patch").write_text(PATCH)
    monkeypatch.setenv("FARM_PATCHES_DIR", str(patches.parent))
    patched_engine = engine.model_copy(update={"name": "fake-pr7-fixed", "patches": ("pr7-fix",)})
    patched = ensure_build(patched_engine, cache)
    assert patched.build_id not in (build.build_id,)
    assert _mark(patched) == "pr7-patched" and _mark(build) == "pr7"

    # The PR gets a new commit: a new build; the patch names the old commit only.
    _push_pr(upstream, mirror, "pr7-v2")
    moved = ensure_build(engine, cache)
    assert moved.build_id != build.build_id and _mark(moved) == "pr7-v2"
    with pytest.raises(BuildError, match=r"patch pr7-fix does not apply to vllm 0.0.1 \(pull"):
        ensure_build(patched_engine, cache)

    # gc prunes the fetched repository with the builds.
    assert len(list((cache / "sources" / "git").glob("*.git"))) == 1
    gc = CliRunner().invoke(
        app, ["builds", "gc", "--older-than-days", "0"], env={"FARM_HOME": str(home)}
    )
    assert gc.exit_code == 0, gc.output
    assert "removed 3 build(s), 0 unfinished build folder(s), 1 git source(s)" in gc.output
    assert not list((cache / "sources" / "git").glob("*.git"))


def test_tree_and_wheel_sources_build_and_keep_their_ids(upstream: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    tree_engine = _fake("fake-vllm-tree", {"kind": "tree", "path": str(upstream)})
    first = ensure_build(tree_engine, cache)
    assert _mark(first) == "main"
    # Installed from a snapshot: the tree gets no build/ or *.egg-info of setuptools.
    assert not (upstream / "vllm.egg-info").exists() and not (upstream / "build").exists()
    # Files the identity leaves out (caches, old build output) do not make a new build.
    (upstream / "build" / "lib").mkdir(parents=True)
    (upstream / "build" / "lib" / "stale.py").write_text("")
    (upstream / "vllm" / "__pycache__").mkdir()
    lines: list[str] = []
    assert ensure_build(tree_engine, cache, lines.append).build_id == first.build_id
    assert not lines

    (upstream / "vllm" / "__init__.py").write_text('__version__ = "0.0.1"\nMARK = "edited"\n')
    edited = ensure_build(tree_engine, cache)
    assert edited.build_id != first.build_id and _mark(edited) == "edited"

    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist)]
    subprocess.run([*pip, str(upstream)], check=True, capture_output=True)
    (wheel,) = dist.glob("vllm-0.0.1-*.whl")
    from_wheel = ensure_build(
        _fake("fake-vllm-wheel", {"kind": "wheel", "path": str(wheel)}), cache
    )
    assert _mark(from_wheel) == "edited"
    assert from_wheel.build_id not in (first.build_id, edited.build_id)


def test_a_missing_ref_fails_before_anything_is_built(upstream: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    engine = _fake("fake-vllm-gone", {"kind": "git", "repo": str(upstream), "ref": "no-such"})
    with pytest.raises(SourceError, match=r"engine fake-vllm-gone: source git .*@no-such: ref"):
        ensure_build(engine, cache)
    assert not (cache / "builds").exists()

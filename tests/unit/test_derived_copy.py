"""What a derived build takes from its base: the files, not the base's own bookkeeping
or the caches its engine made while serving."""

from __future__ import annotations

from pathlib import Path

from farm.builds.cache import MARKER
from farm.builds.layers import _link_copy
from farm.engines.base import RUN_CACHE


def test_a_derived_build_links_the_files_but_not_the_bases_run_cache(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "lib").mkdir(parents=True)
    (base / "lib" / "mod.py").write_text("x = 1\n")
    (base / MARKER).write_text("{}")
    (base / RUN_CACHE / "torch_compile_cache").mkdir(parents=True)
    (base / RUN_CACHE / "torch_compile_cache" / "graph").write_text("compiled")
    derived = tmp_path / "derived"
    _link_copy(base, derived)
    assert (derived / "lib" / "mod.py").stat().st_ino == (base / "lib" / "mod.py").stat().st_ino
    assert not (derived / MARKER).exists()
    assert not (derived / RUN_CACHE).exists()

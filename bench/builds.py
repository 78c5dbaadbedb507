"""Cost of a patched engine build derived from a cached base versus a cold build.

    python bench/builds.py [JOB]

Builds the job's first engine cold into a fresh cache (download + install, minutes),
then derives a patched variant of it (a one-line patch to a real engine module, made
here against the installed file) and reports time and disk of the derivation as
ratios of the cold build's. Disk counts each inode once (hard links are shared).
Target: <= 5% of a cold build in both.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tempfile
import time
from pathlib import Path

from farm.builds import ensure_build
from farm.builds.cache import list_builds
from farm.builds.venv import _site_packages
from farm.spec import load_job

REPO = Path(__file__).resolve().parents[1]
MARKED = "vllm/logits_process.py"


def _inodes(path: Path) -> set[tuple[int, int]]:
    out = set()
    for f in path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            st = f.lstat()
            out.add((st.st_ino, st.st_size))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default=str(REPO / "jobs" / "local.yaml"))
    args = parser.parse_args()
    engine = load_job(args.job).engines[0]
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        cache = Path(tmp) / "cache"
        t0 = time.monotonic()
        base = ensure_build(engine, cache)
        cold_s = time.monotonic() - t0

        site = _site_packages(Path(base.env_dir))
        old = (site / MARKED).read_text().splitlines(keepends=True)
        new = [*old[:1], "# bench: patched\n", *old[1:]]
        series = Path(tmp) / "patches" / engine.package
        series.mkdir(parents=True)
        (series / "bench.patch").write_text(
            "".join(difflib.unified_diff(old, new, f"a/{MARKED}", f"b/{MARKED}"))
        )
        (series / "series.yaml").write_text(
            "patches:\n  - id: bench\n    file: bench.patch\n    purpose: fix\n"
            "    fixes: benchmark\n    applies_to: {versions: '>=0'}\n    root: package\n"
        )
        os.environ["FARM_PATCHES_DIR"] = str(Path(tmp) / "patches")
        t1 = time.monotonic()
        patched = ensure_build(engine.model_copy(update={"patches": ("bench",)}), cache)
        derive_s = time.monotonic() - t1

        base_inodes = _inodes(Path(base.env_dir))
        extra = _inodes(Path(patched.env_dir)) - base_inodes
        base_bytes = sum(size for _, size in base_inodes)
        extra_bytes = sum(size for _, size in extra)
        sizes = {b.info.build_id: b.size_bytes for b in list_builds(cache)}
    print(f"cold build:        {cold_s:8.1f} s  {base_bytes / 2**30:6.2f} GiB")
    print(f"patched variant:   {derive_s:8.1f} s  {extra_bytes / 2**20:6.2f} MiB new on disk")
    print(f"time ratio:        {derive_s / cold_s:8.4f}")
    print(f"disk ratio:        {extra_bytes / base_bytes:8.6f}")
    print(f"(cache listing counts {len(sizes)} builds)")


if __name__ == "__main__":
    main()

"""Cost of builds derived from a cached base (patched, layered) versus a cold build.

    python bench/builds.py [JOB]

Builds the job's first engine cold into a fresh cache (download + install, minutes),
then derives from it, each timed:

- a patched variant (a one-line patch to a real engine module, made here against the
  installed file);
- layered builds: a tiny pure-Python vLLM plugin (a ``vllm.general_plugins`` entry
  point) from a local git repository, installed on top with ``pip install --no-deps``
  at its first commit (the repository is fetched), at its second commit (what each
  step of a bisection costs), and the second commit again (a cache hit).

Time and disk are reported as ratios of the cold build's. Disk is what a derived build
does not share with its base: files counted once per inode (hard links to the base
are free) plus its own directories' blocks. Target: <= 5% of a cold build in both.

    python bench/builds.py --bisection ID --db URL

reports a stored `farm bisect` search instead: its total wall time (every run of it)
against the sum of the engine time (start-up + generation) of the cells it measured,
the ends' and every step's; the rest is builds, Ray and sweep bookkeeping.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from farm.builds import ensure_build
from farm.builds.site import site_packages
from farm.records import BuildInfo
from farm.spec import EngineSpec, GitSource, OverlaySpec, load_job

REPO = Path(__file__).resolve().parents[1]
MARKED = "vllm/logits_process.py"
PLUGIN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "farm-bench-plugin"
version = "0.1.{n}"

[project.entry-points."vllm.general_plugins"]
farm_bench_plugin = "farm_bench_plugin:register"
"""
PLUGIN_CODE = "GENERATION = {n}\n\n\ndef register():\n    pass\n"


def _files(path: Path) -> dict[int, int]:
    """inode -> size of every regular file under ``path``."""
    out = {}
    for f in path.rglob("*"):
        st = f.lstat()
        if f.is_file() and not f.is_symlink():
            out[st.st_ino] = st.st_size
    return out


def _own_bytes(derived: Path, base_files: dict[int, int]) -> int:
    """Bytes of ``derived`` not shared with the base: its own files and directories."""
    files = sum(size for ino, size in _files(derived).items() if ino not in base_files)
    dirs = sum(d.lstat().st_blocks * 512 for d in derived.rglob("*") if d.is_dir())
    return files + dirs + derived.lstat().st_blocks * 512


def _timed(build: Callable[[], BuildInfo]) -> tuple[BuildInfo, float]:
    t0 = time.monotonic()
    info = build()
    return info, time.monotonic() - t0


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com"}
    env |= {"GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def _plugin_repo(repo: Path) -> None:
    """A plugin repository with two commits (``main~1`` and ``main``)."""
    (repo / "farm_bench_plugin").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    for n in (1, 2):
        (repo / "pyproject.toml").write_text(PLUGIN_PYPROJECT.format(n=n))
        (repo / "farm_bench_plugin" / "__init__.py").write_text(PLUGIN_CODE.format(n=n))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"generation {n}")


def _patch_series(tmp: Path, engine: EngineSpec, base: BuildInfo) -> None:
    site = site_packages(Path(base.env_dir))
    old = (site / MARKED).read_text().splitlines(keepends=True)
    new = [*old[:1], "# bench: patched\n", *old[1:]]
    series = tmp / "patches" / engine.package
    series.mkdir(parents=True)
    (series / "bench.patch").write_text(
        "".join(difflib.unified_diff(old, new, f"a/{MARKED}", f"b/{MARKED}"))
    )
    (series / "series.yaml").write_text(
        "patches:\n  - id: bench\n    file: bench.patch\n    purpose: fix\n"
        "    fixes: benchmark\n    applies_to: {versions: '>=0'}\n    root: package\n"
    )
    os.environ["FARM_PATCHES_DIR"] = str(tmp / "patches")


def bisection_cost(db_url: str, bisection_id: int) -> None:
    """Print a stored bisection's wall time against its cells' engine time."""
    from sqlmodel import Session

    from farm import store
    from farm.store.bisections import get_bisection

    with Session(store.open_store(db_url, create=False)) as session:
        b = get_bisection(session, bisection_id)
        sweeps = {*b.good.sweep_ids, *b.bad.sweep_ids}
        sweeps |= {s.sweep_id for s in b.steps if s.sweep_id is not None}
        cells = [
            c
            for sweep_id in sorted(sweeps)
            for c in store.load_sweep(session, sweep_id).cells
            if c.cell.engine == b.engine and c.result is not None
        ]
    engine_s = sum(
        (c.result.startup_s or 0) + (c.result.generation_s or 0) for c in cells if c.result
    )
    print(f"bisection {b.id}: {b.headline()}")
    print(
        f"{len(b.steps)} steps, {b.builds_run} builds, {b.cells_run} cells run "
        f"({len(cells)} cells measured in {len(sweeps)} sweeps)"
    )
    print(f"wall time (all runs)      {b.wall_s:8.1f} s")
    share = f"{engine_s / b.wall_s:.2f} of wall" if b.wall_s > 0 else "no wall time recorded"
    print(f"engine time of its cells  {engine_s:8.1f} s  ({share})")
    print(f"overhead (builds, Ray...) {b.wall_s - engine_s:8.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default=str(REPO / "jobs" / "local.yaml"))
    parser.add_argument("--bisection", type=int, help="report this stored bisection instead")
    parser.add_argument("--db", help="the store of --bisection (SQLAlchemy URL)")
    args = parser.parse_args()
    if args.bisection is not None:
        if not args.db:
            parser.error("--bisection needs --db")
        from farm.errors import FarmError

        try:
            bisection_cost(args.db, args.bisection)
        except FarmError as exc:
            parser.exit(2, f"error: {exc}\n")
        return
    engine = load_job(args.job).engines[0]
    rows: list[tuple[str, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        cache = tmp / "cache"
        base, cold_s = _timed(lambda: ensure_build(engine, cache))
        base_files = _files(Path(base.env_dir))
        base_bytes = _own_bytes(Path(base.env_dir), {})  # all of it: nothing is shared

        _patch_series(tmp, engine, base)
        patched_engine = engine.model_copy(update={"name": "bench-patched", "patches": ("bench",)})
        patched, s = _timed(lambda: ensure_build(patched_engine, cache))
        rows.append(("patched variant", s, _own_bytes(Path(patched.env_dir), base_files)))

        repo = tmp / "plugin"
        _plugin_repo(repo)
        for label, ref in (
            ("layered, 1st commit (fetch)", "main~1"),
            ("layered, 2nd commit (bisect step)", "main"),
            ("layered, 2nd commit again (cached)", "main"),
        ):
            overlay = OverlaySpec(
                package="farm-bench-plugin", source=GitSource(kind="git", repo=str(repo), ref=ref)
            )
            layered_engine = engine.model_copy(
                update={"name": "bench-layered", "overlays": (overlay,)}
            )
            layered, s = _timed(functools.partial(ensure_build, layered_engine, cache))
            rows.append((label, s, _own_bytes(Path(layered.env_dir), base_files)))

    print(f"{'build':38} {'time s':>8} {'time ratio':>11} {'own MiB':>9} {'disk ratio':>11}")
    print(
        f"{'cold base (' + base.build_id + ')':38} {cold_s:8.1f} {1:11.4f} "
        f"{base_bytes / 2**20:9.1f} {1:11.4f}"
    )
    for label, s, own in rows:
        print(f"{label:38} {s:8.2f} {s / cold_s:11.4f} {own / 2**20:9.2f} {own / base_bytes:11.5f}")
    print("target: <= 0.05 of the cold build in time and in disk")


if __name__ == "__main__":
    main()

"""Farm overhead on a real sweep: wall time over the engines' own start-up + generation.

    python bench/overhead.py [JOB] [--only AXIS=VALUE ...]

Runs the sweep (real vLLM CPU servers on a local Ray cluster) into a throw-away
SQLite store, then reports the ratio

    overhead = sweep wall time / sum over cells (server start-up + generation) - 1

Everything else the farm does is in the numerator only: Ray start, the cached-build
check, planning, storing, server shutdown. Target for jobs/local.yaml: <= 10%.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from farm import store
from farm.orchestrate.driver import SweepOptions, farm_home, run_sweep
from farm.spec import load_job

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default=str(REPO / "jobs" / "local.yaml"))
    parser.add_argument("--only", action="append", default=[], help="AXIS=VALUE")
    parser.add_argument("--db", help="keep the sweep in this store (default: a throw-away one)")
    args = parser.parse_args()
    only = dict(item.split("=", 1) for item in args.only)
    job = load_job(args.job)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{tmp}/bench.db"
        t0 = time.monotonic()
        outcome = run_sweep(
            job, Path(args.job).read_text(), SweepOptions(db_url=url, only=only, home=farm_home())
        )
        wall = time.monotonic() - t0
        with store.Session(store.open_store(url)) as session:
            record = store.load_sweep(session, outcome.sweep_id)
    results = [c.result for c in record.cells if c.result is not None]
    startup = sum(r.startup_s or 0.0 for r in results)
    generation = sum(r.generation_s or 0.0 for r in results)
    engine = startup + generation
    print(f"sweep {outcome.sweep_id}: {len(results)} cells ({len(outcome.failed)} failed)")
    print(f"sweep wall time:        {wall:8.1f} s")
    print(f"engine start-up:        {startup:8.1f} s")
    print(f"engine generation:      {generation:8.1f} s")
    print(f"farm overhead (ratio):  {wall / engine - 1:8.3f}  (wall / (start-up + generation) - 1)")


if __name__ == "__main__":
    main()

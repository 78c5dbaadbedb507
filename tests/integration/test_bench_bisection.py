"""Outputs that crash, the bench script's part: `bench/builds.py --bisection ID` of a
stored bisection without wall time reports it, and of a missing one says so, instead
of a ZeroDivisionError or a traceback. A real SQLite store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_bench_report_of_a_bisection_without_wall_time(tmp_path: Path) -> None:
    from farm import store
    from farm.store.bisections import create_bisection
    from tests.support.bisection import bisection

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    engine = store.open_store(url)
    try:
        with store.Session(engine) as session:
            b, _ = create_bisection(session, bisection(wall_s=0.0))
    finally:
        engine.dispose()
    bench = [sys.executable, str(REPO / "bench" / "builds.py"), "--db", url, "--bisection"]
    done = subprocess.run([*bench, str(b.id)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "no wall time recorded" in done.stdout, done.stderr
    missing = subprocess.run([*bench, "99"], capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr

"""Repeated clean sweeps must raise no alert.

    python bench/clean_repeats.py [--job jobs/local.yaml] [--repeats 5]
        [--only sliding_window=on --only mtp_depth=3] [--db URL] [--export-dir DIR]

Runs the same job ``--repeats`` times on the same (clean) engine build through the
real CLI (`farm run`), and after each sweep runs `farm alerts check --history N`
exactly as a nightly would: within-sweep checks plus change points over the sweeps so
far. Prints, per sweep, its wall time, cells ok, comparisons, findings and alerts
raised, then the totals. Every alert here is a false alarm: the engine, the model, the
prompts and the seeds do not change between repeats; only scheduling noise
(which requests share a decode batch) does. ``--export-dir`` writes each sweep as
JSON (`farm export`) for `bench/detection.py --recorded`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FARM = str(Path(sys.executable).with_name("farm"))
_CHECK = re.compile(
    r"sweep (?P<sweep>\d+): (?P<comparisons>\d+) comparisons, (?P<findings>\d+) finding\(s\); "
    r"(?P<alerts>\d+) alert\(s\) raised"
)


def farm_cli(*args: str, ok: tuple[int, ...] = (0,)) -> str:
    """The farm CLI's output; the bench exits with its output on any other status."""
    proc = subprocess.run(
        [FARM, *args], cwd=REPO, capture_output=True, text=True, env={**os.environ}, check=False
    )
    if proc.returncode not in ok:
        sys.exit(f"farm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="jobs/local.yaml")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", action="append", default=[], help="AXIS=VALUE, as farm run")
    ap.add_argument("--db", default=None, help="store URL (default: FARM_HOME's SQLite)")
    ap.add_argument("--export-dir", type=Path, default=None)
    args = ap.parse_args()

    db = ["--db", args.db] if args.db else []
    only = [x for item in args.only for x in ("--only", item)]
    totals = {"comparisons": 0, "findings": 0, "alerts": 0}
    for i in range(args.repeats):
        t0 = time.monotonic()
        farm_cli("run", args.job, *only, *db)
        wall = time.monotonic() - t0
        check = _CHECK.search(
            farm_cli("alerts", "check", "latest", "--history", str(i + 1), "--no-notify", *db)
        )
        if check is None:
            sys.exit("could not read the output of `farm alerts check`")
        if args.export_dir:
            args.export_dir.mkdir(parents=True, exist_ok=True)
            target = args.export_dir / f"clean-repeat-{i + 1}.json"
            farm_cli("export", check["sweep"], "--out", str(target), *db)
        for key in totals:
            totals[key] += int(check[key])
        print(
            f"repeat {i + 1}: sweep {check['sweep']}  {wall:6.0f} s  "
            f"comparisons {check['comparisons']}  findings {check['findings']}  "
            f"alerts raised {check['alerts']}",
            flush=True,
        )
    print(
        f"\n{args.repeats} clean sweeps: {totals['comparisons']} comparisons, "
        f"{totals['findings']} findings, {totals['alerts']} alerts raised "
        "(every one would be a false alarm)"
    )


if __name__ == "__main__":
    main()

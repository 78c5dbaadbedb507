"""Acceptance by context length: AL per draft position at each length, and its cost.

    python bench/long_context.py [--job jobs/long-context.yaml] [--export FILE]
    python bench/long_context.py SWEEP.json      # a recorded sweep (`farm export`)

Without a sweep file, runs the job through the real CLI (`farm run`, then `farm
export` to ``--export``) and prints the figures; the recorded run is
bench/data/recorded-long-context/sweep.json. Per model and context length: AL with its
request-level bootstrap interval, acceptance per draft position, accuracy, and the
generation time of the length's 16 requests as a ratio to the same cell's time
without context (one server serves every length: the ratio is the context's cost).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from farm.analysis.stats import AcceptanceSample, acceptance_stats
from farm.records import SweepRecord
from farm.store.export import read_sweep_export

REPO = Path(__file__).resolve().parents[1]
FARM = str(Path(sys.executable).with_name("farm"))


def _run(job: Path, export: Path) -> SweepRecord:
    db = f"sqlite:///{Path(tempfile.mkdtemp()) / 'farm.db'}"
    export_args = ["export", "latest", "--db", db, "--out", str(export)]
    for args in (["run", str(job), "--db", db], export_args):
        proc = subprocess.run([FARM, *args], cwd=REPO, env={**os.environ}, check=False)
        if proc.returncode:
            sys.exit(f"farm {' '.join(args)} failed ({proc.returncode})")
    return read_sweep_export(export)


def print_figures(sweep: SweepRecord) -> None:
    """One block per cell, one line per context length: 80 columns wide."""
    print(f"sweep {sweep.sweep_id} ({sweep.job})")
    for stored in sweep.cells:
        result = stored.result
        if result is None:
            print(f"{stored.cell.cell_id}: not run")
            continue
        print(f"\n{stored.cell.cell_id}: start-up {result.startup_s or 0:.0f} s")
        print("  ctx    AL [95% interval]      per position        acc   gen s  x ctx0")
        variants = sorted(result.variants, key=lambda v: int(v.axes.get("context", 0)))
        base = next((v.elapsed_s for v in variants if not v.axes.get("context")), None)
        for variant in variants:
            stats = acceptance_stats(AcceptanceSample.from_requests(variant.requests), rng=0)
            al = stats.mean_acceptance_length
            scored = [r.correct for r in variant.requests if r.correct is not None]
            accuracy = f"{sum(scored) / len(scored):.2f}" if scored else "  - "
            positions = " ".join(f"{p:.2f}" for p in variant.counters.per_position_rate)
            ratio = f"{variant.elapsed_s / base:5.1f}" if base else "    -"
            figure = f"{al.estimate:.2f} [{al.low:.2f}, {al.high:.2f}]" if al else "-"
            print(
                f"  {int(variant.axes.get('context', 0)):>5}  {figure:<20}  {positions:<18}  "
                f"{accuracy}  {variant.elapsed_s:6.1f}  {ratio}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", nargs="?", type=Path, help="a `farm export` file to print")
    ap.add_argument("--job", type=Path, default=REPO / "jobs" / "long-context.yaml")
    ap.add_argument("--export", type=Path, default=Path("long-context-sweep.json"))
    args = ap.parse_args()
    sweep = read_sweep_export(args.sweep) if args.sweep else _run(args.job, args.export)
    print_figures(sweep)


if __name__ == "__main__":
    main()

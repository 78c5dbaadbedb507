"""Clean noisy nights through `farm nightly`, as a user runs them: false alarms,
confirmations and device time.

    python bench/noisy_nights.py [--nights 20] [--model tiny-step] [--canary PATCH
        --canary-nights 2] [--confirm-runs 6] [--export-dir DIR]

Runs jobs/noise-calibration.yaml (the vLLM CPU build with the bundled noise patch at
its measured defaults, unseeded: every engine process draws its own run-level shift;
eager, MTP 3, thinking on and off, 32 prompts) restricted to one model, ``--nights``
times through the real CLI into a fresh SQLite store, then ``--canary-nights`` nights
with a canary patch added to the build. Every night after the fifth is judged with its
calibrated thresholds and confirms its suspicious cells (``nightly.confirm_runs``).
Prints one line per night (verdict, reruns, device time against the one-run night)
and the totals: every regression verdict on a clean night is a false alarm.
``--export-dir`` writes each night, its reruns included, as `farm export` JSON.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
FARM = str(Path(sys.executable).with_name("farm"))
_VERDICT = re.compile(r"nightly verdict on sweep (?P<sweep>\d+) \([^)]*\): (?P<outcome>[a-z_]+)")
_COST = re.compile(r"cost: (?P<device>[\d.]+) device-h")
_RERUNS = re.compile(r"(?P<n>\d+) confirmation rerun\(s\): (?P<more>[\d.]+) device-h more")


def night_job(folder: Path, model: str, runs: int, canary: str | None) -> Path:
    """The night's job file: the noise-calibration job, one model, ``canary`` added."""
    job = yaml.safe_load((REPO / "jobs" / "noise-calibration.yaml").read_text())
    job["models"] = [
        {**m, "path": str((REPO / "jobs" / m["path"]).resolve())}
        for m in job["models"]
        if m["name"] == model
    ]
    for w in job["workloads"]:
        w["prompts"] = str((REPO / "jobs" / w["prompts"]).resolve())
    if canary:
        job["engines"][0]["patches"] = [*job["engines"][0]["patches"], canary]
    job["nightly"] = {"confirm_runs": runs}
    path = folder / f"night-{'canary' if canary else 'clean'}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=20)
    ap.add_argument("--model", default="tiny-step")
    ap.add_argument("--canary", default=None)
    ap.add_argument("--canary-nights", type=int, default=0)
    ap.add_argument("--confirm-runs", type=int, default=6)
    ap.add_argument("--export-dir", type=Path, default=None)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="noisy-nights-"))
    db = f"sqlite:///{folder / 'farm.db'}"
    plan = [(night_job(folder, args.model, args.confirm_runs, None), False)] * args.nights
    if args.canary:
        canary = night_job(folder, args.model, args.confirm_runs, args.canary)
        plan += [(canary, True)] * args.canary_nights
    print(f"{len(plan)} nights of {args.model} into {db}", flush=True)
    print(f"{'night':>5} {'verdict':>12} {'reruns':>6} {'device':>7} {'wall s':>7}")
    alarms = clean_nights = 0
    ratios: dict[bool, list[float]] = {False: [], True: []}
    for i, (job, is_canary) in enumerate(plan, start=1):
        t0 = time.monotonic()
        proc = subprocess.run(
            [FARM, "nightly", str(job), "--db", db, "--no-notify"],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            check=False,
        )
        out = proc.stdout + proc.stderr
        verdict, cost = _VERDICT.search(out), _COST.search(out)
        if verdict is None or cost is None or proc.returncode not in (0, 1, 3):
            sys.exit(f"night {i}: farm nightly failed ({proc.returncode}):\n{out[-4000:]}")
        reruns = _RERUNS.search(out)
        device = float(cost["device"])
        more = float(reruns["more"]) if reruns else 0.0
        ratio = (device + more) / device if device else 1.0
        ratios[is_canary].append(ratio)
        if not is_canary and i > 5:
            clean_nights += 1
            alarms += verdict["outcome"] == "regression"
        name = f"{i}{'c' if is_canary else ''}"
        print(
            f"{name:>5} {verdict['outcome']:>12} {reruns['n'] if reruns else 0:>6} "
            f"{ratio:>6.2f}x {time.monotonic() - t0:>7.0f}",
            flush=True,
        )
        for line in out.splitlines():
            if "cleared over" in line or "confirmed over" in line:
                print("      ", line.strip())
        if args.export_dir:
            args.export_dir.mkdir(parents=True, exist_ok=True)
            target = args.export_dir / f"night-{i:02d}.json"
            subprocess.run(
                [FARM, "export", verdict["sweep"], "--out", str(target), "--db", db],
                check=True,
                capture_output=True,
            )
    for flag, name in ((False, "clean"), (True, "canary")):
        if ratios[flag]:
            mean = sum(ratios[flag]) / len(ratios[flag])
            print(f"{name} nights: device time {mean:.2f}x the one-run night on average")
    print(
        f"{clean_nights} clean nights judged calibrated (after the fifth): {alarms} "
        "regression verdict(s), every one a false alarm"
    )


if __name__ == "__main__":
    main()

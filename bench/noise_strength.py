"""How far apart two clean runs of the noisy engine are: the noise patch's strengths.

    python bench/noise_strength.py [--job jobs/noise-calibration.yaml] [--runs 4]
        [--jitter X] [--shift Y] [--model NAME ...] [--canary PATCH ...]
        [--db URL] [--export-dir DIR]

Runs the job (the vLLM CPU build with the bundled noise patch, ``noise-run-to-run``)
``--runs`` times through the real CLI (`farm run`); every run is a fresh engine process,
so a fresh draw of the per-run shift and of the per-token jitter. ``--jitter`` and
``--shift`` set FARM_NOISE_JITTER and FARM_NOISE_SHIFT in the engine's env (default:
the patch's own strengths). Then, per comparable key, what `farm noise` reads from the
store, and between consecutive runs: the share of prompts whose greedy output changed
and the relative change of AL (the target for the default strengths, about what real
engines show: 5-25% of outputs, AL by about 1-3%). ``--export-dir`` writes each run as
JSON (`farm export`, ``night-*.json``) for `bench/detection.py --recorded`. ``--model``
keeps only the named models of the job. Each ``--canary`` adds one run after the clean
ones, its build the job's own plus that canary patch (patches/vllm-cpu): the known-bad
nights that `bench/detection.py --recorded` (table 8) must catch on their first night
under noise.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from clean_repeats import farm_cli  # noqa: E402

from farm import store  # noqa: E402
from farm.analysis.noise import noise_table  # noqa: E402
from farm.records import SweepRecord, VariantResult  # noqa: E402


def _job_with_strengths(
    job: Path,
    jitter: str | None,
    shift: str | None,
    folder: Path,
    models: list[str],
    canary: str | None = None,
) -> Path:
    spec = yaml.safe_load(job.read_text())
    if models:
        spec["models"] = [m for m in spec["models"] if m["name"] in models]
        if not spec["models"]:
            raise SystemExit(f"{job}: none of the models {models}")
    for engine in spec["engines"]:
        if canary:
            engine["patches"] = [*engine.get("patches", []), canary]
        env = engine.setdefault("env", {})
        if jitter is not None:
            env["FARM_NOISE_JITTER"] = jitter
        if shift is not None:
            env["FARM_NOISE_SHIFT"] = shift
    for model in spec["models"]:  # paths relative to the job's folder, as farm reads them
        model["path"] = str((job.parent / model["path"]).resolve())
    for workload in spec["workloads"]:
        workload["prompts"] = str((job.parent / workload["prompts"]).resolve())
    out = folder / (f"{job.stem}-{canary}.yaml" if canary else job.name)
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def _variants(sweep: SweepRecord) -> dict[str, VariantResult]:
    return {
        c.cell.variant_key(v.axes).label: v
        for c in sweep.cells
        if c.result and c.result.status == "ok"
        for v in c.result.variants
        if v.counters.mean_acceptance_length is not None
    }


def _pair_changes(runs: list[SweepRecord]) -> dict[str, list[tuple[float, float]]]:
    """Key label -> (share of outputs changed, relative AL change) per consecutive pair."""
    out: dict[str, list[tuple[float, float]]] = {}
    for before, after in itertools.pairwise(runs):
        old, new = _variants(before), _variants(after)
        for label in old.keys() & new.keys():
            texts = {r.prompt_id: r.output_text for r in old[label].requests}
            same = [texts.get(r.prompt_id) == r.output_text for r in new[label].requests]
            a = old[label].counters.mean_acceptance_length or 0.0
            b = new[label].counters.mean_acceptance_length or 0.0
            out.setdefault(label, []).append((1 - sum(same) / len(same), abs(b - a) / a))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", type=Path, default=REPO / "jobs" / "noise-calibration.yaml")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--jitter", default=None)
    ap.add_argument("--shift", default=None)
    ap.add_argument("--model", action="append", default=[], help="keep only this model")
    ap.add_argument("--canary", action="append", default=[], help="one more run with it")
    ap.add_argument("--db", default=None, help="store URL (default: a fresh SQLite file)")
    ap.add_argument("--export-dir", type=Path, default=None)
    args = ap.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="noise-strength-"))
    clean = _job_with_strengths(args.job, args.jitter, args.shift, folder, args.model)
    jobs = [(clean, "clean")] * args.runs + [
        (_job_with_strengths(args.job, args.jitter, args.shift, folder, args.model, c), c)
        for c in args.canary
    ]
    db = args.db or f"sqlite:///{folder / 'farm.db'}"
    print(f"jitter {args.jitter or 'default'}, shift {args.shift or 'default'}; store {db}")
    ids = []
    for i, (job, what) in enumerate(jobs):
        t0 = time.monotonic()
        farm_cli("run", str(job), "--db", db, ok=(0, 1))  # 1: still measured
        with store.Session(store.open_store(db)) as session:
            ids.append(store.latest_sweep_id(session) or 0)
        print(f"run {i + 1} ({what}): sweep {ids[-1]}  {time.monotonic() - t0:5.0f} s", flush=True)
        if args.export_dir:
            args.export_dir.mkdir(parents=True, exist_ok=True)
            target = args.export_dir / f"night-{i + 1:02d}.json"
            farm_cli("export", str(ids[-1]), "--out", str(target), "--db", db)
    with store.Session(store.open_store(db)) as session:
        runs = [store.load_sweep(session, i) for i in ids[: args.runs]]
    changes = _pair_changes(runs)
    rows = noise_table(runs)
    print()
    for row in rows:
        pairs = changes.get(row.key.label, [])
        flips = [f for f, _ in pairs] or [0.0]
        shifts = [d for _, d in pairs] or [0.0]
        print(row.key.label)
        print(
            f"  AL {row.al_mean:.2f}  sd {row.al_relative_sd:.1%}  outputs changed "
            f"{statistics.median(flips):.0%} ({min(flips):.0%}-{max(flips):.0%})  "
            f"|dAL|/AL {statistics.median(shifts):.1%} (max {max(shifts):.1%})"
        )
    print("outputs changed and |dAL|/AL: median (range) over consecutive pairs of runs")


if __name__ == "__main__":
    main()

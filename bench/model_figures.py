"""How the embedded model drafts: the figures its targets (models/README.md) are set on.

    python bench/model_figures.py SWEEP.json [SWEEP.json ...]   # `farm export` files
    python bench/model_figures.py --db URL --sweep ID

Per variant of every spec-on cell: AL with its request-level bootstrap interval, the
per-position acceptance, the standard deviation of AL across prompts (each prompt's
own 1 + accepted / drafts), accuracy and greedy agreement with the spec-off cell.
Real MTP drafts unevenly: vllm-ascend's GLM-5.2 MTP nightly baseline is [0.86, 0.63,
0.42] per position, vLLM's Qwen3-8B acceptance test [0.654, 0.399, 0.202]; a model
whose drafter is almost never wrong (AL spread ~0.02) leaves every statistic of the
farm untested where it matters.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from farm import store
from farm.analysis.stats import AcceptanceSample, acceptance_stats
from farm.analysis.summary import summarize_sweep
from farm.records import SweepRecord
from farm.store.export import read_sweep_export


def _sweeps(args: argparse.Namespace) -> list[SweepRecord]:
    if args.db:
        with store.Session(store.open_store(args.db)) as session:
            return [store.load_sweep(session, args.sweep)]
    return [read_sweep_export(Path(p)) for p in args.exports]


def _per_prompt_al(sample: AcceptanceSample) -> list[float]:
    return [1.0 + a / d for a, d in zip(sample.accepted, sample.drafts, strict=True) if d > 0]


def print_figures(sweep: SweepRecord) -> None:
    """Two lines per spec-on variant (its name, then its figures): 80 columns wide."""
    rows = summarize_sweep(sweep)
    print(f"sweep {sweep.sweep_id} ({sweep.job})")
    print("cell [variant]\n  AL [interval] | per position | AL sd | accuracy | greedy")
    for stored in sweep.cells:
        result = stored.result
        if result is None or stored.cell.mtp_depth == 0:
            continue
        for variant in result.variants:
            sample = AcceptanceSample.from_requests(variant.requests)
            stats = acceptance_stats(sample, rng=0)
            al = stats.mean_acceptance_length
            if al is None:
                continue
            spread = statistics.pstdev(_per_prompt_al(sample))
            label = ".".join(f"{k}-{v}" for k, v in sorted(variant.axes.items()))
            row = next(
                (
                    r
                    for r in rows
                    if r.cell_id == stored.cell.cell_id
                    and all(r.axes.get(k) == v for k, v in variant.axes.items())
                ),
                None,
            )
            acc = "-" if row is None or row.accuracy is None else f"{row.accuracy:.2f}"
            greedy = (
                "-"
                if row is None or row.greedy_compared is None
                else f"{row.greedy_same}/{row.greedy_compared}"
            )
            pos = " ".join(f"{p.estimate:.2f}" for p in stats.per_position)
            print(f"{stored.cell.cell_id} [{label}]")
            print(
                f"  AL {al.estimate:.2f} [{al.low:.2f}, {al.high:.2f}] | {pos} "
                f"| sd {spread:.2f} | acc {acc} | {greedy}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exports", nargs="*", help="farm export JSON files")
    ap.add_argument("--db", help="store URL (with --sweep)")
    ap.add_argument("--sweep", type=int, help="sweep id in --db")
    args = ap.parse_args()
    if not args.exports and not (args.db and args.sweep):
        ap.error("give export files, or --db and --sweep")
    for sweep in _sweeps(args):
        print_figures(sweep)


if __name__ == "__main__":
    main()

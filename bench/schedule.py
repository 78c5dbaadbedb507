"""Scheduling quality: makespan of a night's matrix over the lower bound no schedule can beat.

    python bench/schedule.py [--cells 500] [--seconds 90] [--no-ray] [--seed 0]

A synthetic night: 16 nodes x 8 NPUs and 500 cells of mixed sizes (1/2/4/8 NPUs with
weights 40/30/20/10 %) whose durations are skewed (log-normal, median 10 min, sigma
0.75). The scheduler only knows estimates (the "history"), each off by a log-normal
factor (sigma 0.2), while cells run for their true duration. Reported for the farm's
policy (longest first, best fit, ``farm.orchestrate.schedule``) and a baseline (the same
dispatcher taking cells in random order):

    ratio = makespan / lower bound,  lower bound = max(longest cell, NPU-seconds / NPUs)

twice: as a discrete-event simulation, and for real through Ray (a local
``ray.cluster_utils.Cluster`` of 16 logical nodes with {"NPU": 8} each, cells run by
the FAKE runner, which sleeps; durations scaled so the LPT schedule takes about
``--seconds``). Target: ratio <= 1.1 for the farm's policy.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from farm.orchestrate.schedule import Job, Order, lower_bound, simulate
from farm.plan import ServerCell, Variant
from farm.records import BuildInfo
from farm.spec import EngineSpec, ModelSpec, ResourceSpec, TimeoutSpec

NODES = 16
NPUS_PER_NODE = 8
SIZES = (1, 2, 4, 8)
SIZE_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
MEDIAN_S = 600.0
SIGMA = 0.75
ESTIMATE_SIGMA = 0.2


@dataclass(frozen=True)
class Night:
    jobs: list[Job]  # with estimates
    true_s: dict[str, float]
    capacity: dict[str, dict[str, float]]


def make_night(cells: int, seed: int) -> Night:
    rng = random.Random(seed)
    jobs, true = [], {}
    for i in range(cells):
        npus = rng.choices(SIZES, SIZE_WEIGHTS)[0]
        seconds = MEDIAN_S * rng.lognormvariate(0, SIGMA)
        key = f"cell{i:03d}"
        estimate = seconds * rng.lognormvariate(0, ESTIMATE_SIGMA)
        jobs.append(Job(key=key, need={"CPU": 0.01, "NPU": float(npus)}, estimate_s=estimate))
        true[key] = seconds
    capacity = {f"node{n:02d}": {"CPU": 1.0, "NPU": float(NPUS_PER_NODE)} for n in range(NODES)}
    return Night(jobs=jobs, true_s=true, capacity=capacity)


@dataclass(frozen=True)
class RayRun:
    makespan_s: float
    start_delay_s: list[float]  # driver sends the cell -> the worker starts it
    report_delay_s: list[float]  # the worker finishes it -> the driver has the result


def run_on_ray(night: Night, order: Order, scale: float, shuffled: list[Job]) -> RayRun:
    """The night's cells run through Ray by ``RayPool`` (fake runner), with latencies."""
    from farm.orchestrate.placement import Placement
    from farm.orchestrate.ray_pool import RayPool
    from farm.runner import CellTask
    from tests.fakes.cell_runner import fake_run_cell

    jobs = shuffled if order == "given" else night.jobs
    tasks = []
    for job in jobs:
        engine = EngineSpec(
            name=job.key,
            family="vllm",
            package="fake",
            version="0",
            env={"FAKE_CELL_SECONDS": f"{night.true_s[job.key] * scale:.3f}"},
        )
        cell = ServerCell(
            engine=job.key,
            family="vllm",
            model="m",
            graph_mode="eager",
            planned_graph_mode="eager",
            mtp_depth=0,
            sliding_window="on",
            variants=(Variant(thinking="off", workload="w"),),
            fingerprint="bench",
        )
        build = BuildInfo(
            build_id="fake",
            engine=job.key,
            family="vllm",
            package="fake",
            version="0",
            python="python",
            env_dir="/nonexistent",
        )
        task = CellTask(
            cell=cell,
            engine=engine,
            model=ModelSpec(name="m", path="m"),
            model_path="m",
            workloads=(),
            build=build,
            timeouts=TimeoutSpec(),
            log_dir="/tmp",
        )
        # NPUs bind; a token CPU share keeps each logical node at one CPU, which caps
        # Ray's worker start-ups at one per node (a 2-core host cannot fork 128 at once).
        placement = Placement(ResourceSpec(cpus=0.01, npus=int(job.npus), node_retries=0))
        tasks.append((task, placement))
    # Keyed as RayPool looks them up: by cell id, not by the night's job key.
    estimates = {t.cell.cell_id: j.estimate_s for (t, _), j in zip(tasks, jobs, strict=True)}
    sent: dict[str, datetime] = {}
    start_delay, report_delay = [], []
    with RayPool() as pool:
        t0 = time.monotonic()
        for result in pool.run(
            tasks,
            runner=fake_run_cell,
            estimates=estimates,
            order=order,
            on_start=lambda key, node: sent.__setitem__(key, datetime.now(UTC)),
        ):
            if result.status != "ok":
                raise SystemExit(f"cell {result.cell_id} failed on Ray: {result.error}")
            start_delay.append((result.started_at - sent[result.cell_id]).total_seconds())
            report_delay.append((datetime.now(UTC) - result.finished_at).total_seconds())
        makespan = time.monotonic() - t0
    return RayRun(makespan, start_delay, report_delay)


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def _warm_up(per_node: int) -> None:
    """Start ``per_node`` worker processes on every node, so the timed runs measure
    scheduling rather than Python start-ups (Ray keeps idle workers per node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0.01, resources={"NPU": 1})
    def ready() -> None:
        import tests.fakes.cell_runner  # noqa: F401 - the import the cells pay once

        time.sleep(3)

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("NPU")]
    ray.get(
        [
            ready.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)
            ).remote()
            for n in nodes
            for _ in range(per_node)
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=90.0, help="LPT makespan on Ray")
    parser.add_argument(
        "--warm-workers", type=int, default=NPUS_PER_NODE, help="Ray workers pre-started per node"
    )
    parser.add_argument("--no-ray", action="store_true", help="simulation only")
    args = parser.parse_args()

    night = make_night(args.cells, args.seed)
    shuffled = random.Random(args.seed + 1).sample(night.jobs, len(night.jobs))
    bound = lower_bound(night.capacity, night.jobs, night.true_s)
    longest = max(night.true_s.values())
    work = sum(j.npus * night.true_s[j.key] for j in night.jobs) / (NODES * NPUS_PER_NODE)
    print(
        f"{args.cells} cells on {NODES} nodes x {NPUS_PER_NODE} NPUs; lower bound "
        f"{bound / 3600:.2f} h (longest cell {longest / 3600:.2f} h, "
        f"NPU-seconds / NPUs {work / 3600:.2f} h)"
    )
    lpt = simulate(night.capacity, night.jobs, night.true_s, order="lpt")
    fifo = simulate(night.capacity, shuffled, night.true_s, order="given")
    print("simulation (discrete-event, same dispatcher):")
    print(f"  longest first:  makespan {lpt.makespan_s / 3600:6.2f} h  ratio {lpt.ratio:.3f}")
    print(f"  random order:   makespan {fifo.makespan_s / 3600:6.2f} h  ratio {fifo.ratio:.3f}")
    if args.no_ray:
        return

    import ray
    from ray.cluster_utils import Cluster

    scale = args.seconds / bound
    print(f"Ray (16 logical nodes, FAKE runner sleeping true duration x {scale:.5f}):")
    t0 = time.monotonic()
    # Each node: 1 CPU (one worker start-up at a time) but 8 workers kept once warm;
    # by default Ray kills idle workers beyond the node's CPU count within a second.
    system = {"num_workers_soft_limit": NPUS_PER_NODE, "worker_maximum_startup_concurrency": 1}
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": system}
    )
    try:
        for _ in range(NODES):
            cluster.add_node(num_cpus=1, resources={"NPU": NPUS_PER_NODE})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        _warm_up(args.warm_workers)
        print(f"  cluster up and workers warm in {time.monotonic() - t0:.0f} s")
        for name, order, sim in (("longest first", "lpt", lpt), ("random order", "given", fifo)):
            run = run_on_ray(night, order, scale, shuffled)  # type: ignore[arg-type]
            ratio = run.makespan_s / (bound * scale)
            print(
                f"  {name + ':':15} makespan {run.makespan_s:6.1f} s  ratio {ratio:.3f}  "
                f"(simulated {sim.makespan_s * scale:6.1f} s; Ray overhead "
                f"{run.makespan_s / (sim.makespan_s * scale) - 1:+.1%}; per cell: "
                f"send->start median {statistics.median(run.start_delay_s):.2f} s, "
                f"p90 {_p90(run.start_delay_s):.2f} s; end->driver median "
                f"{statistics.median(run.report_delay_s):.2f} s, "
                f"p90 {_p90(run.report_delay_s):.2f} s)"
            )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()

"""Longest-first scheduling of cells on nodes. Pure: no I/O, no Ray.

The farm orders a night's cells by their expected duration, longest first (LPT,
Graham 1969: list scheduling in decreasing processing time is within 4/3 of the
optimal makespan on identical machines), and dispatches them itself instead of
handing Ray the whole list: Ray's queues are per resource shape and would let a
stream of 1-NPU cells take every freed NPU while an 8-NPU cell waits for a whole
node. The dispatcher is list scheduling with backfilling: whenever resources free
up, it starts, in LPT order, every cell that fits on an eligible node, on the node
where it fits most tightly (best fit), so that whole nodes stay free for big cells.

``simulate`` runs the same dispatcher on a discrete-event clock; ``bench/schedule.py``
compares it with the same policy run through Ray.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from farm.frozen import Frozen
from farm.plan import ServerCell
from farm.spec import WorkloadSpec

__all__ = [
    "DEFAULT_STARTUP_S",
    "DEFAULT_S_PER_DECODE_STEP",
    "Dispatcher",
    "Job",
    "SimResult",
    "Start",
    "default_estimate_s",
    "estimate_cells",
    "lower_bound",
    "lpt_order",
    "simulate",
]

# Without history a cell is estimated as engine start-up plus its decode steps. Only
# the order matters, so these are coarse: start-up measured at 45-100 s for vLLM CPU
# on 2 cores (README), a decode step of ~20 ms for the tiny model at concurrency 4.
DEFAULT_STARTUP_S = 75.0
DEFAULT_S_PER_DECODE_STEP = 0.02

Order = Literal["lpt", "given"]


class Job(Frozen):
    """One cell as the scheduler sees it: what it holds, how long it should take, where."""

    key: str
    need: dict[str, float]
    estimate_s: float
    nodes: frozenset[str] | None = None  # eligible nodes; None: any node with the resources

    @property
    def npus(self) -> float:
        return self.need.get("NPU", 0.0)


class Start(Frozen):
    """A decision of the dispatcher: start ``key`` on ``node`` now."""

    key: str
    node: str


class SimResult(Frozen):
    """A simulated schedule: its makespan and the lower bound no schedule can beat."""

    makespan_s: float
    lower_bound_s: float
    starts: dict[str, float]
    nodes: dict[str, str]

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.lower_bound_s if self.lower_bound_s else 1.0


def default_estimate_s(cell: ServerCell, workloads: Sequence[WorkloadSpec]) -> float:
    """Seconds a cell with no history should take: start-up plus its decode steps.

    Each variant sends ``count`` prompts ``concurrency`` at a time, each of at most
    ``max_tokens`` tokens, so it needs about ceil(count / concurrency) * max_tokens
    decode steps.
    """
    by_name = {w.name: w for w in workloads}
    total = DEFAULT_STARTUP_S
    for variant in cell.variants:
        w = by_name.get(variant.workload)
        if w is not None:
            total += math.ceil(w.count / w.concurrency) * w.max_tokens * DEFAULT_S_PER_DECODE_STEP
    return total


def estimate_cells(
    cells: Iterable[ServerCell], workloads: Sequence[WorkloadSpec], history: Mapping[str, float]
) -> dict[str, float]:
    """Expected seconds per cell id: its historical median when ``history`` has one."""
    return {
        c.cell_id: history[c.cell_id] if c.cell_id in history else default_estimate_s(c, workloads)
        for c in cells
    }


def lpt_order(jobs: Iterable[Job]) -> list[Job]:
    """Longest estimate first; among equals the one holding more NPUs, then by key."""
    return sorted(jobs, key=lambda j: (-j.estimate_s, -j.npus, j.key))


def _fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(free.get(k, 0.0) >= v - 1e-9 for k, v in need.items() if v)


class Dispatcher:
    """List scheduling with backfilling over nodes of known capacity.

    ``capacity`` maps node id to its resources (``{"CPU": 8, "NPU": 8}``). The
    dispatcher assumes it owns those resources: a cell it starts holds them until
    ``finish`` is called for it.
    """

    def __init__(
        self,
        capacity: Mapping[str, Mapping[str, float]],
        jobs: Iterable[Job],
        order: Order = "lpt",
    ) -> None:
        self._capacity = {n: dict(r) for n, r in capacity.items()}
        self._free = {n: dict(r) for n, r in capacity.items()}
        self._pending = lpt_order(jobs) if order == "lpt" else list(jobs)
        self._running: dict[str, tuple[str, dict[str, float]]] = {}

    @property
    def pending(self) -> tuple[Job, ...]:
        return tuple(self._pending)

    @property
    def running(self) -> dict[str, str]:
        """Key -> node of every started, unfinished job."""
        return {k: node for k, (node, _) in self._running.items()}

    def starts(self) -> list[Start]:
        """Start every pending job that fits now, in order; return where each goes."""
        out: list[Start] = []
        left: list[Job] = []
        # A shape that found no node stays unplaceable for the rest of this scan
        # (nothing is freed during it): skip its twins without looking at every node.
        refused: set[tuple[tuple[tuple[str, float], ...], frozenset[str] | None]] = set()
        for job in self._pending:
            shape = (tuple(sorted(job.need.items())), job.nodes)
            node = None if shape in refused else self._best_node(job)
            if node is None:
                refused.add(shape)
                left.append(job)
                continue
            free = self._free[node]
            for k, v in job.need.items():
                free[k] = free.get(k, 0.0) - v
            self._running[job.key] = (node, job.need)
            out.append(Start(key=job.key, node=node))
        self._pending = left
        return out

    def finish(self, key: str) -> None:
        """Give back what ``key`` held; unknown keys (or lost nodes) are ignored."""
        node, need = self._running.pop(key, ("", {}))
        if node in self._free:
            for k, v in need.items():
                self._free[node][k] = self._free[node].get(k, 0.0) + v

    def lose_node(self, node: str) -> list[str]:
        """Forget a dead node; return the keys that were running there."""
        self._capacity.pop(node, None)
        self._free.pop(node, None)
        return [k for k, (n, _) in self._running.items() if n == node]

    def never_fits(self) -> list[Job]:
        """Pending jobs that no remaining node could hold even when idle."""
        return [j for j in self._pending if not any(self._eligible(j, self._capacity))]

    def drop(self, key: str) -> None:
        self._pending = [j for j in self._pending if j.key != key]

    def allow(self, keys: Iterable[str], node: str) -> None:
        """Let the pending jobs ``keys`` run on ``node`` as well (for example: their
        build has just become ready there). Jobs that may use any node are unchanged."""
        keys = set(keys)
        self._pending = [
            j.model_copy(update={"nodes": j.nodes | {node}})
            if j.key in keys and j.nodes is not None
            else j
            for j in self._pending
        ]

    def _eligible(self, job: Job, pool: Mapping[str, Mapping[str, float]]) -> Iterable[str]:
        return (
            n
            for n, have in pool.items()
            if (job.nodes is None or n in job.nodes) and _fits(job.need, have)
        )

    def _best_node(self, job: Job) -> str | None:
        # Best fit: the node left with the fewest free NPUs (then CPUs), so that a
        # node with all its NPUs free is the last one a small cell breaks into.
        best: tuple[float, float, str] | None = None
        for n in self._eligible(job, self._free):
            free = self._free[n]
            score = (
                free.get("NPU", 0.0) - job.need.get("NPU", 0.0),
                free.get("CPU", 0.0) - job.need.get("CPU", 0.0),
                n,
            )
            if best is None or score < best:
                best = score
        return best[2] if best else None


def lower_bound(
    capacity: Mapping[str, Mapping[str, float]], jobs: Iterable[Job], durations: Mapping[str, float]
) -> float:
    """No schedule finishes before max(longest job, work / capacity of each resource).

    Work is resource-seconds (NPU-seconds for NPUs), so a cell holding 8 NPUs for
    an hour counts as 8 NPU-hours against the cluster's NPUs.
    """
    jobs = list(jobs)
    bound = max((durations[j.key] for j in jobs), default=0.0)
    totals: dict[str, float] = {}
    for have in capacity.values():
        for k, v in have.items():
            totals[k] = totals.get(k, 0.0) + v
    for resource, total in totals.items():
        work = sum(j.need.get(resource, 0.0) * durations[j.key] for j in jobs)
        if total > 0:
            bound = max(bound, work / total)
    return bound


def simulate(
    capacity: Mapping[str, Mapping[str, float]],
    jobs: Sequence[Job],
    durations: Mapping[str, float] | None = None,
    order: Order = "lpt",
) -> SimResult:
    """Run the dispatcher on a discrete-event clock.

    ``durations`` are the true run times (default: the estimates), so estimate
    errors can be simulated. Raises ValueError when a job fits no node.
    """
    true = dict(durations) if durations is not None else {j.key: j.estimate_s for j in jobs}
    dispatcher = Dispatcher(capacity, jobs, order)
    stuck = dispatcher.never_fits()
    if stuck:
        raise ValueError(f"job {stuck[0].key} needs {stuck[0].need}: no node can hold it")
    now = 0.0
    events: list[tuple[float, str]] = []
    starts: dict[str, float] = {}
    nodes: dict[str, str] = {}
    while True:
        for start in dispatcher.starts():
            starts[start.key] = now
            nodes[start.key] = start.node
            heapq.heappush(events, (now + true[start.key], start.key))
        if not events:
            break
        now, key = heapq.heappop(events)
        dispatcher.finish(key)
        # Everything finishing at the same instant frees its resources together.
        while events and events[0][0] == now:
            dispatcher.finish(heapq.heappop(events)[1])
    return SimResult(
        makespan_s=now,
        lower_bound_s=lower_bound(capacity, jobs, true),
        starts=starts,
        nodes=nodes,
    )

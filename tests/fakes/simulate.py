"""Synthetic requests and sweeps with known acceptance, for tests and the detection bench
(a test double: it lives beside the tests, not in the farm package).

The generative model mimics what the engines count. Each prompt has an acceptance
probability ``p`` drawn from a Beta distribution (prompts differ: code and arithmetic
are easy to draft, free text is hard); a request runs about ``verify_steps`` verify
steps; at each step the draft positions are accepted left to right, each with
probability ``p``, until the first rejection. So position ``i`` (0-based) is accepted
with probability ``p**(i + 1)`` whatever the MTP depth, and

    AL = 1 + sum_{i=1..depth} E[p**i]

for a request-weighted population. With ``mean=0.8, concentration=8`` and depth 3,
AL is about 2.9; 40 steps per request gives the request-level spread seen on real
runs (AL 2.5-3.9 at depth 3). Same prompt ids across cells share ``p``, which is what
makes paired comparisons informative.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from farm.analysis.stats import AcceptanceSample
from farm.axes import AxisValue
from farm.plan import ServerCell, Variant
from farm.records import (
    CellResult,
    RequestRecord,
    SpecCounters,
    StoredCell,
    SweepRecord,
    VariantResult,
    summed_counters,
)

__all__ = [
    "CellEffect",
    "expected_al",
    "prompt_acceptance",
    "simulate_counters",
    "simulate_requests",
    "simulate_sample",
    "simulate_sweep",
]

FloatArray = npt.NDArray[np.float64]
# (cell, variant) -> multiplier on every prompt's acceptance probability, or a
# divergence rate; 1.0 / 0.0 means "as the reference".
CellEffect = Callable[[ServerCell, Variant], float]
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def prompt_acceptance(
    n: int, *, mean: float, concentration: float, rng: np.random.Generator
) -> FloatArray:
    """``n`` per-prompt acceptance probabilities from Beta(mean*c, (1-mean)*c)."""
    return rng.beta(mean * concentration, (1.0 - mean) * concentration, size=n)


def expected_al(mean: float, concentration: float, depth: int, factor: float = 1.0) -> float:
    """Population AL of the model above: 1 + sum_i E[(factor*p)**i], p ~ Beta.

    Uses the Beta raw moments E[p^k] = prod_{j<k} (a+j)/(a+b+j).
    """
    a, b = mean * concentration, (1.0 - mean) * concentration
    total, moment = 1.0, 1.0
    for k in range(depth):
        moment *= (a + k) / (a + b + k)
        total += factor ** (k + 1) * moment
    return total


def factor_for_drop(mean: float, concentration: float, depth: int, drop: float) -> float:
    """The multiplier on p that lowers the population AL by ``drop`` (bisection)."""
    target = expected_al(mean, concentration, depth) * (1 - drop)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        below = expected_al(mean, concentration, depth, mid) < target
        lo, hi = (mid, hi) if below else (lo, mid)
    return (lo + hi) / 2


def _simulate_arrays(
    p: FloatArray, depth: int, verify_steps: float, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray]:
    """Verify steps per request and the (request x position) accepted counts.

    The accepted length K of one step has P(K=k) = p^k (1-p) for k < depth and
    p^depth for k = depth; position i is accepted when K > i.
    """
    steps = np.maximum(rng.poisson(verify_steps, size=len(p)), 1)
    powers = p[:, None] ** np.arange(depth + 1)[None, :]
    probs = powers.copy()
    probs[:, :-1] *= 1.0 - p[:, None]
    lengths = rng.multinomial(steps, probs / probs.sum(axis=1, keepdims=True))
    per_pos = np.cumsum(lengths[:, ::-1], axis=1)[:, ::-1][:, 1:]
    return steps.astype(np.float64), per_pos.astype(np.float64)


def simulate_sample(
    p: FloatArray,
    *,
    depth: int,
    rng: np.random.Generator,
    verify_steps: float = 40.0,
    prefix: str = "p",
) -> AcceptanceSample:
    """Like :func:`simulate_counters` but straight into an :class:`AcceptanceSample`."""
    steps, per_pos = _simulate_arrays(p, depth, verify_steps, rng)
    return AcceptanceSample(
        prompt_ids=tuple(f"{prefix}{k}" for k in range(len(p))),
        drafts=steps,
        draft_tokens=steps * depth,
        accepted=per_pos.sum(axis=1),
        per_pos=per_pos,
    )


def simulate_counters(
    p: FloatArray, *, depth: int, verify_steps: float, rng: np.random.Generator
) -> tuple[SpecCounters, ...]:
    """Per-request counters for acceptance probabilities ``p`` (one request each).

    The number of verify steps per request is Poisson(``verify_steps``), at least 1.
    Depth 0 gives empty counters (speculation off).
    """
    if depth == 0:
        return tuple(SpecCounters() for _ in p)
    steps, per_pos = _simulate_arrays(p, depth, verify_steps, rng)
    return tuple(
        SpecCounters(
            drafts=int(n),
            draft_tokens=int(n) * depth,
            accepted=int(row.sum()),
            accepted_per_pos=tuple(int(x) for x in row),
        )
        for n, row in zip(steps, per_pos, strict=True)
    )


def simulate_requests(
    p: FloatArray,
    *,
    depth: int,
    rng: np.random.Generator,
    verify_steps: float = 40.0,
    correct: Sequence[bool] | None = None,
    divergence: float = 0.0,
    prefix: str = "p",
) -> tuple[RequestRecord, ...]:
    """Requests ``{prefix}0..`` with simulated counters and greedy outputs.

    The reference output of prompt ``k`` is ``"out-k"``; with probability
    ``divergence`` a request's output differs and its correctness is redrawn as a coin
    flip (a diverged answer is as likely wrong as right).
    """
    counters = simulate_counters(p, depth=depth, verify_steps=verify_steps, rng=rng)
    diverged = rng.random(len(p)) < divergence
    flips = rng.random(len(p)) < 0.5
    requests = []
    for k, c in enumerate(counters):
        ok = None if correct is None else bool(correct[k])
        if diverged[k] and ok is not None:
            ok = bool(flips[k])
        requests.append(
            RequestRecord(
                prompt_id=f"{prefix}{k}",
                output_text=f"out-{k}" + ("-diverged" if diverged[k] else ""),
                completion_tokens=max(c.drafts, 1) * 3,
                finish_reason="length",
                latency_s=1.0,
                correct=ok,
                counters=c if depth > 0 else None,
            )
        )
    return tuple(requests)


def simulate_sweep(
    *,
    rng: np.random.Generator,
    engines: Sequence[str] = ("base",),
    graph_modes: Sequence[str] = ("eager", "piecewise", "full_decode_only"),
    depths: Sequence[int] = (0, 1, 2, 3),
    sliding_windows: Sequence[str] = ("on", "off"),
    thinking: Sequence[str] = ("on", "off"),
    prompts: int = 200,
    mean: float = 0.8,
    concentration: float = 8.0,
    verify_steps: float = 40.0,
    accuracy: float = 0.8,
    effect: CellEffect | None = None,
    divergence: CellEffect | None = None,
    sweep_id: int = 1,
    acceptance: FloatArray | None = None,
) -> SweepRecord:
    """A complete synthetic sweep over the grid, one workload ``"synthetic"``.

    ``effect`` scales acceptance probabilities per (cell, variant) (e.g. 0.9 for a
    regressed cell); ``divergence`` gives the share of prompts whose greedy output
    differs from the spec-off output. Prompts and their difficulty are shared by all
    cells, as in a real sweep; ``acceptance`` gives them (another night of the same
    prompts) instead of drawing them.
    """
    p = (
        prompt_acceptance(prompts, mean=mean, concentration=concentration, rng=rng)
        if acceptance is None
        else acceptance
    )
    correct = rng.random(prompts) < accuracy
    cells = []
    for engine in engines:
        for graph in graph_modes:
            for depth in depths:
                for swa in sliding_windows:
                    variants = tuple(
                        Variant(axes={"thinking": t, "workload": "synthetic"}) for t in thinking
                    )
                    axes: dict[str, AxisValue] = {
                        "engine": engine,
                        "model": "synthetic",
                        "graph_mode": graph,
                        "mtp_depth": depth,
                        "sliding_window": swa,
                    }
                    cell = ServerCell(
                        family="vllm", axes=axes, planned_graph_mode=graph, variants=variants
                    )
                    results = []
                    for v in variants:
                        factor = effect(cell, v) if effect and depth else 1.0
                        div = divergence(cell, v) if divergence and depth else 0.0
                        requests = simulate_requests(
                            np.clip(p * factor, 0.0, 1.0),
                            depth=depth,
                            rng=rng,
                            verify_steps=verify_steps,
                            correct=list(correct),
                            divergence=div,
                        )
                        results.append(_variant(v, requests))
                    cells.append(
                        StoredCell(
                            cell=cell,
                            result=CellResult(
                                cell_id=cell.cell_id,
                                status="ok",
                                started_at=_EPOCH,
                                finished_at=_EPOCH,
                                variants=tuple(results),
                            ),
                        )
                    )
    return SweepRecord(
        sweep_id=sweep_id,
        job="synthetic",
        started_at=_EPOCH,
        finished_at=_EPOCH,
        status="ok",
        cells=tuple(cells),
    )


def _variant(v: Variant, requests: Sequence[RequestRecord]) -> VariantResult:
    return VariantResult(
        axes=v.axes,
        counters=summed_counters([r.counters for r in requests if r.counters is not None]),
        requests=tuple(requests),
        elapsed_s=1.0,
        concurrency=4,
    )

"""Acceptance, accuracy and greedy-agreement statistics with request-level intervals.

The request (prompt) is the unit of independence, not the token: the draft tokens of
one request share a context, so their acceptances are correlated, and a pooled
two-proportion test over tokens understates the variance. Every
interval here therefore resamples whole requests: a cluster (request-level) bootstrap
with percentile intervals (Efron & Tibshirani 1993, ch. 13; Field & Welsh 2007 for
the cluster case). Ratio figures (acceptance rate, AL) are ratios of sums over the
resampled requests, the same estimator as the engines' own counters, not means of
per-request ratios, which would over-weight short requests.

Two variants that ran the same prompts are compared *paired*: one set of resampling
weights is drawn over prompt ids and applied to both sides, so the prompt-to-prompt
spread (easy vs hard prompts) cancels in the difference. Different prompt sets fall
back to independent (unpaired) resampling of each side.

Defaults: 2000 resamples keep the Monte-Carlo error of a 95% percentile bound near
0.5% of the interval width (Efron & Tibshirani suggest >= 1000 for percentile
intervals); proportions from plain counts use the Wilson score interval (Wilson 1927),
which keeps its coverage near 0 and 1 where the Wald interval collapses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from farm.frozen import Frozen
from farm.records import RequestRecord, SpecCounters, counted

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_RESAMPLES",
    "AcceptanceDifference",
    "AcceptanceSample",
    "AcceptanceStats",
    "BinarySample",
    "Interval",
    "Proportion",
    "ProportionDifference",
    "RngLike",
    "acceptance_stats",
    "accuracy",
    "compare_acceptance",
    "compare_proportions",
    "correctness_sample",
    "divergence_sample",
    "greedy_divergence",
    "wilson_interval",
]

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95
# Pair on the common prompts when at least this share of each side's prompts is shared:
# a few failed requests must not throw away the variance reduction of pairing.
_MIN_PAIR_FRACTION = 0.9

RngLike = np.random.Generator | int
FloatArray = npt.NDArray[np.float64]


class Interval(Frozen):
    """A point estimate with a two-sided confidence interval at ``level``."""

    estimate: float
    low: float
    high: float
    level: float

    def excludes(self, value: float = 0.0) -> bool:
        """True when ``value`` lies outside [low, high] (significant at 1 - level)."""
        return value < self.low or value > self.high

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


class Proportion(Frozen):
    """``successes`` out of ``n`` with a Wilson interval."""

    successes: int
    n: int
    interval: Interval


class AcceptanceStats(Frozen):
    """Acceptance figures of one variant, each with a request-level bootstrap interval."""

    requests: int
    drafts: int
    draft_tokens: int
    accepted: int
    acceptance_rate: Interval | None
    mean_acceptance_length: Interval | None
    per_position: tuple[Interval, ...]


class AcceptanceDifference(Frozen):
    """Candidate minus reference; ``relative`` is the AL difference over reference AL.

    ``per_position`` holds the differences for the positions both sides have; the
    per-side position rates (over the compared requests) come with their own intervals.
    """

    paired: bool
    pairs: int
    n_reference: int
    n_candidate: int
    reference_al: Interval
    candidate_al: Interval
    mean_acceptance_length: Interval
    relative: Interval
    per_position: tuple[Interval, ...]
    reference_per_position: tuple[Interval, ...]
    candidate_per_position: tuple[Interval, ...]


class ProportionDifference(Frozen):
    """Candidate minus reference share of successes (for example accuracy)."""

    paired: bool
    pairs: int
    reference: Proportion
    candidate: Proportion
    difference: Interval


@dataclass(frozen=True, eq=False)
class AcceptanceSample:
    """Per-request speculative counters of one variant, as arrays (one row a request).

    ``per_pos`` has one column per draft position; requests with fewer positions are
    zero-padded.
    """

    prompt_ids: tuple[str, ...]
    drafts: FloatArray
    draft_tokens: FloatArray
    accepted: FloatArray
    per_pos: FloatArray

    @classmethod
    def from_counters(
        cls, prompt_ids: Sequence[str], counters: Sequence[SpecCounters]
    ) -> AcceptanceSample:
        """Build a sample from parallel sequences of prompt ids and per-request counters."""
        if len(prompt_ids) != len(counters):
            raise ValueError("prompt_ids and counters differ in length")
        width = max((len(c.accepted_per_pos) for c in counters), default=0)
        per_pos = np.zeros((len(counters), width))
        for row, c in enumerate(counters):
            per_pos[row, : len(c.accepted_per_pos)] = c.accepted_per_pos
        return cls(
            prompt_ids=tuple(prompt_ids),
            drafts=np.array([c.drafts for c in counters], dtype=np.float64),
            draft_tokens=np.array([c.draft_tokens for c in counters], dtype=np.float64),
            accepted=np.array([c.accepted for c in counters], dtype=np.float64),
            per_pos=per_pos,
        )

    @classmethod
    def from_requests(cls, requests: Sequence[RequestRecord]) -> AcceptanceSample:
        """Requests that succeeded and carry counters; the others are left out."""
        kept = counted(requests)
        return cls.from_counters([p for p, _ in kept], [c for _, c in kept])

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def take(self, ids: Sequence[str]) -> AcceptanceSample:
        """The rows of ``ids``, in that order (each id must be present once)."""
        index = {p: i for i, p in enumerate(self.prompt_ids)}
        rows = np.array([index[p] for p in ids], dtype=np.intp)
        return AcceptanceSample(
            prompt_ids=tuple(ids),
            drafts=self.drafts[rows],
            draft_tokens=self.draft_tokens[rows],
            accepted=self.accepted[rows],
            per_pos=self.per_pos[rows],
        )


@dataclass(frozen=True, eq=False)
class BinarySample:
    """One yes/no outcome per prompt (correct, diverged, ...)."""

    prompt_ids: tuple[str, ...]
    outcomes: FloatArray

    def take(self, ids: Sequence[str]) -> BinarySample:
        index = {p: i for i, p in enumerate(self.prompt_ids)}
        rows = np.array([index[p] for p in ids], dtype=np.intp)
        return BinarySample(prompt_ids=tuple(ids), outcomes=self.outcomes[rows])


def _rng(rng: RngLike) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _weights(rng: np.random.Generator, n: int, resamples: int) -> FloatArray:
    """Bootstrap multiplicities: row b counts how often each request is drawn."""
    draws = rng.integers(0, n, size=(resamples, n))
    flat = (draws + (np.arange(resamples) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def _ratio(num: FloatArray, den: FloatArray) -> FloatArray:
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _interval(estimate: float, boot: FloatArray, level: float) -> Interval:
    alpha = 1.0 - level
    finite = boot[np.isfinite(boot)]
    if finite.size == 0:
        return Interval(estimate=estimate, low=float("nan"), high=float("nan"), level=level)
    low, high = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    return Interval(estimate=estimate, low=float(low), high=float(high), level=level)


def _check(level: float, resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")


def acceptance_stats(
    sample: AcceptanceSample,
    *,
    rng: RngLike,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
) -> AcceptanceStats:
    """Acceptance rate, AL = 1 + accepted/drafts and per-position rates of one variant.

    Intervals are request-level bootstrap percentile intervals. Figures whose
    denominator is zero (no drafts: speculation off, or no requests) are ``None``.
    """
    _check(level, resamples)
    drafts, tokens, accepted = (
        float(a.sum()) for a in (sample.drafts, sample.draft_tokens, sample.accepted)
    )
    base = AcceptanceStats(
        requests=len(sample),
        drafts=int(drafts),
        draft_tokens=int(tokens),
        accepted=int(accepted),
        acceptance_rate=None,
        mean_acceptance_length=None,
        per_position=(),
    )
    if drafts <= 0:
        return base
    boot = _weights(_rng(rng), len(sample), resamples) @ _columns(sample)
    b_drafts, b_tokens, b_acc, b_pos = boot[:, 0], boot[:, 1], boot[:, 2], boot[:, 3:]
    rate = None
    if tokens > 0:
        rate = _interval(accepted / tokens, _ratio(b_acc, b_tokens), level)
    al = _interval(1.0 + accepted / drafts, 1.0 + _ratio(b_acc, b_drafts), level)
    positions = tuple(
        _interval(float(sample.per_pos[:, i].sum()) / drafts, _ratio(b_pos[:, i], b_drafts), level)
        for i in range(sample.per_pos.shape[1])
    )
    return base.model_copy(
        update={"acceptance_rate": rate, "mean_acceptance_length": al, "per_position": positions}
    )


def _pairing(a: Sequence[str], b: Sequence[str], paired: bool | None) -> tuple[str, ...] | None:
    """The common prompt ids to pair on, or None for an unpaired comparison."""
    if paired is False or len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    common = sorted(set(a) & set(b))
    if not common:
        return None
    enough = len(common) >= _MIN_PAIR_FRACTION * max(len(a), len(b))
    if paired is None and not enough:
        return None
    return tuple(common)


def _columns(s: AcceptanceSample) -> FloatArray:
    """(request x [drafts, draft_tokens, accepted, per_pos...]): one matmul per bootstrap."""
    return np.column_stack([s.drafts, s.draft_tokens, s.accepted, s.per_pos])


def _al_parts(
    s: AcceptanceSample, w: FloatArray
) -> tuple[float, FloatArray, FloatArray, FloatArray]:
    """Point AL, bootstrap AL, point per-position rates, bootstrap per-position rates."""
    drafts = float(s.drafts.sum())
    point_al = 1.0 + float(s.accepted.sum()) / drafts
    boot = w @ _columns(s)
    boot_al = 1.0 + _ratio(boot[:, 2], boot[:, 0])
    point_pos = s.per_pos.sum(axis=0) / drafts
    boot_pos = _ratio(boot[:, 3:], boot[:, :1])
    return point_al, boot_al, point_pos, boot_pos


def compare_acceptance(
    reference: AcceptanceSample,
    candidate: AcceptanceSample,
    *,
    rng: RngLike,
    paired: bool | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
) -> AcceptanceDifference:
    """Bootstrap the difference candidate - reference in AL and per-position rates.

    ``paired=None`` pairs on the common prompt ids when ids are unique on both sides
    and at least 90% of each side's prompts are common, else resamples each side on
    its own; ``paired=True`` pairs on whatever ids are common (unpaired if none or
    ids repeat), ``paired=False`` never pairs. Per-position differences cover the
    positions both sides have. Raises ``ValueError`` when either side has no drafts.
    """
    _check(level, resamples)
    if reference.drafts.sum() <= 0 or candidate.drafts.sum() <= 0:
        raise ValueError("both samples need drafts (speculation on) to compare acceptance")
    gen = _rng(rng)
    common = _pairing(reference.prompt_ids, candidate.prompt_ids, paired)
    if common is not None:
        reference, candidate = reference.take(common), candidate.take(common)
        w_ref = w_cand = _weights(gen, len(common), resamples)
    else:
        w_ref = _weights(gen, len(reference), resamples)
        w_cand = _weights(gen, len(candidate), resamples)
    r_al, rb_al, r_pos, rb_pos = _al_parts(reference, w_ref)
    c_al, cb_al, c_pos, cb_pos = _al_parts(candidate, w_cand)
    k = min(len(r_pos), len(c_pos))
    return AcceptanceDifference(
        paired=common is not None,
        pairs=len(common) if common is not None else 0,
        n_reference=len(reference),
        n_candidate=len(candidate),
        reference_al=_interval(r_al, rb_al, level),
        candidate_al=_interval(c_al, cb_al, level),
        mean_acceptance_length=_interval(c_al - r_al, cb_al - rb_al, level),
        relative=_interval((c_al - r_al) / r_al, (cb_al - rb_al) / rb_al, level),
        per_position=tuple(
            _interval(float(c_pos[i] - r_pos[i]), cb_pos[:, i] - rb_pos[:, i], level)
            for i in range(k)
        ),
        reference_per_position=tuple(
            _interval(float(r_pos[i]), rb_pos[:, i], level) for i in range(len(r_pos))
        ),
        candidate_per_position=tuple(
            _interval(float(c_pos[i]), cb_pos[:, i], level) for i in range(len(c_pos))
        ),
    )


def wilson_interval(successes: int, n: int, level: float = DEFAULT_LEVEL) -> Interval:
    """Wilson score interval for a binomial proportion (Wilson 1927).

    Chosen over the Wald interval because accuracy and divergence rates sit near 0 or
    1, where Wald's interval shrinks to a point. ``n == 0`` gives the vacuous [0, 1].
    """
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n == 0:
        return Interval(estimate=float("nan"), low=0.0, high=1.0, level=level)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(
        estimate=p, low=max(0.0, centre - half), high=min(1.0, centre + half), level=level
    )


def _proportion(sample: BinarySample, level: float) -> Proportion:
    k = int(sample.outcomes.sum())
    return Proportion(
        successes=k,
        n=len(sample.prompt_ids),
        interval=wilson_interval(k, len(sample.prompt_ids), level),
    )


def correctness_sample(requests: Sequence[RequestRecord]) -> BinarySample:
    """Per-prompt correctness of the scored, successful requests."""
    scored = [r for r in requests if r.error is None and r.correct is not None]
    return BinarySample(
        prompt_ids=tuple(r.prompt_id for r in scored),
        outcomes=np.array([bool(r.correct) for r in scored], dtype=np.float64),
    )


def divergence_sample(
    candidate: Sequence[RequestRecord], baseline: Sequence[RequestRecord] | Mapping[str, str]
) -> BinarySample:
    """Per prompt, 1 when the candidate's greedy output differs from the baseline's.

    ``baseline`` is the spec-off run's requests (or prompt id -> output text). Only
    prompts that succeeded on both sides and whose text both sides kept (``farm db
    prune`` drops old text) count.
    """
    if isinstance(baseline, Mapping):
        base = dict(baseline)
    else:
        base = {
            r.prompt_id: r.output_text
            for r in baseline
            if r.error is None and r.output_text is not None
        }
    rows = [
        (r.prompt_id, r.output_text != base[r.prompt_id])
        for r in candidate
        if r.error is None and r.output_text is not None and r.prompt_id in base
    ]
    return BinarySample(
        prompt_ids=tuple(p for p, _ in rows),
        outcomes=np.array([d for _, d in rows], dtype=np.float64),
    )


def accuracy(requests: Sequence[RequestRecord], level: float = DEFAULT_LEVEL) -> Proportion | None:
    """Share of scored requests that are correct, with a Wilson interval; None if unscored."""
    sample = correctness_sample(requests)
    return _proportion(sample, level) if sample.prompt_ids else None


def greedy_divergence(
    candidate: Sequence[RequestRecord],
    baseline: Sequence[RequestRecord],
    level: float = DEFAULT_LEVEL,
) -> Proportion | None:
    """Share of common prompts whose output differs from the spec-off baseline (Wilson).

    Under greedy decoding speculation is lossless, so this should be ~0. None when the
    two runs share no successful prompt.
    """
    sample = divergence_sample(candidate, baseline)
    return _proportion(sample, level) if sample.prompt_ids else None


def compare_proportions(
    reference: BinarySample,
    candidate: BinarySample,
    *,
    rng: RngLike,
    paired: bool | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
) -> ProportionDifference:
    """Bootstrap the difference of two success shares, paired on prompt ids if possible.

    Same pairing rule as :func:`compare_acceptance`. The per-side proportions carry
    Wilson intervals; the difference a request-level bootstrap percentile interval.
    Raises ``ValueError`` when either side is empty.
    """
    _check(level, resamples)
    if not reference.prompt_ids or not candidate.prompt_ids:
        raise ValueError("both samples need at least one outcome")
    gen = _rng(rng)
    common = _pairing(reference.prompt_ids, candidate.prompt_ids, paired)
    if common is not None:
        reference, candidate = reference.take(common), candidate.take(common)
        w_ref = w_cand = _weights(gen, len(common), resamples)
    else:
        w_ref = _weights(gen, len(reference.prompt_ids), resamples)
        w_cand = _weights(gen, len(candidate.prompt_ids), resamples)
    r_boot = (w_ref @ reference.outcomes) / len(reference.prompt_ids)
    c_boot = (w_cand @ candidate.outcomes) / len(candidate.prompt_ids)
    ref, cand = _proportion(reference, level), _proportion(candidate, level)
    diff = cand.interval.estimate - ref.interval.estimate
    return ProportionDifference(
        paired=common is not None,
        pairs=len(common) if common is not None else 0,
        reference=ref,
        candidate=cand,
        difference=_interval(diff, c_boot - r_boot, level),
    )

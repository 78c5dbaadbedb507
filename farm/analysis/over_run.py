"""Acceptance over the course of one cell's run: a collapse its mean hides. Pure.

vllm-ascend #10495 (a hybrid's acceptance falls to 0 after a few rounds of 64k
inputs) and #13523 (a decode node's acceptance drifts to 0 over a run) both leave a
cell whose mean acceptance can still look acceptable: the early requests carry it.
This module looks inside one spec-on variant, two ways:

- **in the order served**: the variant's requests with counters, in the order the
  runner recorded them (prompt order; the runner sends prompts first come first served,
  ``concurrency`` at a time, and keeps a conversation's turns together), are split at
  the one point where acceptance falls most: a weighted CUSUM scan over the prefix
  sums of accepted tokens and drafts, ``(AL before k - AL after k) x sqrt(D_k (D - D_k)
  / D)`` over every split ``k`` with at least ``min_requests`` requests on each side
  (O(n): one cumulative sum, one vectorised scan);
- **by conversation round**, where the workload's prompts are conversations (request
  ids ``prompt``, ``prompt#2``, ``prompt#3``, ...): the last round that at least
  ``min_requests`` conversations reached against round 1, paired by conversation.

Either is a collapse (:class:`CollapseRule`) when the later part keeps at most half of
the earlier part's accepted tokens per draft (AL - 1) and its AL is at least 0.1 lower,
and the request-level bootstrap interval (``CheckConfig.level``, ``resamples``) of the
difference lies below 0: unpaired over the two sides of a split, paired over
conversations for rounds. The bootstrap runs only where the point estimate already
meets the rule, in chunks of at most ``_CHUNK_CELLS`` multiplicities: ``resamples`` x
requests in time, never requests squared. Each collapse is a ``collapse_over_run``
finding (source ``over_run``) naming the cell, where in the run it began and the AL
before and after, whatever the cell's mean did.

The rule's size (half the accepted tokens per draft) is that of the reports: a fall
toward 0, not a drift of a few per cent, which prompt order alone can cause (a prompt
set sorted by category moves acceptance by a fifth or more along the run).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from farm.analysis.check_rules import CheckConfig
from farm.analysis.stats import Interval
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.records import RequestRecord, SweepRecord, counted
from farm.results.alerts import AlertFigure, FigureInterval
from farm.results.verdict import Finding

__all__ = [
    "COLLAPSE_CHECK",
    "CollapseRule",
    "OverRunReport",
    "ProfileBin",
    "RoundAcceptance",
    "RunAcceptance",
    "RunSplit",
    "acceptance_over_run",
    "change_point",
    "check_over_run",
    "conversation_round",
    "round_profile",
    "run_profile",
]

COLLAPSE_CHECK: Final = "collapse_over_run"
# Bootstrap multiplicities held at once (resamples x requests): memory stays bounded on
# runs of many thousand requests, time stays resamples x requests.
_CHUNK_CELLS: Final = 1 << 21

FloatArray = npt.NDArray[np.float64]
SplitAxis = Literal["request", "round"]


class CollapseRule(Frozen):
    """When acceptance inside one run has collapsed.

    ``min_requests``: requests with counters on each side of a split (conversations in
    a round, for rounds); ``min_share_lost``: the share of the earlier part's accepted
    tokens per draft (AL - 1) the later part must have lost; ``min_al_drop``: and AL at
    least this much lower. The drop must also be significant (the difference's
    request-level bootstrap interval below 0).
    """

    min_requests: int = 20
    min_share_lost: float = 0.5
    min_al_drop: float = 0.1

    def meets(self, before_al: float, after_al: float) -> bool:
        """True when ``after_al`` is lower than ``before_al`` by the rule's size."""
        if before_al <= 1.0:
            return False
        lost = 1.0 - (after_al - 1.0) / (before_al - 1.0)
        return lost >= self.min_share_lost - 1e-12 and before_al - after_al >= self.min_al_drop

    def describe(self) -> str:
        return (
            f"the later part keeps at most {1 - self.min_share_lost:.0%} of the earlier "
            f"part's accepted tokens per draft, its AL at least {self.min_al_drop:g} lower, "
            "the difference significant"
        )


class RunSplit(Frozen):
    """The run before against after one point: requests in the order served
    (``axis="request"``: ``at`` is the 0-based index, among the requests with counters,
    of the first request after the split) or conversation rounds (``axis="round"``:
    round 1 against round ``at``, the last round enough conversations reached, with
    ``began``, the first round whose AL met the rule). ``difference``: after - before,
    bootstrapped only when the point estimate met the rule."""

    axis: SplitAxis
    at: int
    total: int
    before_n: int
    after_n: int
    before_al: float
    after_al: float
    difference: Interval | None = None
    began: int | None = None
    collapsed: bool = False


class RoundAcceptance(Frozen):
    """AL of one conversation round over the conversations that reached it."""

    round: int
    conversations: int
    al: float | None


class RunAcceptance(Frozen):
    """One variant's acceptance over its run: ``requests`` with counters, the AL of the
    whole run and of its first and last ``part`` requests (a third), the split where it
    fell most (None: too few requests, or it never fell), and by round."""

    requests: int
    al: float | None
    part: int
    first_al: float | None = None
    last_al: float | None = None
    change: RunSplit | None = None
    rounds: tuple[RoundAcceptance, ...] = ()
    round_change: RunSplit | None = None

    @property
    def collapses(self) -> tuple[RunSplit, ...]:
        return tuple(s for s in (self.change, self.round_change) if s is not None and s.collapsed)


class ProfileBin(Frozen):
    """AL over requests ``start`` .. ``end - 1`` (0-based, among those with counters)."""

    start: int
    end: int
    al: float | None


class OverRunReport(Frozen):
    """What :func:`check_over_run` found: ``findings``, ``notes``, ``checked`` ((check,
    variant key label) of each variant looked at), ``looked`` (how many)."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    checked: frozenset[tuple[str, str]] = frozenset()
    looked: int = 0


def conversation_round(prompt_id: str) -> tuple[str, int]:
    """(conversation, round) of a request id: ``q7#3`` is round 3 of ``q7`` (the id a
    conversation's later turns get, :meth:`farm.workload.formats.Prompt.conversation`);
    any other id is round 1 of itself."""
    head, sep, tail = prompt_id.rpartition("#")
    if sep and head and tail.isdigit() and int(tail) >= 2:
        return head, int(tail)
    return prompt_id, 1


def _arrays(requests: Sequence[RequestRecord]) -> tuple[list[str], FloatArray, FloatArray]:
    """Ids, accepted tokens and drafts of the requests with counters: one pass."""
    ids: list[str] = []
    acc: list[int] = []
    drafts: list[int] = []
    for prompt_id, c in counted(requests):
        ids.append(prompt_id)
        acc.append(c.accepted)
        drafts.append(c.drafts)
    return ids, np.asarray(acc, dtype=np.float64), np.asarray(drafts, dtype=np.float64)


def _al(acc: float, drafts: float) -> float | None:
    return 1.0 + acc / drafts if drafts > 0 else None


def change_point(accepted: FloatArray, drafts: FloatArray, min_size: int) -> int | None:
    """The split ``k`` (requests ``< k`` before, ``>= k`` after, each side at least
    ``min_size`` requests and some drafts) where AL falls most, weighted by the drafts
    on both sides; None when no split has a fall. O(n): prefix sums and one scan."""
    n = len(drafts)
    if min_size < 1 or n < 2 * min_size:
        return None
    a, d = np.cumsum(accepted), np.cumsum(drafts)
    total_a, total_d = a[-1], d[-1]
    ks = np.arange(min_size, n - min_size + 1)
    left_a, left_d = a[ks - 1], d[ks - 1]
    right_a, right_d = total_a - left_a, total_d - left_d
    ok = (left_d > 0) & (right_d > 0)
    if not ok.any():
        return None
    score = np.full(len(ks), -np.inf)
    lr = left_a[ok] / left_d[ok]
    rr = right_a[ok] / right_d[ok]
    score[ok] = (lr - rr) * np.sqrt(left_d[ok] * right_d[ok] / total_d)
    best = int(np.argmax(score))
    return int(ks[best]) if score[best] > 0 else None


def _draws(rng: np.random.Generator, n: int, k: int) -> FloatArray:
    """``k`` bootstrap multiplicity rows over ``n`` requests (row b: how often each
    request is drawn in resample b)."""
    picks = rng.integers(0, n, size=(k, n))
    flat = (picks + (np.arange(k) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=k * n).reshape(k, n).astype(np.float64)


def _boot_sums(columns: FloatArray, rng: np.random.Generator, resamples: int) -> FloatArray:
    """(resamples x columns) sums of ``columns`` (requests x columns) over request-level
    resamples, drawn ``_CHUNK_CELLS // requests`` resamples at a time."""
    n = columns.shape[0]
    out = np.empty((resamples, columns.shape[1]))
    chunk = max(1, min(resamples, _CHUNK_CELLS // max(n, 1)))
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        out[start : start + k] = _draws(rng, n, k) @ columns
    return out


def _boot_al(sums: FloatArray, acc: int, drafts: int) -> FloatArray:
    out = np.full(sums.shape[0], np.nan)
    np.divide(sums[:, acc], sums[:, drafts], out=out, where=sums[:, drafts] > 0)
    return 1.0 + out


def _interval(estimate: float, boot: FloatArray, level: float) -> Interval:
    finite = boot[np.isfinite(boot)]
    if finite.size == 0:
        return Interval(estimate=estimate, low=float("nan"), high=float("nan"), level=level)
    alpha = 1.0 - level
    low, high = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    return Interval(estimate=estimate, low=float(low), high=float(high), level=level)


def _run_split(
    acc: FloatArray,
    drafts: FloatArray,
    rule: CollapseRule,
    rng: np.random.Generator,
    resamples: int,
    level: float,
) -> RunSplit | None:
    k = change_point(acc, drafts, rule.min_requests)
    if k is None:
        return None
    before = _al(float(acc[:k].sum()), float(drafts[:k].sum()))
    after = _al(float(acc[k:].sum()), float(drafts[k:].sum()))
    assert before is not None and after is not None  # change_point needs drafts both sides
    split = RunSplit(
        axis="request",
        at=k,
        total=len(drafts),
        before_n=k,
        after_n=len(drafts) - k,
        before_al=before,
        after_al=after,
    )
    if not rule.meets(before, after):
        return split
    b = _boot_sums(np.column_stack([acc[:k], drafts[:k]]), rng, resamples)
    a = _boot_sums(np.column_stack([acc[k:], drafts[k:]]), rng, resamples)
    diff = _interval(after - before, _boot_al(a, 0, 1) - _boot_al(b, 0, 1), level)
    return split.model_copy(update={"difference": diff, "collapsed": diff.high < 0})


def _rounds(
    ids: Sequence[str],
    acc: FloatArray,
    drafts: FloatArray,
    rule: CollapseRule,
    rng: np.random.Generator,
    resamples: int,
    level: float,
) -> tuple[tuple[RoundAcceptance, ...], RunSplit | None]:
    """AL per round, and round 1 against the last round ``min_requests`` conversations
    reached, paired by conversation. One pass over the ids."""
    where: dict[tuple[str, int], int] = {}
    for i, prompt_id in enumerate(ids):
        where.setdefault(conversation_round(prompt_id), i)
    numbers = sorted({r for _, r in where})
    if len(numbers) < 2:
        return (), None
    sums: dict[int, list[float]] = {r: [0.0, 0.0, 0] for r in numbers}
    for (_, r), i in where.items():
        s = sums[r]
        s[0] += acc[i]
        s[1] += drafts[i]
        s[2] += 1
    rounds = tuple(
        RoundAcceptance(round=r, conversations=int(s[2]), al=_al(s[0], s[1]))
        for r, s in sorted(sums.items())
    )
    reached = [r.round for r in rounds if r.round > 1 and r.conversations >= rule.min_requests]
    if not reached or sums[1][2] < rule.min_requests:
        return rounds, None
    last = reached[-1]
    pairs = [(i, where[(c, last)]) for (c, r), i in where.items() if r == 1 and (c, last) in where]
    if len(pairs) < rule.min_requests:
        return rounds, None
    first_idx = np.array([i for i, _ in pairs], dtype=np.intp)
    last_idx = np.array([j for _, j in pairs], dtype=np.intp)
    before = _al(float(acc[first_idx].sum()), float(drafts[first_idx].sum()))
    after = _al(float(acc[last_idx].sum()), float(drafts[last_idx].sum()))
    if before is None or after is None:
        return rounds, None
    began = next(
        (r.round for r in rounds if r.round > 1 and r.al is not None and rule.meets(before, r.al)),
        None,
    )
    split = RunSplit(
        axis="round",
        at=last,
        total=numbers[-1],
        before_n=len(pairs),
        after_n=len(pairs),
        before_al=before,
        after_al=after,
        began=began,
    )
    if not rule.meets(before, after):
        return rounds, split
    columns = np.column_stack([acc[first_idx], drafts[first_idx], acc[last_idx], drafts[last_idx]])
    boot = _boot_sums(columns, rng, resamples)
    diff = _interval(after - before, _boot_al(boot, 2, 3) - _boot_al(boot, 0, 1), level)
    return rounds, split.model_copy(update={"difference": diff, "collapsed": diff.high < 0})


def acceptance_over_run(
    requests: Sequence[RequestRecord],
    rule: CollapseRule | None = None,
    *,
    rng: np.random.Generator,
    resamples: int = 2000,
    level: float = 0.95,
) -> RunAcceptance:
    """One variant's acceptance over its run (``requests`` in the order served): where
    it fell most and by round, each judged by ``rule``. Reads each request once."""
    rule = rule or CollapseRule()
    ids, acc, drafts = _arrays(requests)
    n = len(ids)
    part = n // 3
    run = RunAcceptance(
        requests=n,
        al=_al(float(acc.sum()), float(drafts.sum())),
        part=part,
        first_al=_al(float(acc[:part].sum()), float(drafts[:part].sum())) if part else None,
        last_al=_al(float(acc[n - part :].sum()), float(drafts[n - part :].sum()))
        if part
        else None,
    )
    if run.al is None:
        return run
    change = _run_split(acc, drafts, rule, rng, resamples, level)
    rounds, round_change = _rounds(ids, acc, drafts, rule, rng, resamples, level)
    return run.model_copy(update={"change": change, "rounds": rounds, "round_change": round_change})


def run_profile(requests: Sequence[RequestRecord], bins: int = 60) -> tuple[ProfileBin, ...]:
    """AL over consecutive stretches of the run (at most ``bins`` of them, equal in
    requests), for a chart: O(n), one pass over the requests."""
    _, acc, drafts = _arrays(requests)
    n = len(drafts)
    if n == 0 or bins < 1:
        return ()
    edges = np.unique(np.linspace(0, n, min(bins, n) + 1).round().astype(int))
    a = np.concatenate([[0.0], np.cumsum(acc)])
    d = np.concatenate([[0.0], np.cumsum(drafts)])
    return tuple(
        ProfileBin(start=int(lo), end=int(hi), al=_al(a[hi] - a[lo], d[hi] - d[lo]))
        for lo, hi in itertools.pairwise(edges.tolist())
    )


def round_profile(requests: Sequence[RequestRecord]) -> tuple[ProfileBin, ...]:
    """AL of each conversation round as chart bins (round ``r`` spans ``r - 1`` .. ``r``);
    empty when the requests are not conversations. O(n)."""
    ids, acc, drafts = _arrays(requests)
    sums: dict[int, list[float]] = {}
    for i, prompt_id in enumerate(ids):
        s = sums.setdefault(conversation_round(prompt_id)[1], [0.0, 0.0])
        s[0] += acc[i]
        s[1] += drafts[i]
    if len(sums) < 2:
        return ()
    return tuple(ProfileBin(start=r - 1, end=r, al=_al(a, d)) for r, (a, d) in sorted(sums.items()))


def check_over_run(
    sweep: SweepRecord, rule: CollapseRule, config: CheckConfig | None = None
) -> OverRunReport:
    """Every spec-on variant of ``sweep``'s ok cells looked at over its run; each
    collapse a ``collapse_over_run`` finding (the run's and the rounds' apart)."""
    config = config or CheckConfig()
    findings: list[Finding] = []
    notes: list[str] = []
    checked: set[tuple[str, str]] = set()
    looked = short = 0
    for stored in sweep.cells:
        cell, result = stored.cell, stored.result
        if not cell.speculative or result is None or result.status != "ok":
            continue
        for variant in result.variants:
            key = cell.variant_key(variant.axes)
            label = cell.variant_label(variant.axes)
            run = acceptance_over_run(
                variant.requests,
                rule,
                rng=config.rng(f"{COLLAPSE_CHECK}|{key.label}"),
                resamples=config.resamples,
                level=config.level,
            )
            if run.al is None:
                continue
            if run.requests < 2 * rule.min_requests:
                short += 1
                continue
            looked += 1
            checked.add((COLLAPSE_CHECK, key.label))
            for split in run.collapses:
                findings.append(_finding(split, run, cell.cell_id, key, label, rule))
    if short:
        notes.append(
            f"acceptance over the run: {short} spec-on variant(s) with fewer than "
            f"{2 * rule.min_requests} requests with counters, not judged"
        )
    return OverRunReport(
        findings=tuple(findings), notes=tuple(notes), checked=frozenset(checked), looked=looked
    )


def _finding(
    split: RunSplit,
    run: RunAcceptance,
    cell_id: str,
    key: ComparableKey,
    label: str,
    rule: CollapseRule,
) -> Finding:
    diff = split.difference
    assert diff is not None
    relative = (split.after_al - split.before_al) / split.before_al
    if split.axis == "request":
        where = (
            f"AL {split.before_al:.2f} over the first {split.before_n} requests, "
            f"{split.after_al:.2f} over the last {split.after_n} (from request {split.at + 1} "
            f"of {split.total} in the order served)"
        )
        thirds = (
            f"; first third {run.first_al:.2f}, last third {run.last_al:.2f}"
            if run.first_al is not None and run.last_al is not None
            else ""
        )
        candidate, reference = (
            f"{label} requests {split.at + 1}-{split.total}",
            f"{label} requests 1-{split.at}",
        )
        sampling = "request-level bootstrap"
    else:
        shown = ", ".join(
            f"{r.round}: {r.al:.2f} ({r.conversations})" for r in run.rounds if r.al is not None
        )
        began = f"; the fall begins at round {split.began}" if split.began else ""
        where = (
            f"AL {split.before_al:.2f} in round 1, {split.after_al:.2f} in round {split.at} "
            f"over the {split.before_n} conversations that reached it{began}"
        )
        thirds = f"; AL by round (conversations): {shown}"
        candidate, reference = f"{label} round {split.at}", f"{label} round 1"
        sampling = "bootstrap paired by conversation"
    summary = (
        f"{label}: acceptance collapsed over the run: {where}; difference "
        f"{diff.estimate:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}] ({diff.level:.0%} "
        f"{sampling}){thirds}; the run's mean AL is {run.al:.2f}. Rule: {rule.describe()}"
    )
    figure = AlertFigure(
        metric="mean_acceptance_length",
        candidate=candidate,
        reference=reference,
        candidate_value=FigureInterval.of(split.after_al),
        reference_value=FigureInterval.of(split.before_al),
        difference=FigureInterval.of(diff.estimate, diff.low, diff.high, diff.level),
        relative=relative,
        paired=split.axis == "round",
        pairs=split.before_n if split.axis == "round" else None,
        min_effect=rule.min_al_drop,
        begins_at=split.at if split.axis == "request" else split.began or split.at,
        over=split.axis,
    )
    return Finding(
        source="over_run",
        check=COLLAPSE_CHECK,
        key=key,
        cells=(cell_id,),
        metric="mean_acceptance_length",
        summary=summary,
        relative=relative,
        figures=(figure,),
    )

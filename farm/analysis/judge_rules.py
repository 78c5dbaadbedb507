"""How a use judges a sweep (:class:`JudgeRules`) and the names of the checks whose
findings :func:`farm.analysis.judgement.judge` makes itself. Pure data: rules are made
by :mod:`farm.analysis.rules` (the one factory) and read by the judgement."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from farm.analysis.check_rules import CheckConfig
from farm.analysis.history import HistoryConfig
from farm.analysis.noise import KeyNoise, NoiseRule
from farm.analysis.over_run import CollapseRule
from farm.analysis.pooling import PoolRule
from farm.analysis.prefix_cache import PrefixRule
from farm.analysis.sustained import SustainedRule
from farm.comparable import ComparableKey
from farm.frozen import Frozen
from farm.spec.goldens import GoldenCheck

__all__ = [
    "BASELINE_CHECK",
    "CHANGE_POINT_RECENT",
    "NOTHING_COMPARED",
    "PR_CHECK",
    "JudgeRules",
]

# The finding check (and alert kind) of a drop against the job's last good night.
BASELINE_CHECK: Final = "nightly_vs_last_good"
# The finding check of a PR's candidate cell that fell below its base.
PR_CHECK: Final = "pr_vs_base"
# The finding check of a comparison in which nothing was compared (a gate, not a pass).
NOTHING_COMPARED: Final = "nothing_compared"
# A change point is a finding while its first point is among the last this many points
# (HistoryConfig.confirm's default), so an old shift is not raised night after night.
CHANGE_POINT_RECENT: Final = 2


class JudgeRules(Frozen):
    """How a use judges: the statistics, which checks run, and how findings read.

    ``within``: run the within-sweep checks (``graph_modes``: graph modes against
    eager too; ``base_of``: patched engine -> base
    engine; ``depth_invariance``: that check too); ``baseline_check``: the check name
    of a drop against the baseline;
    ``baseline_sweep``: name the baseline's sweep in findings and notes (a nightly's
    last good night) rather than call it ``the base`` (a PR); ``engine_map``: candidate
    engine -> baseline engine (a PR build named apart from its base);
    ``candidate_side`` / ``baseline_side``: the words before a failed cell's summary,
    and whether the baseline's own failed cells are findings (None: they are not);
    ``noise``: calibrate the baseline comparison's AL threshold per key from the
    key's nights in ``history`` when one is given (:mod:`farm.analysis.noise`; None:
    the fixed rule), else from ``calibration``; a suspicious first run is decided by
    its reruns (``noise.confirm``: :mod:`farm.analysis.confirm`);
    ``calibration``: each key's run-to-run noise read from its nights before the
    sweep ran, for a use judged without a history (a PR: its base is one run, judged
    as it stands, never re-centred on the nights);
    ``quarantine``: keys whose findings are kept, marked and shown but neither make
    the verdict a regression nor raise alerts (flaky keys, with their flip rate);
    ``require_comparison``: a baseline with which nothing was compared is a finding
    (``nothing_compared``, source ``cells``: the run could not judge; a PR's status
    is then error), not a pass (:func:`farm.analysis.gate.nothing_compared`);
    ``goldens``: the goldens the sweep's variants are held to (:mod:`farm.spec.goldens`:
    each bound to the job models it is for), a miss at a position a ``golden`` finding;
    ``over_run``: look inside each spec-on variant's run for acceptance that collapsed
    (:mod:`farm.analysis.over_run`, a ``collapse_over_run`` finding; None: not looked);
    ``prefix_cache``: judge prefix-cache hit rates, MTP on against its MTP-off twin and
    against the baseline (:mod:`farm.analysis.prefix_cache`, a ``prefix_cache_hits``
    finding; None: not judged);
    ``pooling``: pool the keys compared with the baseline over every conjunction of one
    or two axis values and test each (:mod:`farm.analysis.pooling`, a ``pooled_drop``
    finding; None: not pooled);
    ``sustained``: name a drop that persists over each key's recent nights, with its
    run-level spread (:mod:`farm.analysis.sustained`, a ``sustained_drop`` finding;
    None: not looked for).
    """

    check: CheckConfig = CheckConfig()
    history: HistoryConfig | None = None
    within: bool = True
    graph_modes: bool = True
    base_of: dict[str, str] = Field(default_factory=dict)
    depth_invariance: bool = False
    baseline_check: str = BASELINE_CHECK
    baseline_sweep: bool = True
    engine_map: dict[str, str] = Field(default_factory=dict)
    candidate_side: str = ""
    baseline_side: str | None = None
    require_comparison: bool = False
    noise: NoiseRule | None = None
    calibration: dict[ComparableKey, KeyNoise] = Field(default_factory=dict)
    quarantine: dict[str, float] = Field(default_factory=dict)  # key label -> its verdict flip rate
    goldens: tuple[GoldenCheck, ...] = ()
    over_run: CollapseRule | None = None
    prefix_cache: PrefixRule | None = None
    pooling: PoolRule | None = None
    sustained: SustainedRule | None = None

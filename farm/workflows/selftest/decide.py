"""`farm selftest`: prove on this machine that the farm still catches its seed bugs.

The self-test job (jobs/selftest.yaml) runs the clean engine, each canary build (a
bundled `purpose: canary` patch that re-creates the class of one of the two seed bugs:
docs/design.md, "The two bugs the farm exists to catch") and the clean engine once
more, on a reduced matrix. Every other engine is compared with the first one, the
clean reference, cell by cell with the within-sweep patch check: a canary must be
flagged where its bug bites and nowhere else, and the clean repeat must not be flagged
at all. Two classes show in checks of their own, run on every engine of the sweep as a
night runs them: acceptance that collapses over one cell's run (``over_run``) and
prefix-cache hits that MTP loses against its spec-off twin (``prefix_cache``); a
variant either names is flagged too.
"""

from __future__ import annotations

from farm.analysis import (
    Attribution,
    CheckReport,
    LabeledCell,
    attribute,
    labels_from_report,
)
from farm.analysis.judgement import judge
from farm.analysis.rules import selftest_rules
from farm.axes import AXIS_NAMES
from farm.frozen import Frozen
from farm.records import SweepRecord
from farm.results.verdict import Finding
from farm.spec import JobSpec

__all__ = ["EngineEffect", "SelftestReport", "analyze_selftest", "selftest_bases"]


class EngineEffect(Frozen):
    """Where one engine (a canary or the clean repeat) differs from the clean reference."""

    engine: str
    # What this engine applies beyond the reference's patches: a canary's own patch;
    # nothing for the clean repeat, even when both carry a fix.
    added_patches: tuple[str, ...]
    cells: tuple[LabeledCell, ...]
    attribution: Attribution | None

    @property
    def regressed(self) -> tuple[str, ...]:
        return tuple(c.label for c in self.cells if c.regressed)

    @property
    def expects_drop(self) -> bool:
        return bool(self.added_patches)

    @property
    def as_expected(self) -> bool:
        """A canary is caught somewhere; the clean repeat is flagged nowhere."""
        return bool(self.regressed) == self.expects_drop


class SelftestReport(Frozen):
    sweep_id: int
    reference: str
    effects: tuple[EngineEffect, ...]
    checks: CheckReport
    # The over-run and prefix-cache findings of the sweep, every engine's.
    own_findings: tuple[Finding, ...] = ()


# Finding sources judged inside one engine's own cells, beside the patch check.
OWN_SOURCES = ("over_run", "prefix_cache")


def selftest_bases(job: JobSpec) -> dict[str, str]:
    """Every engine after the first -> the first (the clean reference).

    The reference may carry fixes (the embedded default's build does); every other
    engine must apply them too, so that what differs is what it adds.
    """
    reference = job.engines[0]
    for engine in job.engines[1:]:
        if not set(reference.patches) <= set(engine.patches):
            raise ValueError(
                f"the first engine of a self-test job is the clean reference: engine "
                f"{engine.name} must apply its patches too ({', '.join(reference.patches)})"
            )
    return {e.name: reference.name for e in job.engines[1:]}


def analyze_selftest(record: SweepRecord, job: JobSpec) -> SelftestReport:
    """Compare each engine of the self-test sweep with the clean reference, judged as
    every verdict is (:func:`farm.analysis.judgement.judge`, :func:`selftest_rules`)."""
    judgement = judge(record, None, None, selftest_rules(selftest_bases(job)))
    checks = judgement.within
    assert checks is not None  # selftest_rules run the within-sweep checks
    own = tuple(f for f in judgement.findings if f.source in OWN_SOURCES)
    flagged = [f.key.axis_values() for f in own if f.key is not None]
    labelled = [
        c.model_copy(update={"regressed": True}) if c.axes in flagged else c
        for c in labels_from_report(checks)
    ]
    effects = []
    for engine in job.engines[1:]:
        cells = tuple(c for c in labelled if c.axes.get("engine") == engine.name)
        varying = [
            a
            for a in AXIS_NAMES
            if a not in ("engine", "model") and len({c.axes.get(a) for c in cells}) > 1
        ]
        effects.append(
            EngineEffect(
                engine=engine.name,
                added_patches=tuple(p for p in engine.patches if p not in job.engines[0].patches),
                cells=cells,
                attribution=attribute(cells, axes=varying) if varying else None,
            )
        )
    return SelftestReport(
        sweep_id=record.sweep_id,
        reference=job.engines[0].name,
        effects=tuple(effects),
        checks=checks,
        own_findings=own,
    )

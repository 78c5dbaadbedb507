"""Which ends `farm bisect` searches between: given, a stored bisection's, or an alert's.

An alert names its engine, its cell (the ``--only`` slice) and two sweeps: the good end
is the baseline sweep its figures name (``... in sweep N``), the bad end the sweep that
raised it; each end's ref is the commit or release the sweep's build of the engine
recorded. Options given on the command line win over what is read from the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import NamedTuple

from sqlmodel import Session

from farm.errors import FarmError
from farm.records import BuildInfo
from farm.spec import JobSpec
from farm.store.alerts import get_alert
from farm.store.bisections import get_bisection
from farm.store.cells import load_sweep
from farm.workflows.bisect.decide import baseline_sweep_of
from farm.workflows.bisect.setup import bisected_part
from farm.workflows.pr.decide import job_engine

__all__ = ["AlertEnds", "BisectEnds", "alert_ends", "alert_refs", "complete_ends", "stored_ends"]


@dataclass(frozen=True)
class BisectEnds:
    """What is bisected, as far as it is known: the engine, the refs, the slice."""

    engine: str | None
    good: str | None
    bad: str | None
    only: dict[str, str]
    resume: int | None = None
    from_alert: int | None = None


class AlertEnds(NamedTuple):
    engine: str
    only: dict[str, str]  # the alert's cell as --only pairs
    good: tuple[BuildInfo, ...]  # the builds of the alert's baseline sweep
    bad: tuple[BuildInfo, ...]  # the builds of the alert's own sweep


def alert_ends(session: Session, alert_id: int) -> AlertEnds:
    """The engine, the cell and both ends' builds of stored alert ``alert_id``.
    StoreError when there is no such alert."""
    alert = get_alert(session, alert_id)
    key = alert.details.cell
    only = {name: str(value) for name, value in key.axes}
    only["model"] = key.model
    bad_sweep = load_sweep(session, alert.details.sweep_id)
    baselines = [baseline_sweep_of(f.reference) for f in alert.details.figures]
    good_id = next((b for b in baselines if b is not None), None)
    good_sweep = load_sweep(session, good_id) if good_id is not None else None
    good = good_sweep.builds if good_sweep is not None else ()
    return AlertEnds(key.engine, only, tuple(good), tuple(bad_sweep.builds))


def alert_refs(job: JobSpec, ends: AlertEnds) -> tuple[str | None, str | None]:
    """(good, bad): the commit or release of the bisected part each end's build of the
    alert's engine recorded (None where it records none)."""
    part = bisected_part(job_engine(job, ends.engine))

    def ref(builds: Sequence[BuildInfo]) -> str | None:
        return next((r for b in builds if b.engine == ends.engine and (r := part.ref_of(b))), None)

    return ref(ends.good), ref(ends.bad)


def stored_ends(
    ends: BisectEnds, open_session: Callable[[], AbstractContextManager[Session]]
) -> tuple[BisectEnds, AlertEnds | None]:
    """``ends`` completed from the stored bisection ``--resume`` names and the alert
    ``--from-alert`` names (the store is opened only for them). FarmError when no
    engine is known after them."""
    alert = None
    if ends.resume is not None:
        with open_session() as session:
            stored = get_bisection(session, ends.resume)
        ends = replace(
            ends,
            engine=ends.engine or stored.engine,
            good=ends.good or stored.good.commit,
            bad=ends.bad or stored.bad.commit,
        )
    if ends.from_alert is not None:
        with open_session() as session:
            alert = alert_ends(session, ends.from_alert)
        ends = replace(ends, engine=ends.engine or alert.engine, only=alert.only | ends.only)
    if not ends.engine:
        raise FarmError("--engine missing: give it (or --from-alert, --resume)")
    return ends, alert


def complete_ends(job: JobSpec, ends: BisectEnds, alert: AlertEnds | None) -> tuple[str, str, str]:
    """(engine, good, bad): the refs an alert's builds recorded fill in what was not
    given. FarmError naming what is still missing."""
    assert ends.engine
    good, bad = ends.good, ends.bad
    if alert is not None:
        a_good, a_bad = alert_refs(job, alert._replace(engine=ends.engine))
        good, bad = good or a_good, bad or a_bad
    missing = [n for n, v in (("--good", good), ("--bad", bad)) if not v]
    if missing:
        why = f" (alert {ends.from_alert}'s builds record no commit or release)" if alert else ""
        raise FarmError(f"{', '.join(missing)} missing{why}: give them (or --from-alert, --resume)")
    assert good and bad
    return ends.engine, good, bad

"""The I/O around a nightly's verdict: read the store, judge, raise alerts, store the
verdict, notify, publish the report folder.

:func:`check_night` is the whole check of a stored sweep, once: a sweep whose nightly
verdict is already stored is not judged, alerted or notified again (a rerun of the
same night changes nothing). Order of the writes: alerts (idempotent per sweep), then
the verdict (unique per sweep and kind), then the notifications of pending alerts
(each marked when delivered). A driver killed between two of them leaves nothing
that a rerun would duplicate: alerts are upserted, an alert not delivered stays
pending and the next check (any sweep's, or ``farm alerts check``) sends it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from sqlmodel import Session

from farm.analysis.checks import check_sweep
from farm.analysis.summary import patched_bases, summarize_sweep
from farm.analysis.verdicts import CheckConfig
from farm.errors import OutputError
from farm.notify.alert import AlertRecord
from farm.notify.pipeline import send_pending
from farm.notify.registry import Notifier, configured_notifiers
from farm.records import SweepRecord
from farm.report.html import render_html, render_verdict_index
from farm.store.alerts import raise_alerts
from farm.store.repository import history_series, list_sweeps, load_sweep
from farm.store.verdicts import get_verdict, job_verdicts, record_verdict, verdict_outcomes
from farm.workflows.nightly import EarlierNight, judge_night, last_good_night
from farm.workflows.verdict import SweepVerdict

__all__ = ["NightlyCheck", "check_night", "publish_night", "write_page"]

# How far back the last good night is looked for (sweeps of any job, newest first).
_LOOKBACK_SWEEPS = 500


class NightlyCheck(BaseModel):
    """What one check of a night did; ``judged`` is False when its verdict was stored
    before (nothing was raised or sent then)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: SweepVerdict
    judged: bool
    raised: tuple[AlertRecord, ...] = ()
    sent: tuple[AlertRecord, ...] = ()
    channels: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def _earlier_nights(session: Session, record: SweepRecord) -> list[EarlierNight]:
    outcomes = verdict_outcomes(session, record.job, "nightly", record.sweep_id)
    return [
        EarlierNight(sweep_id=s.id, status=s.status, verdict=outcomes.get(s.id))
        for s in list_sweeps(session, limit=_LOOKBACK_SWEEPS)
        if s.job == record.job and s.id < record.sweep_id
    ]


def check_night(
    session: Session,
    sweep_id: int,
    *,
    history: int,
    notifiers: Sequence[Notifier] | None = None,
    config: CheckConfig | None = None,
) -> NightlyCheck:
    """Judge stored sweep ``sweep_id`` as a nightly once; raise, store, notify.

    ``history``: how many of the job's sweeps (this one included) the change-point
    checks read; ``notifiers`` default to the configured channels (``FARM_NOTIFY_*``),
    ``()`` notifies nobody. Raises StoreError (store), NotifyError (invalid channel
    settings).
    """
    stored = get_verdict(session, sweep_id, "nightly")
    if stored is not None:
        return NightlyCheck(verdict=stored, judged=False)
    channels = list(configured_notifiers() if notifiers is None else notifiers)
    record = load_sweep(session, sweep_id)
    good = last_good_night(sweep_id, _earlier_nights(session, record))
    judgement = judge_night(
        record,
        last_good=load_sweep(session, good) if good is not None else None,
        history=history_series(session, record, history) if history > 1 else None,
        base_of=patched_bases(record.builds),
        config=config,
    )
    raised = raise_alerts(session, sweep_id, judgement.alerts)
    verdict, new = record_verdict(session, judgement.verdict)
    if not new:
        # Another driver judged this night first: it raises and sends, not us.
        return NightlyCheck(verdict=verdict, judged=False)
    pending, errors = send_pending(session, channels)
    return NightlyCheck(
        verdict=verdict,
        judged=True,
        raised=tuple(raised),
        sent=tuple(pending),
        channels=tuple(n.name for n in channels),
        errors=tuple(str(e) for e in errors),
    )


def write_page(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader never sees half a page);
    OutputError when it cannot be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def publish_night(
    session: Session, verdict: SweepVerdict, folder: Path, *, history: int = 14
) -> list[Path]:
    """Write ``sweep-<id>.html`` (the report with its verdict), ``latest.html`` (when
    this is the job's newest judged night) and ``index.html`` (the job's nights with
    their verdicts) into ``folder`` (created). Returns the paths written; raises
    OutputError when the folder cannot be written, StoreError (store).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the publish folder {folder}: {exc.strerror}") from None
    record = load_sweep(session, verdict.sweep_id)
    trends = history_series(session, record, history) if history > 1 else None
    page = render_html(
        record,
        summarize_sweep(record),
        check_sweep(record, patched_bases(record.builds)),
        trends,
        verdict=verdict,
    )
    own = folder / f"sweep-{record.sweep_id}.html"
    write_page(own, page)
    written = [own]
    nights = job_verdicts(session, record.job, "nightly", limit=500)
    if nights and nights[0].sweep_id == record.sweep_id:
        write_page(folder / "latest.html", page)
        written.append(folder / "latest.html")
    published = [v for v in nights if (folder / f"sweep-{v.sweep_id}.html").exists()]
    write_page(folder / "index.html", render_verdict_index(record.job, published))
    written.append(folder / "index.html")
    return written

"""The key spread stored after each night's verdict (nightly or A/A).

Read: the job's last ``history`` sweeps ending with the night (as the night's history
checks read them: the cost follows ``nightly.history``, not the store's size) and the
A/A verdicts among them; computed by :func:`farm.analysis.noise.noise_table`, the
estimator the calibration uses; stored by :func:`farm.store.spread.record_spread`.
"""

from __future__ import annotations

from sqlmodel import Session

from farm.analysis.noise import KeyNoise, KeyNoiseRow, key_noise, noise_table
from farm.comparable import ComparableKey
from farm.errors import FarmError
from farm.masking import mask_secrets
from farm.records import SweepRecord
from farm.store.cells import load_sweep
from farm.store.history import history_sweeps, job_history_series
from farm.store.spread import record_spread, stored_spread
from farm.store.sweeps import latest_job_sweep_id, sweep_job
from farm.store.verdicts import list_verdicts

__all__ = ["job_key_noise", "night_spread", "store_night_spread"]


def night_spread(session: Session, record: SweepRecord, history: int) -> list[KeyNoiseRow]:
    """Each spec-on key's spread over the job's last ``history`` sweeps ending with
    night ``record`` (at least two: one night has no spread), keys seen on one night
    only left out. Raises StoreError (store)."""
    sweeps = history_sweeps(session, record, max(history, 2))
    verdicts = list_verdicts(session, [s.sweep_id for s in sweeps])
    aa = [v for vs in verdicts.values() for v in vs if v.kind == "aa"]
    return [row for row in noise_table(sweeps, aa) if row.nights >= 2]


def store_night_spread(
    session: Session,
    sweep_id: int,
    history: int,
    *,
    only_if_missing: bool = False,
    record: SweepRecord | None = None,
) -> str | None:
    """Compute and upsert night ``sweep_id``'s key spread (:func:`night_spread`);
    ``only_if_missing``: leave a spread stored before alone (a rerun of a judged night
    stores one only if the first run could not; ``record``: the night, when read
    already). Returns None, or why it could not be
    stored: the night's verdict is stored already, and a missing spread must not turn
    its status into an error."""
    try:
        job, _ = sweep_job(session, sweep_id)
        if only_if_missing and stored_spread(session, job, sweep_id) is not None:
            return None
        night = record if record is not None else load_sweep(session, sweep_id)
        rows = night_spread(session, night, history)
        record_spread(session, job, sweep_id, rows)
    except FarmError as exc:
        return mask_secrets(f"the key spread of sweep {sweep_id} was not stored: {exc}")
    return None


def job_key_noise(session: Session, job: str, history: int) -> dict[ComparableKey, KeyNoise]:
    """Each key's run-to-run noise over nightly ``job``'s last ``history`` sweeps (the
    calibration's estimator, :func:`farm.analysis.noise.key_noise`, with every one of
    them before the use it calibrates; no reference level): what a PR's thresholds
    are calibrated with before its sweep runs. Empty without two nights to read."""
    if history < 2:
        return {}
    newest = latest_job_sweep_id(session, job)
    if newest is None:
        return {}
    series = job_history_series(session, job, newest, history)
    return key_noise(series, newest + 1)

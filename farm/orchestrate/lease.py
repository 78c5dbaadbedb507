"""A driver's lease on its sweep: a heartbeat in the store, kept by a thread.

``--resume`` of a sweep whose heartbeat is fresh is refused (another driver runs it);
one whose heartbeat is stale is taken over (:mod:`farm.orchestrate.driver`).
"""

from __future__ import annotations

import threading

from sqlalchemy.exc import SQLAlchemyError

from farm import store
from farm.errors import StoreError

__all__ = ["Lease"]


class Lease:
    """This driver's lease on its sweep: a heartbeat written to the store every
    ``interval`` seconds by a thread, on its own engine (a slow store call of the
    sweep's must not delay it). ``store_down`` says whether the last beat failed;
    ``lost`` holds the lease of the driver that took the sweep over, if one did."""

    def __init__(self, url: str, sweep_id: int, driver: str, interval: float) -> None:
        self._url = url
        self._sweep_id = sweep_id
        self._driver = driver
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.store_down = False
        self.lost: store.SweepLease | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._beat, name=f"farm-heartbeat-{self._sweep_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # A beat in flight ends within the store timeouts; do not wait longer for it.
            self._thread.join(timeout=store.call_timeout_s() + 1)

    def _beat(self) -> None:
        engine = store.connect(store.normalize_url(self._url))
        try:
            while not self._stop.wait(self._interval):
                try:
                    with store.answer_within(engine), store.Session(engine) as session:
                        holder = store.heartbeat(session, self._sweep_id, self._driver)
                except (StoreError, SQLAlchemyError):
                    self.store_down = True
                    continue
                self.store_down = False
                if holder is not None:
                    self.lost = holder
                    return
        finally:
            engine.dispose()

"""This host's own Ray cluster, one per FARM_HOME: started by the first run, joined by
later ones, stopped by the run that started it once the others have left."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
import ray.util.client
from filelock import FileLock, Timeout
from ray.exceptions import RayError

from farm.errors import FarmError
from farm.paths import ray_temp_dir

# How often the run that started the host's cluster looks whether the runs that
# joined it have left.
_JOINED_POLL_S = 1.0


class _HostCluster:
    """This host's Ray cluster for one FARM_HOME, shared by the farm runs on the host.

    Two `farm run` on one host must not each start a cluster claiming every CPU and
    NPU. Files in ``FARM_HOME/ray``: ``host.lock`` (held while a
    run starts, joins or stops the cluster), ``cluster.json`` (its address), and
    ``owner.lock`` / ``users/*.lock``, each held for as long as the run that started
    it / joined it uses it, so a killed run holds nothing. The run that started the
    cluster (it dies with that process: Ray shares the driver's fate) waits at its
    end until the runs that joined have left, then stops it.
    """

    def __init__(self, home: Path, say: Callable[[str], None]) -> None:
        self._home = home
        self._dir = home / "ray"
        self._say = say
        self.users = 1  # pools of this process using it
        self._owner = False
        self._fds: list[int] = []  # locks held while this process uses the cluster

    def enter(self, num_cpus: int) -> None:
        """Join the cluster another run started, or start it; say which."""
        (self._dir / "users").mkdir(parents=True, exist_ok=True)
        with self._host_lock("start or join"):
            record = self._record()
            if record is not None:
                self._join(record)
            else:
                self._start(num_cpus)

    def _start(self, num_cpus: int) -> None:
        self._hold(self._dir / "owner.lock")
        # Own temp dir (per FARM_HOME, short for Ray's socket paths), cleared of a
        # killed cluster's address file: that would make ray.init join the dead one.
        temp = ray_temp_dir(self._home)
        (temp / "ray_current_cluster").unlink(missing_ok=True)
        try:
            with _sigterm_kept():
                context = ray.init(
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    _temp_dir=str(temp),
                    log_to_driver=True,
                )
        except BaseException:
            self._release()
            raise
        self._owner = True
        record = {
            "address": context.address_info["gcs_address"],  # type: ignore[attr-defined]
            "pid": os.getpid(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": num_cpus,
            # ray.init turns token authentication on for a cluster it starts, unless
            # RAY_AUTH_MODE says otherwise; a run that joins must then use the token.
            "token_auth": os.environ.get("RAY_AUTH_MODE", "").lower() == "token",
        }
        cluster = self._dir / "cluster.json"
        partial = cluster.with_name(cluster.name + ".partial")
        partial.write_text(json.dumps(record) + "\n")
        partial.replace(cluster)

    def _join(self, record: dict[str, Any]) -> None:
        self._hold(self._dir / "users" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.lock")
        address = str(record.get("address"))
        started = f"pid {record.get('pid')} at {record.get('started_at')}"
        if record.get("token_auth"):
            _use_local_token()
        try:
            with _sigterm_kept():
                ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, RayError) as exc:
            self._release()
            raise FarmError(
                f"cannot join this host's Ray cluster at {address} (started by {started}, "
                f"{self._dir / 'cluster.json'}): {exc}; wait for that run to end, or stop it"
            ) from None
        self._say(
            f"joined this host's Ray cluster at {address}, started by another farm run "
            f"({started}): the two runs share its {record.get('cpus')} CPUs and its NPUs"
        )

    def leave(self) -> None:
        """Disconnect; the run that started the cluster stops it once nobody else uses it."""
        if not self._owner:
            ray.shutdown()
            self._release()
            return
        said = False
        try:
            while True:
                with self._host_lock("stop"):
                    joined = self._joined()
                    if not joined:
                        self._stop()
                        return
                if not said:
                    self._say(
                        f"waiting for {len(joined)} farm run(s) that joined this host's Ray "
                        f"cluster (pid {', '.join(joined)}) to finish before stopping it; "
                        "Ctrl-C or SIGTERM stops it now (their running cells are lost)"
                    )
                    said = True
                time.sleep(_JOINED_POLL_S)
        except KeyboardInterrupt:
            with self._host_lock("stop"):
                self._stop()
            raise

    def _stop(self) -> None:
        ray.shutdown()
        (self._dir / "cluster.json").unlink(missing_ok=True)
        self._release()

    def _record(self) -> dict[str, Any] | None:
        """The cluster another run started and still holds, or None."""
        try:
            record = json.loads((self._dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or _lock_is_free(self._dir / "owner.lock"):
            return None  # its run is gone, and the cluster with it
        return record

    def _joined(self) -> list[str]:
        """Pids of the runs that use the cluster now; removes the files of runs gone."""
        live = []
        for path in sorted((self._dir / "users").glob("*.lock")):
            if _lock_is_free(path):
                path.unlink(missing_ok=True)
            else:
                live.append(path.stem.split("-")[0])
        return live

    @contextlib.contextmanager
    def _host_lock(self, what: str) -> Iterator[None]:
        lock = FileLock(str(self._dir / "host.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            self._say(
                f"waiting for another farm run on this host to {what} its Ray cluster "
                f"({self._dir / 'host.lock'})"
            )
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def _hold(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fds.append(fd)

    def _release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _lock_is_free(path: Path) -> bool:
    """Whether nobody holds the lock file at ``path`` (a process holds it while alive)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Keep the process's SIGTERM handler across ``ray.init``, which installs its own
    (``sys.exit``): a sweep stopped by SIGTERM must stop as on Ctrl-C (farm.orchestrate.driver), so
    its commands can tell an interruption from a failure."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _use_local_token() -> None:
    """Use this host's Ray token (``~/.ray/auth_token``), as the run that started the
    cluster did: Ray turns token authentication on by itself only for a cluster it
    starts, and a joining driver without it is refused (InvalidAuthToken)."""
    # Ray's own switch (private; Ray is pinned): it respects an explicit RAY_AUTH_MODE.
    from ray._private.authentication import authentication_token_setup

    authentication_token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)

"""A Ray worker SIGKILLed while its engine serves leaves nothing of the engine behind,
on a real local Ray cluster.

The engine is the FAKE server (``tests/fakes/engine_server.py`` in its
``spawn-children`` mode: children in its group, one by multiprocessing, as vLLM's
EngineCore); the worker starts it with the farm's own engine process code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from farm.engines.devices import ProcessGroupGone

FAKE_SERVER = Path(__file__).resolve().parents[1] / "fakes" / "engine_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigkilled_ray_worker_leaves_no_process_of_its_fake_engine_group(
    tmp_path: Path, ray_local: None
) -> None:
    import ray

    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _temp_dir=f"/tmp/mtpfarm-ray-faults-{os.getpid()}",
        log_to_driver=False,
    )

    # Defined here so Ray ships it by value (test modules are not importable in workers).
    @ray.remote(num_cpus=1, max_restarts=0)
    class FakeEngineHolder:
        def start(self, server: str, port: int, log: str) -> tuple[int, int]:
            from farm.engines.process import ServerLaunch
            from farm.engines.vllm import VllmAdapter

            launch = ServerLaunch(
                argv=(sys.executable, server, str(port), "spawn-children"), env={}
            )
            self.engine = VllmAdapter().process(launch, port, Path(log))
            self.engine.start()
            self.engine.wait_ready(60)
            return os.getpid(), self.engine.pid

    holder: Any = FakeEngineHolder.remote()  # type: ignore[attr-defined]
    log = tmp_path / "engine.log"
    worker_pid, pgid = ray.get(holder.start.remote(str(FAKE_SERVER), _free_port(), str(log)))
    group = ProcessGroupGone(pgid)
    try:
        deadline = time.monotonic() + 10
        while len(group.holders()) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(group.holders()) >= 4, group.holders()  # keeper, server, 2 children
        os.kill(worker_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group.holders() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group.holders() == ()
        assert f"(pid {worker_pid}) is gone: killing process group {pgid}" in log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

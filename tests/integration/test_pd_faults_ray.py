"""A Ray worker SIGKILLed while a disaggregated cell's two servers serve leaves neither
server behind, on a real local Ray cluster (the colocated case:
test_engine_faults_ray.py).

The servers are FAKES (``tests/fakes/engine_server.py`` in its ``spawn-children``
mode: children in each server's group, one by multiprocessing, as vLLM's EngineCore);
the worker starts them as a prefill/decode pair with the farm's own code
(``farm.runner.pd.PdPair``: two engine processes and the proxy).
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


def test_sigkilled_ray_worker_leaves_neither_server_of_its_pair(
    tmp_path: Path, ray_local: None
) -> None:
    import ray

    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _temp_dir=f"/tmp/mtpfarm-ray-pd-faults-{os.getpid()}",
        log_to_driver=False,
    )

    # Defined here so Ray ships it by value (test modules are not importable in workers).
    @ray.remote(num_cpus=1, max_restarts=0)
    class FakePairHolder:
        def start(self, server: str, ports: list[int], log_dir: str) -> tuple[int, list[int]]:
            import httpx

            from farm.engines.process import ServerLaunch
            from farm.engines.vllm import VllmAdapter
            from farm.runner.pd import PdPair

            adapter = VllmAdapter()
            servers = [
                adapter.process(
                    ServerLaunch(
                        argv=(sys.executable, server, str(port), "spawn-children"), env={}
                    ),
                    port,
                    Path(log_dir) / f"{role}.log",
                )
                for role, port in zip(("prefill", "decode"), ports, strict=True)
            ]
            self.pair = PdPair(adapter, servers[0], servers[1], request_timeout_s=30)
            self.pair.start()
            self.pair.wait_ready(60)
            # Served through the pair's proxy, as the runner sends requests.
            body = {"model": "tiny", "messages": [{"role": "user", "content": "1 + 1"}]}
            answer = httpx.post(self.pair.url + "/v1/chat/completions", json=body, timeout=30)
            answer.raise_for_status()
            return os.getpid(), [s.pid for s in servers]

    holder: Any = FakePairHolder.remote()  # type: ignore[attr-defined]
    ports = [_free_port(), _free_port()]
    worker_pid, pgids = ray.get(holder.start.remote(str(FAKE_SERVER), ports, str(tmp_path)))
    groups = [ProcessGroupGone(pgid) for pgid in pgids]
    try:
        deadline = time.monotonic() + 10
        while any(len(g.holders()) < 4 for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Each: keeper, server, 2 children.
        assert all(len(g.holders()) >= 4 for g in groups), [g.holders() for g in groups]
        os.kill(worker_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(g.holders() for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [g.holders() for g in groups] == [(), ()]
        for role, pgid in zip(("prefill", "decode"), pgids, strict=True):
            log = (tmp_path / f"{role}.log").read_text()
            assert f"(pid {worker_pid}) is gone: killing process group {pgid}" in log
    finally:
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

"""A FAKE Ray worker running a disaggregated cell's two servers, then waiting to be killed.

Usage: ``python pd_worker.py LOG_DIR``. Starts two FAKE engine servers
(``engine_server.py``) as a prefill/decode pair through the farm's own code
(``farm.runner.pd.PdPair``: both engine processes and the proxy), prints both
servers' process group ids on one line, and sleeps. A test SIGKILLs this process, as
a node's OOM killer or a lost node does to a Ray worker, and looks for what is left
of either server's group.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from farm.engines.process import ServerLaunch
from farm.engines.vllm import VllmAdapter
from farm.runner.pd import PdPair

SERVER = Path(__file__).with_name("engine_server.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    log_dir = Path(sys.argv[1])
    adapter = VllmAdapter()
    servers = []
    for role in ("prefill", "decode"):
        port = _port()
        launch = ServerLaunch(
            argv=(sys.executable, str(SERVER), str(port), "spawn-children"), env={}
        )
        servers.append(adapter.process(launch, port, log_dir / f"{role}.log"))
    pair = PdPair(adapter, servers[0], servers[1], request_timeout_s=30)
    pair.start()
    pair.wait_ready(60)
    print(servers[0].pid, servers[1].pid, flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()

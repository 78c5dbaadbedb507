"""A FAKE Ray worker: starts an engine the way the runner does, then waits to be killed.

Usage: ``python engine_worker.py PORT LOG MODE...``. Starts the FAKE engine server
(``engine_server.py``) through the farm's own code (the vLLM adapter's engine
process: ``start`` and ``wait_ready``), prints the engine's process group id on one
line, and sleeps. A test SIGKILLs this process, as a node's OOM killer or a lost
node does to a Ray worker, and counts what is left of the engine's group.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from farm.engines.process import ServerLaunch
from farm.engines.vllm import VllmAdapter

SERVER = Path(__file__).with_name("engine_server.py")


def main() -> None:
    port, log = int(sys.argv[1]), Path(sys.argv[2])
    launch = ServerLaunch(argv=(sys.executable, str(SERVER), str(port), *sys.argv[3:]), env={})
    engine = VllmAdapter().process(launch, port, log)
    engine.start()
    engine.wait_ready(60)
    print(engine.pid, flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()

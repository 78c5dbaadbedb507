"""The leader of an engine's process group: the group dies with the process that
started it.

Run as ``python -I -S group_keeper.py PARENT_PID`` with the engine's command line as
a JSON list on stdin (standard library only, no farm imports: it starts in
milliseconds; the command is not in the keeper's own argv, so ``ps`` and anything
looking for the engine by its command line find the engine, not its keeper). It
runs the command (the engine server) as its child in its own process group, exits
with the engine's status, and when ``PARENT_PID`` (the Ray worker or driver running
the cell) is gone, SIGKILLs the whole group. The engine gets SIGKILL when the keeper
itself dies (PR_SET_PDEATHSIG), so the keeper's exit is always the engine's.

Why a keeper: engines start workers of their own (vLLM's EngineCore and its workers
are multiprocessing children of the API server, sglang's scheduler likewise), and
nothing kills those when the worker that started the server is SIGKILLed: the
server's own PR_SET_PDEATHSIG reached only the server, and its children were
reparented to init and ran on. The keeper watches its parent
by ``getppid()`` rather than PR_SET_PDEATHSIG, which fires when the *thread* that
forked exits, not the process.

SIGTERM, SIGINT and SIGHUP do nothing to the keeper: the farm signals the whole group
(``EngineProcess.stop``), so the engine gets them itself, and the keeper stays to
report its exit status.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

_POLL_S = 0.5
_CANNOT_START = 127
_PR_SET_PDEATHSIG = 1


def _kill_group(why: str) -> None:
    print(f"[farm group keeper] {why}: killing process group {os.getpid()}", flush=True)
    os.killpg(0, signal.SIGKILL)  # the keeper is in the group too


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    _kill_group(f"the process that started the engine (pid {parent}) is gone")


def _die_with_keeper() -> None:
    """In the engine (before exec): SIGKILL when the keeper's thread, its only one
    while it forks, dies."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parent = int(argv[1])
    command = json.loads(sys.stdin.read())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: ignored signals would stay ignored in the engine.
        signal.signal(sig, lambda signum, frame: None)
    try:
        # No other thread yet: preexec_fn is safe.
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_keeper)
    except OSError as exc:
        # The second line in the shape the runner's log scan names (last_exception_line).
        print(f"[farm group keeper] cannot start the engine\n{type(exc).__name__}: {exc}")
        return _CANNOT_START
    # Its first look also sees a parent that died before the engine started.
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    code = child.wait()
    if code < 0:
        # Killed by a signal: die of the same signal, so the farm sees the engine's status.
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # these have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

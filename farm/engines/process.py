"""An engine server as a process, and what starts it.

``ServerLaunch`` is everything needed to start one server (argv, environment, paths,
its side of a disaggregated pair); ``EngineProcess`` runs it, the interface the
runner drives (start, wait ready, stop, device release). This module holds what every
family shares (a subprocess in its own session on a loopback port, led by a keeper
that kills the group when the worker dies, with an explicit environment, its output
appended to the cell's log, a health poll, SIGTERM then SIGKILL to the group, the log
scan); each adapter's subclass names the log lines that mean its engine cannot serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Literal

import httpx

from farm.engines.devices import DeviceReleaseCheck, release_checks, wait_released
from farm.engines.environment import child_environment
from farm.errors import EngineError
from farm.frozen import Frozen

__all__ = [
    "COMMON_FATAL_PATTERNS",
    "EngineProcess",
    "PdSide",
    "ServerLaunch",
    "keeper_command",
    "last_exception_line",
]


class PdSide(Frozen):
    """One server of a disaggregated prefill/decode cell (deployment ``pd``): its role,
    the loopback port of its KV transfer side channel (vLLM NIXL's handshake, a
    Mooncake ``kv_port``, sglang's prefill bootstrap server) and how many devices each
    side of the pair has (0 on CPU): connectors are told both sides' parallelism.
    ``cpu_threads``: the CPU threads this side's engine may use (0: its default); a CPU
    build's pair splits its cell's threads, as an NPU pair splits its devices."""

    role: Literal["prefill", "decode"]
    kv_port: int
    prefill_npus: int = 0
    decode_npus: int = 0
    cpu_threads: int = 0


class ServerLaunch(Frozen):
    """Everything needed to start one engine server.

    ``pd`` is the server's side of a disaggregated cell (None: the cell's one server).
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    chat_path: str = "/v1/chat/completions"
    pd: PdSide | None = None


# Root causes any family prints at start-up; each adapter's process adds its own.
# Lines that only wrap a root cause (a worker "hit an exception", the engine core
# "failed") are ``wrapper_patterns``: they count only when no root cause is in the log.
# A traceback's final ``XError: ...`` line is kept apart (``last_exception_line``)
# because engines also log exceptions they catch.
_PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)
COMMON_FATAL_PATTERNS: tuple[re.Pattern[str], ...] = (
    # torch (CUDA) and torch_npu allocator messages; vLLM and sglang both raise them.
    re.compile(r"(?:CUDA|NPU) out of memory"),
    re.compile(r"OutOfMemoryError"),
    # Python's shapes of an unsupported configuration (vLLM's feature checks raise them).
    re.compile(
        r"(?:ValueError|NotImplementedError|TypeError): .*(?:not supported|unsupported|"
        r"is not implemented|not yet supported)"
    ),
    # Port taken between choosing it and binding it (uvicorn, zmq).
    _PORT_TAKEN,
)
# A worker's prefix, e.g. "(EngineCore_DP0 pid=123) " (vLLM) or "[2025-01-01 ...] " (sglang),
# and vLLM's logger prefix "ERROR 12-02 02:02:41 [core.py:1512] " after it.
_PREFIX = re.compile(
    r"^(?:\([\w.-]+ pid=\d+\)\s*)?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:.]+\s+)?(?:\[[^\]]*\]\s*)?"
)
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(?:[A-Z]\w*(?:Error|Exception|Exit)): \S.*")
_MAX_LINE = 500
# pydantic prints the reason on the line after "N validation error(s) for X".
_DETAIL_FOLLOWS = re.compile(r"validation errors? for \w+\s*$")
_KEEPER = Path(__file__).with_name("group_keeper.py")
# After a fatal line the engine usually exits within seconds; one that is neither
# gone nor healthy by then hangs on a dead worker.
_FATAL_GRACE_S = 15.0
# A killed server refuses connections a moment before its exit status can be collected.
_EXIT_WAIT_S = 3.0
# How long SIGKILLed processes may take to be reaped; one stuck in the kernel longer
# is left to the release check, which names it.
_KILL_WAIT_S = 10.0


def _clean(line: str) -> str:
    return _PREFIX.sub("", line.rstrip(), count=1).strip()


def last_exception_line(log_text: str, skip: Sequence[re.Pattern[str]] = ()) -> str | None:
    """The last ``SomeError: message`` line (a traceback's conclusion) that matches
    none of ``skip``, or None."""
    found = None
    for line in log_text.splitlines():
        cleaned = _clean(line)
        if _EXCEPTION.match(cleaned) and not any(p.search(cleaned) for p in skip):
            found = cleaned
    return found


class EngineProcess:
    """One engine server process: start it, wait until it serves, stop it, see its
    devices released.

    The constructor only records what to run; ``start`` starts it. Subclasses (one
    per adapter) set ``fatal_patterns`` and ``wrapper_patterns``, and may widen
    ``release_checks`` or ``port_taken``.
    """

    fatal_patterns: ClassVar[tuple[re.Pattern[str], ...]] = COMMON_FATAL_PATTERNS
    wrapper_patterns: ClassVar[tuple[re.Pattern[str], ...]] = ()
    # (a log pattern, what is known of its cause): engine errors whose own words do not
    # say what the user can do about them.
    known_causes: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = ()

    def __init__(
        self, launch: ServerLaunch, port: int, log_path: Path, npu_ids: tuple[int, ...] = ()
    ) -> None:
        self.launch = launch
        self.port = port
        self.log_path = log_path
        self.npu_ids = npu_ids
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the server (the adapters bind it to the loopback address)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """Process id of the server's group leader (its keeper), also the id of the
        process group."""
        return self._started().pid

    @property
    def returncode(self) -> int | None:
        """The server's exit status (the keeper exits with it); None while it runs."""
        return self._started().returncode

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise EngineError(f"engine process for {self.launch.argv[:3]} used before start()")
        return self._proc

    def environment(self) -> dict[str, str]:
        """The server's whole environment: the launch's variables over what
        ``farm.engines.environment`` lets through (never the farm's secrets)."""
        return child_environment(self.launch.env)

    def start(self) -> None:
        """Start the server in its own session (process group), its output appended
        to the log, with ``environment()``.

        The group's leader is a keeper (``farm.engines.group_keeper``) that runs the
        server and SIGKILLs the whole group, the server's own workers included, when
        the process that called ``start`` dies.
        """
        keeper, command = keeper_command(self.launch.argv)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                keeper,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        assert self._proc.stdin is not None
        # A keeper that died at once closed the pipe; wait_ready reports its exit.
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.write(command)
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()

    def wait_ready(self, timeout_s: float, fatal_grace_s: float = _FATAL_GRACE_S) -> None:
        """Return when the health endpoint answers 200; raise EngineError naming the
        engine's own error line when it exits, or prints a fatal line and neither
        exits nor becomes healthy within ``fatal_grace_s``, or is not ready after
        ``timeout_s``."""
        proc = self._started()
        url = self.url + self.launch.health_path
        deadline = time.monotonic() + timeout_s
        scan = _LogScan(self.log_path, self.fatal_line)
        fatal: str | None = None
        fatal_at = 0.0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                fatal = scan.poll()
                raise EngineError(
                    f"engine exited with code {proc.returncode} during start-up"
                    + _because(fatal or last_exception_line(scan.text()))
                )
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if fatal is None:
                fatal = scan.poll()
                fatal_at = time.monotonic()
            elif time.monotonic() - fatal_at > fatal_grace_s:
                raise EngineError(
                    f"engine reported a fatal error at start and did not exit within "
                    f"{fatal_grace_s:.0f} s: {fatal}"
                )
            time.sleep(0.5)
        raise EngineError(
            f"engine not ready after {timeout_s:.0f} s ({url})"
            + _because(last_exception_line(scan.text()))
        )

    def exited(self, within_s: float = _EXIT_WAIT_S) -> bool:
        """Whether the server has exited, waiting up to ``within_s``: a killed server
        refuses connections a moment before its exit status can be collected.
        Blocks; in an event loop use ``aexited``."""
        try:
            self._started().wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    async def aexited(self, within_s: float = _EXIT_WAIT_S, poll_s: float = 0.05) -> bool:
        """``exited`` for an event loop: polls without blocking it."""
        proc = self._started()
        deadline = time.monotonic() + within_s
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def stop(self, grace_s: float, kill_wait_s: float = _KILL_WAIT_S) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after ``grace_s``.

        Waits at most ``grace_s + kill_wait_s``: a process the kernel does not reap
        after SIGKILL is left for ``wait_released`` to report.
        """
        proc = self._started()
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        # Engine workers live in the same group and may outlive the API process.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=kill_wait_s)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def release_checks(self) -> tuple[DeviceReleaseCheck, ...]:
        """What must be free before the next cell may take this engine's devices:
        its process group gone, and the NPUs idle where ``npu-smi`` exists."""
        return release_checks(self.pid, self.npu_ids)

    def wait_released(self, timeout_s: float, poll_s: float = 0.5) -> tuple[str, ...]:
        """Wait until ``release_checks`` see the devices free (call after ``stop``).

        Returns what still holds them after ``timeout_s`` (empty when free).
        """
        return wait_released(self.release_checks(), timeout_s, poll_s)

    @classmethod
    def fatal_line(cls, log_text: str) -> str | None:
        """The first line of ``log_text`` that matches a fatal pattern (root causes
        before wrappers), cleaned of its worker prefix (with the reason appended when
        it is on the next line); None when there is none."""
        lines = log_text.splitlines()
        for patterns in (cls.fatal_patterns, cls.wrapper_patterns):
            for i, line in enumerate(lines):
                if any(p.search(line) for p in patterns):
                    found = _clean(line)
                    if _DETAIL_FOLLOWS.search(found) and i + 1 < len(lines):
                        found = f"{found}: {_clean(lines[i + 1])}"
                    return found[:_MAX_LINE]
        return None

    def failure_reason(self) -> tuple[str | None, str | None]:
        """Why the engine failed, in its own words: the log's first fatal line, else
        its last exception that only wraps none (a worker's error, not the engine
        core's "see the stack trace above"), else a wrapper; and what is known of that
        error's cause (``known_causes``)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None, None
        lines = text.splitlines()
        root = next(
            (_clean(x) for x in lines if any(p.search(x) for p in self.fatal_patterns)), None
        )
        line = root or last_exception_line(text, self.wrapper_patterns) or self.fatal_line(text)
        known = next((why for pattern, why in self.known_causes if pattern.search(text)), None)
        return (line[:_MAX_LINE] if line else None), known

    @classmethod
    def port_taken(cls, error: str) -> bool:
        """Whether a start-up error says the port was taken (worth one more try)."""
        return _PORT_TAKEN.search(error) is not None


def keeper_command(argv: Sequence[str]) -> tuple[tuple[str, ...], bytes]:
    """The argv that runs ``argv`` under a group keeper (``farm.engines.group_keeper``)
    and what to write to the keeper's stdin (then close it).

    Start it as a session leader (``start_new_session``) from the process whose death
    must end the group; the keeper's pid is the group's id.
    """
    keeper = (sys.executable, "-I", "-S", str(_KEEPER), str(os.getpid()))
    return keeper, json.dumps(list(argv)).encode()


def _because(line: str | None) -> str:
    return f": {line}" if line else ""


class _LogScan:
    """Reads a growing log incrementally and remembers its first fatal line."""

    def __init__(self, path: Path, find_fatal: Callable[[str], str | None]) -> None:
        self._path = path
        self._find_fatal = find_fatal
        self._offset = 0
        self._partial = ""
        self.fatal: str | None = None

    def poll(self) -> str | None:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return self.fatal
        self._offset += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        complete, _, self._partial = text.rpartition("\n")
        if self.fatal is None and complete:
            self.fatal = self._find_fatal(complete)
        return self.fatal

    def text(self) -> str:
        self.poll()
        try:
            return self._path.read_text(errors="replace")
        except OSError:
            return ""

"""A disaggregated prefill/decode cell (deployment pd): two engine servers and a proxy.

One Ray task runs both servers, each an engine process of its own (its own session,
keeper and log), and a small proxy in the runner's process that sends each
completion request through the pair as the engine's own router does (the adapter's
``pd_request``). The runner drives the pair as one :class:`EngineProcess`
(:class:`PdPair`): its URL is the proxy's, whose ``/metrics`` and every other path
are the decode server's, so acceptance (per request and server-wide) is read from the
decode side. Starting starts both; the pair has exited when either server has; stop
stops both (SIGTERM to both groups at once, then each is waited for and SIGKILLed);
the devices are released when both groups are gone. A worker killed under the cell
takes both servers with it: each server's keeper kills its group when the worker
is gone, and the proxy is a thread of the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from farm.engines.base import EngineAdapter
from farm.engines.devices import DeviceReleaseCheck
from farm.engines.process import EngineProcess, ServerLaunch
from farm.errors import EngineError

__all__ = ["PdPair", "prefill_log_path"]

_COMPLETIONS = ("/v1/chat/completions", "/v1/completions")
# Hop-by-hop and length headers are the proxy's own business (RFC 9110 section 7.6.1).
_DROP_HEADERS = {"connection", "content-length", "transfer-encoding", "keep-alive", "host"}
_POLL_S = 0.05
_PROXY_START_S = 30.0


def prefill_log_path(log_path: Path) -> Path:
    """The prefill server's log beside the cell's (``<cell>.log`` is the decode's)."""
    return log_path.with_name(log_path.stem + ".prefill.log")


class PdPair(EngineProcess):
    """The prefill and decode servers of one cell, driven as one engine process.

    ``launch``, ``port`` and ``log_path`` are the decode server's (its argv is the
    cell's recorded argv, its log the cell's log); :attr:`url` is the proxy's.
    """

    def __init__(
        self,
        adapter: EngineAdapter,
        prefill: EngineProcess,
        decode: EngineProcess,
        request_timeout_s: float,
    ) -> None:
        super().__init__(decode.launch, decode.port, decode.log_path, decode.npu_ids)
        self.adapter = adapter
        self.prefill = prefill
        self.decode = decode
        self._proxy = _Proxy(adapter, prefill, decode, request_timeout_s)
        self._started_both = False

    @property
    def servers(self) -> tuple[EngineProcess, EngineProcess]:
        return self.prefill, self.decode

    @property
    def url(self) -> str:
        return self._proxy.url

    @property
    def pid(self) -> int:
        return self.decode.pid

    @property
    def returncode(self) -> int | None:
        """The exit status of the server that exited (the decode's when both did)."""
        for server in (self.decode, self.prefill):
            if server.returncode is not None:
                return server.returncode
        return None

    def start(self) -> None:
        """Start both servers and the proxy. A failure to start the second (or the
        proxy) stops what was started before it is raised."""
        self.prefill.start()
        try:
            self.decode.start()
            self._started_both = True
            self._proxy.start()
        except BaseException:
            self.stop(0)
            raise

    def wait_ready(self, timeout_s: float, fatal_grace_s: float | None = None) -> None:
        """Return when both servers serve; EngineError naming the server (prefill or
        decode) that exited, printed a fatal line or was not ready in time."""
        deadline = time.monotonic() + timeout_s
        for role, server in (("prefill", self.prefill), ("decode", self.decode)):
            remaining = max(deadline - time.monotonic(), 1.0)
            try:
                if fatal_grace_s is None:
                    server.wait_ready(remaining)
                else:
                    server.wait_ready(remaining, fatal_grace_s)
            except EngineError as exc:
                raise EngineError(f"{role} server: {exc}") from None
            other = self.decode if server is self.prefill else self.prefill
            if other.returncode is not None:
                raise EngineError(
                    f"{_role(other, self)} server: engine exited with code "
                    f"{other.returncode} during start-up" + _because(other.failure_reason()[0])
                )

    def exited(self, within_s: float = 3.0) -> bool:
        """Whether either server has exited, waiting up to ``within_s``."""
        deadline = time.monotonic() + within_s
        while not self._either_exited():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    async def aexited(self, within_s: float = 3.0, poll_s: float = _POLL_S) -> bool:
        deadline = time.monotonic() + within_s
        while not self._either_exited():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def _either_exited(self) -> bool:
        return any(s._proc is not None and s._proc.poll() is not None for s in self.servers)

    def stop(self, grace_s: float, kill_wait_s: float = 10.0) -> None:
        """Stop the proxy, SIGTERM both servers' groups at once, then stop each (what
        is left after ``grace_s`` is SIGKILLed); the second is stopped whatever the
        first's stop did."""
        self._proxy.close()
        started = [s for s in self.servers if s._proc is not None]
        for server in started:
            if server._proc is not None and server._proc.poll() is None:
                server._signal_group(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            if started:
                started[0].stop(grace_s, kill_wait_s)
        finally:
            for server in started[1:]:
                server.stop(max(grace_s - (time.monotonic() - t0), 0.0), kill_wait_s)

    def release_checks(self) -> tuple[DeviceReleaseCheck, ...]:
        """Both servers' checks: both groups gone, both device groups idle."""
        return tuple(c for s in self.servers if s._proc is not None for c in s.release_checks())

    def failure_reason(self) -> tuple[str | None, str | None]:
        """The failed server's own words, named by its role: the server that exited
        first (the decode's when neither did or both did), else the other's."""
        order = [self.decode, self.prefill]
        if self.prefill.returncode is not None and self.decode.returncode is None:
            order.reverse()
        for server in order:
            line, known = server.failure_reason()
            if line:
                return f"{_role(server, self)} server: {line}", known
        return None, None

    def port_taken(self, error: str) -> bool:  # type: ignore[override]
        return self.decode.port_taken(error)


def _role(server: EngineProcess, pair: PdPair) -> str:
    return "prefill" if server is pair.prefill else "decode"


def _because(line: str | None) -> str:
    return f": {line}" if line else ""


class _Proxy:
    """The pair's front: completions through the adapter's ``pd_request``, every other
    request to the decode server. Runs its own event loop in a daemon thread, so the
    runner's per-variant event loops can come and go."""

    def __init__(
        self,
        adapter: EngineAdapter,
        prefill: EngineProcess,
        decode: EngineProcess,
        timeout_s: float,
    ) -> None:
        self._adapter = adapter
        self._prefill = prefill
        self._decode = decode
        self._timeout_s = timeout_s
        self._port = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._port = int(sock.getsockname()[1])
        self._thread = threading.Thread(
            target=self._run, args=(sock,), name=f"pd-proxy-{self._port}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(_PROXY_START_S) or self._error is not None:
            raise EngineError(f"the prefill/decode proxy did not start: {self._error}")

    def close(self) -> None:
        if self._loop is not None and self._done is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                self._loop.call_soon_threadsafe(self._done.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self, sock: socket.socket) -> None:
        try:
            asyncio.run(self._serve(sock))
        except BaseException as exc:  # reported by start(), or ends a closed proxy
            self._error = exc
            self._ready.set()

    async def _serve(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=self._timeout_s, limits=limits) as client:
            app = web.Application(client_max_size=64 * 1024**2)
            self._client = client
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            try:
                await web.SockSite(runner, sock).start()
                self._ready.set()
                await self._done.wait()
            finally:
                await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        client = self._client
        assert client is not None
        raw = await request.read()
        try:
            if request.method == "POST" and request.path in _COMPLETIONS:
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    return web.json_response({"error": "request body is not JSON"}, status=400)
                if not isinstance(body, dict):
                    return web.json_response({"error": "request body is not an object"}, status=400)
                upstream = await self._adapter.pd_request(
                    client,
                    self._prefill.url,
                    self._decode.url,
                    _launch(self._prefill),
                    request.path,
                    body,
                )
            else:
                headers = {
                    k: v for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS
                }
                upstream = await client.request(
                    request.method, self._decode.url + request.path_qs, content=raw, headers=headers
                )
        except httpx.TimeoutException as exc:
            return web.json_response({"error": f"no answer from the pair: {exc!r}"}, status=504)
        except (httpx.HTTPError, ValueError, EngineError) as exc:
            return web.json_response({"error": f"prefill/decode pair: {exc!r}"}, status=502)
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_HEADERS}
        headers.pop("content-encoding", None)  # httpx already decoded the body
        return web.Response(body=upstream.content, status=upstream.status_code, headers=headers)


def _launch(process: EngineProcess) -> ServerLaunch:
    return process.launch

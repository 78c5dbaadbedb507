"""FAKE network between a client and its database: a TCP forwarder that can be stopped
(connection refused, as from a server that is down) or silenced (no answer, as behind a
network partition). The ``proxied_url`` fixture (``tests.support.fixtures``) puts one in
front of the test's PostgreSQL database."""

from __future__ import annotations

import asyncio
import contextlib
import threading

__all__ = ["TcpProxy"]


class TcpProxy:
    """A TCP forwarder to ``target`` on a fixed local port that can be stopped and restarted,
    or silenced and resumed.

    Stopped, it closes its listener and every forwarded connection: clients get
    "connection refused", as from a database server that is down. Silenced, it keeps
    accepting and keeps every connection open but forwards nothing either way (what
    it holds goes on when resumed): clients wait for answers that do not come, as
    behind a network partition. Their TCP stack sees a live peer, so only a client's
    own deadline ends the wait.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = 0
        self.silent = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def silence(self) -> None:
        self.silent = True

    def resume(self) -> None:
        self.silent = False

    async def _quiet(self) -> None:
        while self.silent:
            await asyncio.sleep(0.05)

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)  # type: ignore[arg-type]

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        self._call(self._stop())

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._quiet()
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    await self._quiet()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))
        self._tasks.discard(task)  # type: ignore[arg-type]

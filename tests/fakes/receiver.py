"""FAKE webhook receiver: a real HTTP server on 127.0.0.1, in a thread, standing in for
Slack, Feishu, WeCom and generic webhooks.

It records every POST (path, headers, raw body) and answers from a script of (status,
body, headers), 200 ``ok`` when the script is empty; a POST may first hang until the
receiver closes, as a hung server would (its request has landed; its answer never comes
in time, however loaded the machine). Use :func:`receiving` as a context manager, or
the ``receiver`` fixture (:func:`receiver_fixture`), which ``tests/conftest.py`` registers
for every test.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# A hung answer ends when its test does; this bounds it should a test never close.
HANG_LIMIT_S = 60.0

__all__ = ["HANG_LIMIT_S", "Received", "Receiver", "receiver_fixture", "receiving", "serving"]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Records each POST and answers from a script of (status, body, headers); the next
    ``hangs`` POSTs answer only when the receiver closes, as a hung server would."""

    port: int = 0
    requests: list[Received] = field(default_factory=list)
    script: deque[tuple[int, str, dict[str, str]]] = field(default_factory=deque)
    hangs: int = 0
    closed: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, *responses: tuple[int, str] | tuple[int, str, dict[str, str]]) -> None:
        for r in responses:
            self.script.append((r[0], r[1], r[2] if len(r) == 3 else {}))


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serve ``handler`` on a free port of 127.0.0.1, in a thread, until the block
    ends; the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver serving on a free port of 127.0.0.1 until the block ends."""
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            rec.requests.append(Received(self.path, dict(self.headers.items()), body))
            status, text, headers = rec.script.popleft() if rec.script else (200, "ok", {})
            if rec.hangs:
                rec.hangs -= 1
                rec.closed.wait(HANG_LIMIT_S)  # the client gives up first
            data = text.encode()
            try:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client hung up after its read timeout

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as rec.port:
        try:
            yield rec
        finally:
            rec.closed.set()


@pytest.fixture(name="receiver")
def receiver_fixture() -> Iterator[Receiver]:
    """The ``receiver`` fixture: a :func:`receiving` receiver for one test."""
    with receiving() as rec:
        yield rec

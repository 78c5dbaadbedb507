"""A recording reverse proxy between an eval harness and the engine's OpenAI API.

The harness only knows a base URL; the proxy forwards every request to the engine,
adds the variant's request fields the harness leaves unset (thinking via
``chat_template_kwargs``, per-request acceptance switches), and keeps what the farm
needs from each completion: the prompt, the parsed answer with its per-request
speculative counters, the status and the latency. Runs on the runner's event loop.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
from aiohttp import web

from farm.engines.base import Completion, EngineOutputError, read_completion
from farm.frozen import Frozen

__all__ = ["Exchange", "RecordingProxy", "merge_fields", "messages_key", "prompt_key"]

_RECORDED = ("/v1/chat/completions", "/v1/completions")
# Hop-by-hop and length headers are the proxy's own business (RFC 9110 section 7.6.1).
_DROP_HEADERS = {"connection", "content-length", "transfer-encoding", "keep-alive", "host"}


class Exchange(Frozen):
    """One completion request that went through the proxy."""

    index: int
    path: str
    prompt_key: str
    status: int
    latency_s: float
    completion: Completion | None = None
    error: str | None = None


def prompt_key(body: Mapping[str, Any]) -> str:
    """A canonical text of what a request asks (its messages, or its prompt).

    The harness's own sample log carries the same messages, so this key joins its
    per-document scores to the proxy's per-request records.
    """
    if "messages" in body:
        return messages_key(body["messages"])
    return json.dumps(body.get("prompt"), ensure_ascii=False, sort_keys=True)


def messages_key(messages: Sequence[Any]) -> str:
    """The canonical text of chat ``messages`` (role and content of each), as
    :func:`prompt_key` makes it of a request."""
    what = [
        {"role": m.get("role"), "content": m.get("content")}
        for m in messages
        if isinstance(m, dict)
    ]
    return json.dumps(what, ensure_ascii=False, sort_keys=True)


def merge_fields(body: dict[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with the farm's request ``fields`` added where the harness set none.

    Nested objects present on both sides are merged with the farm's keys winning:
    they carry request-level axes (``chat_template_kwargs.enable_thinking``) that
    must hold whatever the harness sends.
    """
    merged = dict(body)
    for key, value in fields.items():
        if key == "messages":
            continue
        if key not in merged:
            merged[key] = value
        elif isinstance(value, dict) and isinstance(merged[key], dict):
            merged[key] = {**merged[key], **value}
    return merged


class RecordingProxy:
    """An HTTP server on 127.0.0.1 (free port) that forwards to ``upstream``.

    ``fields`` are merged into each completion request (see :func:`merge_fields`);
    ``parse`` (an adapter's ``parse_completion``) turns an engine response body into
    a :class:`Completion`; a body it cannot read is recorded as the request's error.
    Use as an
    async context manager; :attr:`url` is the base URL to hand to the harness and
    :attr:`exchanges` the recorded completions, in arrival order.
    """

    def __init__(
        self,
        upstream: str,
        fields: Mapping[str, Any],
        parse: Callable[[dict[str, Any]], Completion],
        timeout_s: float,
    ) -> None:
        self._upstream = upstream.rstrip("/")
        self._fields = dict(fields)
        self._parse = parse
        self._timeout_s = timeout_s
        self._runner: web.AppRunner | None = None
        self._client: httpx.AsyncClient | None = None
        self._port = 0
        self.exchanges: list[Exchange] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    async def __aenter__(self) -> RecordingProxy:
        # No connection cap: the harness's own concurrency is what reaches the engine.
        self._client = httpx.AsyncClient(
            base_url=self._upstream,
            timeout=self._timeout_s,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.aclose()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS}
        if request.method != "POST" or request.path not in _RECORDED:
            return await self._forward(request.method, request.path_qs, raw, headers)
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"error": "request body is not JSON"}, status=400)
        if body.get("stream"):
            # A streamed reply has no final body to read the counters from.
            return web.json_response(
                {"error": "the farm's recording proxy does not support stream=true"}, status=400
            )
        body = merge_fields(body, self._fields)
        index = len(self.exchanges)
        key = prompt_key(body)
        t0 = time.monotonic()
        try:
            upstream = await self._client.post(request.path_qs, json=body, headers=headers)
        except httpx.HTTPError as exc:
            self.exchanges.append(
                Exchange(
                    index=index,
                    path=request.path,
                    prompt_key=key,
                    status=502,
                    latency_s=time.monotonic() - t0,
                    error=f"{type(exc).__name__}: {exc}",
                )
            )
            return web.json_response({"error": f"engine unreachable: {exc}"}, status=502)
        latency = time.monotonic() - t0
        completion = error = None
        if upstream.status_code == 200:
            try:
                completion = read_completion(self._parse, upstream.content)
            except EngineOutputError as exc:
                error = f"unreadable answer: {exc}"
        else:
            error = f"HTTP {upstream.status_code}: {upstream.text[:300]}"
        self.exchanges.append(
            Exchange(
                index=index,
                path=request.path,
                prompt_key=key,
                status=upstream.status_code,
                latency_s=latency,
                completion=completion,
                error=error,
            )
        )
        return _reply(upstream)

    async def _forward(
        self, method: str, path: str, raw: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        assert self._client is not None
        try:
            upstream = await self._client.request(method, path, content=raw, headers=headers)
        except httpx.HTTPError as exc:
            return web.json_response({"error": f"engine unreachable: {exc}"}, status=502)
        return _reply(upstream)


def _reply(upstream: httpx.Response) -> web.Response:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_HEADERS}
    headers.pop("content-encoding", None)  # httpx already decoded the body
    return web.Response(body=upstream.content, status=upstream.status_code, headers=headers)

"""A FAKE engine server for the fault-injection tests: not an engine.

An HTTP server that answers like vLLM's OpenAI server (``/health``, ``/v1/models``,
``/v1/chat/completions``, ``/metrics`` with vLLM's speculative counters) or, on
purpose, as no real engine can be made to: malformed completions, NaN counters,
silence. Standard library only; the farm starts it as an engine process.

Usage: ``python engine_server.py PORT [MODE...]``; modes combine:

- ``empty-choices`` / ``not-json`` / ``wrong-types``: the chat answer to a prompt
  that starts with ``bad`` is ``{"choices": []}`` / not JSON / a completion whose
  fields have the wrong types; other prompts get good answers.
- ``nan-counter`` / ``negative-counter`` / ``text-counter`` / ``backwards-counter``:
  from the second ``/metrics`` scrape on, the drafts counter is NaN / -5 / a word,
  or every counter is lower than in the first scrape.
- ``hang``: chat requests are accepted and never answered; ``/health``,
  ``/v1/models`` and ``/metrics`` answer.
- ``slow``: each chat answer takes one second.
- ``die``: a chat request for a prompt that starts with ``die`` makes the server print
  a traceback ending as vLLM CPU's does on a hybrid model with MTP and prefix caching
  (models/README.md) and exit 1 without answering.
- ``spec-counters``: every good answer carries vLLM's per-request
  ``metrics.speculative_decoding``: 24 verify steps of 3 drafts, each draft accepted
  with a probability set by the prompt (0.45 to 0.85, the same on every run) and
  drawn afresh on each request, so two runs of a prompt differ a little.
  ``spec-drop`` (with it): every draft's probability a third lower, as a regressed build.
  ``seed=N`` (with it): each request's draws come from N and its prompt, so a run is
  reproducible whatever order its requests arrive in; two seeds are two runs.
- ``print-env``: print the environment as one line ``FAKE-ENV {json}`` at start.
- ``spawn-children``: before serving, start two children that sleep (one by
  multiprocessing, as vLLM starts its EngineCore) and print ``FAKE-CHILDREN pids``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_DEATH = """(EngineCore pid=1) ERROR Traceback (most recent call last):
(EngineCore pid=1)   File "vllm/v1/worker/mamba_utils.py", line 1226, in run_fused_precopy
(EngineCore pid=1)     precopy_mamba_align_fused_kernel[grid](
(EngineCore pid=1) TypeError: 'function' object is not subscriptable"""
PORT = int(sys.argv[1]) if __name__ == "__main__" else 0
MODES = frozenset(sys.argv[2:]) if __name__ == "__main__" else frozenset()
_lock = threading.Lock()
_state = {"served": 0, "scrapes": 0}


def _sleep_forever() -> None:
    time.sleep(3600)


def _spec_metrics(prompt: str) -> dict[str, object]:
    """Per-request counters as vLLM writes them (``acceptance_histogram[j]``: steps
    that accepted exactly j drafts)."""
    rate = 0.45 + (zlib.crc32(prompt.encode()) % 41) / 100
    if "spec-drop" in MODES:
        rate *= 2 / 3
    seed = next((m.removeprefix("seed=") for m in MODES if m.startswith("seed=")), None)
    draw = random.Random(f"{seed}:{prompt}").random if seed is not None else random.random
    histogram = [0, 0, 0, 0]
    for _ in range(24):
        accepted = 0
        while accepted < 3 and draw() < rate:
            accepted += 1
        histogram[accepted] += 1
    return {
        "num_spec_steps": 24,
        "num_spec_tokens": 3,
        "num_draft_tokens": 72,
        "num_accepted_draft_tokens": sum(j * n for j, n in enumerate(histogram)),
        "acceptance_histogram": histogram,
    }


def _completion(prompt: str) -> bytes:
    if prompt.startswith("bad"):
        if "empty-choices" in MODES:
            return b'{"choices": []}'
        if "not-json" in MODES:
            return b"<html>502 upstream went away</html>"
        if "wrong-types" in MODES:
            return json.dumps(
                {
                    "choices": [{"message": {"content": 5}, "finish_reason": "stop"}],
                    "usage": {"completion_tokens": "many"},
                }
            ).encode()
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"echo: {prompt}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            **(
                {"metrics": {"speculative_decoding": _spec_metrics(prompt)}}
                if "spec-counters" in MODES
                else {}
            ),
        }
    ).encode()


def _metrics() -> bytes:
    with _lock:
        _state["scrapes"] += 1
        scrape, served = _state["scrapes"], _state["served"]
    drafts, draft_tokens, accepted = 4 * served, 4 * served, 2 * served
    drafts_text = str(float(drafts))
    if scrape >= 2:
        if "nan-counter" in MODES:
            drafts_text = "NaN"
        elif "negative-counter" in MODES:
            drafts_text = "-5"
        elif "text-counter" in MODES:
            drafts_text = "many"
    if "backwards-counter" in MODES and scrape == 1:
        drafts, draft_tokens, accepted = 1000, 1000, 500
        drafts_text = str(float(drafts))
    labels = '{engine="0",model_name="tiny"}'
    lines = [
        f"vllm:spec_decode_num_drafts_total{labels} {drafts_text}",
        f"vllm:spec_decode_num_draft_tokens_total{labels} {float(draft_tokens)}",
        f"vllm:spec_decode_num_accepted_tokens_total{labels} {float(accepted)}",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",'
        f'position="0"}} {float(accepted)}',
    ]
    return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(b"")
        elif self.path == "/v1/models":
            self._send(b'{"object": "list", "data": [{"id": "tiny", "max_model_len": 512}]}')
        elif self.path == "/metrics":
            self._send(_metrics(), "text/plain; version=0.0.4")
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if "hang" in MODES:
            threading.Event().wait()
        if "slow" in MODES:
            time.sleep(1)
        prompt = body["messages"][-1]["content"]
        if "die" in MODES and prompt.startswith("die"):
            print(_DEATH, flush=True)
            os._exit(1)
        with _lock:
            _state["served"] += 1
        self._send(_completion(prompt))


def main() -> None:
    if "print-env" in MODES:
        print("FAKE-ENV " + json.dumps(dict(os.environ)), flush=True)
    if "spawn-children" in MODES:
        core = multiprocessing.get_context("spawn").Process(target=_sleep_forever)
        core.start()
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"FAKE-CHILDREN {core.pid} {other.pid}", flush=True)
    server = ThreadingHTTPServer(("127.0.0.1", PORT), _Handler)
    server.daemon_threads = True
    print(f"FAKE engine serving on 127.0.0.1:{PORT} modes {sorted(MODES)}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

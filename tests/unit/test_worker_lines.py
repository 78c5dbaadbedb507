"""Ray's forwarded worker lines: coloured in a terminal, plain text in a piped log.
The decision, and Ray's own printing under it (no cluster)."""

from __future__ import annotations

import io

import pytest
from ray._private import ray_logging
from ray._private import worker as ray_worker

from farm.orchestrate.worker_lines import colour_wanted, settle_worker_lines


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


TTY, PIPE = _Stream(True), _Stream(False)


@pytest.mark.parametrize(
    ("streams", "env", "wanted"),
    [
        ((TTY, TTY), {}, True),
        ((PIPE, TTY), {}, False),  # stdout to a cron log
        ((TTY, PIPE), {}, False),  # stderr to a file (a worker's stderr lines land there)
        ((PIPE, PIPE), {}, False),
        ((TTY, TTY), {"NO_COLOR": "1"}, False),
        ((TTY, TTY), {"NO_COLOR": ""}, True),  # no-color.org: set and not empty
        ((PIPE, PIPE), {"FORCE_COLOR": "1"}, True),
        ((TTY, TTY), {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
        ((object(), TTY), {}, False),  # no isatty at all
    ],
)
def test_colour_only_in_a_terminal_and_never_with_no_color(
    streams: tuple[object, object], env: dict[str, str], wanted: bool
) -> None:
    assert colour_wanted(streams, env) is wanted


def test_a_closed_stream_is_no_terminal() -> None:
    closed = io.StringIO()
    closed.close()
    assert colour_wanted((closed,), {}) is False


def _printed(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """One worker batch as Ray 2.60's driver prints it under ``env``'s RAY_COLOR_PREFIX."""
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    batch = {
        "pid": "812",
        "ip": "10.0.0.1",
        "localhost": "10.0.0.1",
        "task_name": "vllm-cpu.tiny-step.eager.mtp1.swa-on",
        "lines": ["INFO engine ready"],
    }
    ray_worker.print_worker_logs(batch, out)
    state = ray_logging.DedupState(0, 3, "INFO engine ready", {}, set())  # type: ignore[arg-type]
    return out.getvalue() + state.formatted()


def test_piped_output_makes_rays_prefix_and_dedup_suffix_plain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Restored after the test: settle_worker_lines replaces it for the process.
    monkeypatch.setattr(ray_logging, "_color", ray_logging._color)
    assert "\x1b[" in _printed({}, monkeypatch)  # Ray's default, in a pipe too
    env: dict[str, str] = {"RAY_COLOR_PREFIX": "1"}  # asked for, but the log is a file
    assert settle_worker_lines(env, (PIPE, TTY)) is False
    assert env == {"RAY_COLOR_PREFIX": "0"}
    text = _printed(env, monkeypatch)
    assert "\x1b" not in text
    assert text.startswith("(vllm-cpu.tiny-step.eager.mtp1.swa-on pid=812) INFO engine ready\n")
    assert text.endswith("INFO engine ready [repeated 3x across cluster]")


def test_a_terminal_keeps_rays_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_logging, "_color", ray_logging._color)
    env: dict[str, str] = {"RAY_COLOR_PREFIX": "1"}
    assert settle_worker_lines(env, (TTY, TTY)) is True
    assert env == {"RAY_COLOR_PREFIX": "1"}  # the user's choice of colours stands
    assert "\x1b[" in _printed(env, monkeypatch)

"""How the lines Ray forwards from the farm's workers look where the farm's output lands.

Ray prints each worker's stdout/stderr line in the driver behind a prefix such as
``(vllm-cpu.tiny-step.eager.mtp1.swa-on pid=812)``, coloured with ANSI codes, and
suffixes deduplicated lines with a green ``[repeated 3x across cluster]``. In a
terminal that helps; in a cron or CI log (stdout piped to a file) the codes are
noise. Ray 2.60 decides the prefix colour per line in the driver
(``ray._private.worker.print_worker_logs``): ``RAY_COLOR_PREFIX=0`` leaves it plain,
``1`` colours it per pid, anything else cyan. The dedup suffix is always green
(``ray._private.ray_logging._color``); Ray has no switch for it.

:func:`colour_wanted` is the farm's decision; :func:`settle_worker_lines` applies it
to this process before it starts or joins a Ray cluster.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

__all__ = ["colour_wanted", "settle_worker_lines"]


def colour_wanted(streams: Iterable[Any], environ: Mapping[str, str]) -> bool:
    """Whether forwarded worker lines may carry colour codes.

    ``NO_COLOR`` set to anything (https://no-color.org) says no; else ``FORCE_COLOR``
    set to anything says yes (a CI whose log viewer renders colour); else only when
    every one of ``streams`` (the driver's stdout and stderr: Ray prints a worker's
    stdout lines to one, its stderr lines to the other) is a terminal.
    """
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    return all(_is_terminal(s) for s in streams)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def settle_worker_lines(
    environ: MutableMapping[str, str] | None = None, streams: Iterable[Any] | None = None
) -> bool:
    """Make Ray's forwarded worker lines plain text in this process unless
    :func:`colour_wanted`; returns whether they stay coloured.

    Call before ``ray.init``; Ray reads ``RAY_COLOR_PREFIX`` in the driver at each line,
    so a run that joins another run's cluster decides for its own output. Plain sets
    ``RAY_COLOR_PREFIX=0`` (over any value the caller's environment had: colour codes
    in a log file are never wanted) and makes the dedup suffix plain. Coloured leaves
    Ray as it is (its ``RAY_COLOR_PREFIX``, if set, still chooses the colours).
    """
    env = os.environ if environ is None else environ
    out = (sys.stdout, sys.stderr) if streams is None else streams
    if colour_wanted(out, env):
        return True
    env["RAY_COLOR_PREFIX"] = "0"
    _plain_dedup_suffix()
    return False


def _plain_dedup_suffix() -> None:
    """Ray's ``[repeated Nx across cluster]`` suffix without its colour codes (Ray is
    pinned, ``ray[default]==2.60.0``: a private name, looked up at each call)."""
    from ray._private import ray_logging

    if getattr(ray_logging, "_color", None) is not None:
        ray_logging._color = _uncoloured


def _uncoloured(msg: str) -> str:
    return msg

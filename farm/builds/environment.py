"""How the build stage runs a subprocess: an explicit environment, a deadline, masked text.

Build steps run code the farm does not trust: ``pip install`` of a tree, a git ref or a
pull request runs that source's build backend (``setup.py``, CMake). So a build step
never inherits the worker's environment, which holds the farm's secrets (the store URL
with its password, the Ray, GitHub and Grafana tokens, the notification webhooks).

The rule is the engines' (:func:`farm.engines.environment.child_environment`: the
basics, the libraries' settings, no secret-looking name, no ``FARM_*``) plus what the
build tools read: pip's and git's configuration (``PIP_*``, ``GIT_*``, e.g.
``PIP_FIND_LINKS``, ``GIT_SSL_CAINFO``), ``SETUPTOOLS_SCM_*``, ``CMAKE_*``, compiler
flags and ``MAX_JOBS``; secret-looking names stay dropped under those prefixes too. The
farm's own git commands (never a build backend) also get ``SSH_AUTH_SOCK``, so a
mirror reached over SSH keeps working. Then what the step sets itself.

Not covered: files the build user can read (``~/.netrc``, ``~/.git-credentials``);
keep credentials out of the build user's home, or build in a container.

Every step has a deadline (:class:`farm.settings.BuildSettings`); on expiry its whole
process group is killed and :class:`StepTimeoutError` names the command. Text shown
or stored by the farm is masked first (:mod:`farm.masking`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from farm.engines.environment import child_environment
from farm.errors import BuildError
from farm.masking import looks_secret, mask_argv, mask_text
from farm.settings import get_settings

__all__ = [
    "StepTimeoutError",
    "build_environment",
    "git_environment",
    "run_logged",
    "run_step",
    "stream_step",
]


_BUILD_PREFIXES = ("PIP_", "GIT_", "SETUPTOOLS_SCM_", "CMAKE_")
_BUILD_NAMES = frozenset(
    {"MAX_JOBS", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "PKG_CONFIG_PATH"}
)


class StepTimeoutError(BuildError):
    """A build step ran past its deadline; its processes were killed."""


def build_environment(
    explicit: Mapping[str, str] | None = None, inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of a pip or Python build step (see the module docstring).

    ``inherited`` defaults to this process's environment; ``explicit`` wins.
    """
    source = os.environ if inherited is None else inherited
    env = child_environment({}, source)
    env.update(
        (k, v)
        for k, v in source.items()
        if (k in _BUILD_NAMES or k.startswith(_BUILD_PREFIXES)) and not looks_secret(k)
    )
    env.update(explicit or {})
    return env


def git_environment(
    explicit: Mapping[str, str] | None = None, inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """:func:`build_environment` of the farm's own git commands: with the SSH agent, no
    credential prompt (a private repository fails instead of hanging), git's C locale."""
    source = os.environ if inherited is None else inherited
    env = build_environment({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}, source)
    if "SSH_AUTH_SOCK" in source:
        env["SSH_AUTH_SOCK"] = source["SSH_AUTH_SOCK"]
    env.update(explicit or {})
    return env


# --- running a step ----------------------------------------------------------------------


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _timeout(
    argv: Sequence[str], what: str, timeout_s: float, setting: str, note: str = ""
) -> StepTimeoutError:
    return StepTimeoutError(
        f"could not {what}: no end after {timeout_s:g} s, killed: {' '.join(mask_argv(argv))}"
        f"{note}; raise {setting} if the step is only slow"
    )


def run_step(
    argv: Sequence[str],
    *,
    what: str,
    timeout_s: float,
    kill_wait_s: float,
    setting: str,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end with output captured and no stdin, within ``timeout_s``.

    The step runs in its own session, so on the deadline its whole process group
    (git's ``git-remote-https``, pip's build backend) is SIGKILLed; if the group has
    not let go of its output within ``kill_wait_s`` seconds it is abandoned. Either
    way raises StepTimeoutError naming ``what``, the (masked) command and ``setting``,
    the variable that sets the deadline. Raises FileNotFoundError when the program
    does not exist; a non-zero exit is returned, not raised.
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        note = ""
        try:
            proc.communicate(timeout=kill_wait_s)
        except subprocess.TimeoutExpired:
            note = f" (still holding its output {kill_wait_s:g} s after SIGKILL: abandoned)"
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        raise _timeout(argv, what, timeout_s, setting, note) from None
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def stream_step(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    *,
    what: str,
    timeout_s: float,
    kill_wait_s: float,
    setting: str,
    env: Mapping[str, str],
) -> int:
    """Run ``argv`` with stdout and stderr merged, each line to ``on_line``; return its
    exit status. Deadline and errors as :func:`run_step`."""
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(env),
        start_new_session=True,
    )
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill_group(proc)

    # The lines are read here, so the deadline is kept by a timer thread.
    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            on_line(raw.rstrip("\n"))
    finally:
        timer.cancel()
    try:
        code = proc.wait(timeout=kill_wait_s if expired.is_set() else None)
    except subprocess.TimeoutExpired:
        raise _timeout(argv, what, timeout_s, setting, " (not reaped after SIGKILL)") from None
    if expired.is_set():
        raise _timeout(argv, what, timeout_s, setting)
    return code


def run_logged(
    argv: Sequence[str], what: str, say: Callable[[str], None], *, retry: bool = False
) -> None:
    """Run one pip or Python build step with the build environment (no secrets) and the
    FARM_PIP_TIMEOUT_S deadline, each (masked) output line to ``say``.

    Raises BuildError ``could not <what> (exit N): <command>`` with the last 30 lines;
    with ``retry``, only after a second failure. A step that ran out of time raises
    StepTimeoutError at once (it would only do so again).
    """
    if retry:
        try:
            run_logged(argv, what, say)
        except StepTimeoutError:
            raise
        except BuildError as first:
            say(f"retrying once: {first}".splitlines()[0])
        else:
            return
    tail: list[str] = []

    def line_out(raw: str) -> None:
        nonlocal tail
        line = mask_text(raw.rstrip())
        # pip's find-links warnings repeat per package and say nothing useful.
        if not line or "is ignored: it is neither a file nor a directory" in line:
            return
        tail = [*tail, line][-30:]
        say(line)

    limits = get_settings().builds
    code = stream_step(
        argv,
        line_out,
        what=what,
        timeout_s=limits.pip_timeout_s,
        kill_wait_s=limits.kill_wait_s,
        setting="FARM_PIP_TIMEOUT_S",
        env=build_environment(),
    )
    if code != 0:
        shown = " ".join(mask_argv(argv))
        raise BuildError(f"could not {what} (exit {code}): {shown}\n" + "\n".join(tail))

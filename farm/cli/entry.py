"""The process edge of `farm`: what no command should end in, whatever it was doing.

Every command turns its own FarmErrors into one ``error:`` line (farm.cli.common.fail);
this is the net under them: a FarmError that escapes (FARM_HOME naming a file, read
by a command before its own ``try``) and standard output that cannot be written
(``farm export > /dev/full``: no space left on the device; a closed pipe) end in one
line on standard error and exit status 2, never a traceback. A closed pipe
(``farm sweeps | head``) ends quietly, as for other Unix tools (status 141).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from farm.errors import FarmError

__all__ = ["run_cli"]

_OUTPUT_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EIO, errno.EROFS, errno.EDQUOT)
_SIGPIPE_STATUS = 128 + 13


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass


def _quiet_stdout() -> None:
    # Nothing more may reach the broken stream, nor fail again at interpreter exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def run_cli(app: Callable[..., object], argv: Sequence[str]) -> NoReturn:
    """Run ``app`` (the typer app) with ``argv``; exit with its status."""
    code: int | str | None = 0
    try:
        try:
            app(list(argv))
        finally:
            sys.stdout.flush()  # a full device shows here, not at interpreter exit
    except SystemExit as exc:
        code = exc.code
        try:
            sys.stdout.flush()
        except OSError as err:
            code = _output_failed(err)
    except FarmError as exc:
        _say(f"error: {exc}")
        code = 2
    except OSError as exc:
        if exc.errno not in (*_OUTPUT_ERRORS, errno.EPIPE):
            raise
        code = _output_failed(exc)
    sys.exit(code)


def _output_failed(exc: OSError) -> int:
    _quiet_stdout()
    if exc.errno == errno.EPIPE:
        return _SIGPIPE_STATUS
    _say(f"error: cannot write the output: {exc.strerror or exc}")
    return 2

"""What every `farm` sub-app shares: the consoles, `--db`, the sweep argument, the error
exit.

Errors go to standard error as one line, ``error: <what failed, where, what to do>``,
and exit with status 2 (:func:`fail`); a command never ends in a traceback for a
:class:`~farm.errors.FarmError`.

Nothing printed is read as rich markup: engine errors, file paths, names and store
rows hold brackets (``[/models/m/config.json]``) that markup would eat or choke on.
The consoles have markup off; colour comes from :func:`say`'s ``(text, style)`` parts.

Light on purpose: every command module imports this one, so it imports no store,
SQLAlchemy or engine at module level (`farm --help` must start at once); the store is
imported by the functions that open it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, ConsoleDimensions
from rich.segment import Segment
from rich.text import Text

from farm.errors import FarmError, OutputError
from farm.workflows.common import SWEEP_FORM as _SWEEP_FORM
from farm.workflows.common import resolve_sweep, store_session

if TYPE_CHECKING:
    from sqlmodel import Session

    from farm.analysis.confirm_plan import ConfirmPlan
    from farm.orchestrate.confirm import Landed
    from farm.spec import JobSpec
    from farm.workflows.nightly.confirm import Reruns

__all__ = [
    "PIPED_WIDTH",
    "DbOption",
    "FarmConsole",
    "SweepArg",
    "check_output",
    "check_sweep_statuses",
    "confirm_reruns",
    "console",
    "db_url",
    "err_console",
    "fail",
    "home",
    "open_session",
    "parse_pairs",
    "resolve_sweep",
    "say",
    "write_output",
]

# Wide enough for any table row of the farm: piped output is never wrapped nor cut.
PIPED_WIDTH = 10_000


class FarmConsole(Console):
    """A rich console that, when it does not write to a terminal (cron, CI logs,
    ``farm report > log``), neither wraps nor cuts: each table row and line stays whole
    on one line of the file, whatever ``COLUMNS`` or the invoking terminal's width.

    Rich otherwise lays piped output out at the width of whatever terminal started the
    process (or 80 columns), folding figures across lines. A ``width`` given to the
    constructor is kept. Whether the file is a terminal is asked at each print, as rich
    does: the same console serves the terminal and CliRunner's capture in tests.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._fixed_width = kwargs.get("width") is not None
        super().__init__(**kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._fixed_width or self.is_terminal:
            return size
        return ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._fixed_width = True
        self.width, self.height = new_size

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # The terminal channel's net under every caller (farm.inert.terminal): whatever
        # a table, a Text or a str printed holds, no escape sequence, carriage return or
        # bidirectional override of its text reaches the terminal (`farm plan`'s env and
        # extra_args, a store's rows). Rich's own control segments (cursor moves) pass.
        return super()._render_buffer(_inert_segments(buffer))


def _inert_segments(buffer: Iterable[Segment]) -> Iterator[Segment]:
    from farm.inert import show_controls

    for segment in buffer:
        text = segment.text
        if segment.control or text.isprintable():
            yield segment
        else:
            yield Segment(show_controls(text, "\n\t"), segment.style, segment.control)


console = FarmConsole(markup=False)
err_console = FarmConsole(stderr=True, markup=False)


def say(*parts: str | tuple[str, str], err: bool = False) -> None:
    """Print one line of plain text; a ``(text, style)`` part is coloured, never parsed.

    At a terminal the line wraps between words (a figure is never split by the
    terminal's own wrap); elsewhere it stays one line."""
    from farm.inert import terminal
    from farm.masking import mask_secrets

    def inert(text: str) -> str:
        return terminal(mask_secrets(text), newlines=True)

    target = err_console if err else console
    # A safety net under every caller's own care: no URL credential, no escape sequence.
    shown = [(inert(p[0]), p[1]) if isinstance(p, tuple) else inert(p) for p in parts]
    target.print(Text.assemble(*shown), soft_wrap=not target.is_terminal)


# FARM_DB_URL is read by farm.settings (through store.default_db_url), not by typer.
DbOption = Annotated[
    str | None,
    typer.Option("--db", help="SQLAlchemy URL; default: FARM_DB_URL, else SQLite in FARM_HOME"),
]
OnlyOption = Annotated[list[str] | None, typer.Option("--only", help="AXIS=VALUE; repeatable")]
RayOption = Annotated[str | None, typer.Option(help="join this Ray cluster")]


def _sweep_argument(value: str) -> str:
    # Checked when the command line is parsed: a bad id (not ASCII digits, past what a
    # store column holds) fails before the store opens.
    from farm.bounds import parse_stored_int

    if value != "latest":
        try:
            parse_stored_int(value)
        except ValueError:
            raise typer.BadParameter(_SWEEP_FORM.format(value=value)) from None
    return value


SweepArg = Annotated[str, typer.Argument(help="sweep id or 'latest'", callback=_sweep_argument)]


def fail(problem: FarmError | str, code: int = 2) -> typer.Exit:
    """Print ``error: <problem>`` to standard error; return the exit to raise."""
    say(("error:", "red"), f" {problem}", err=True)
    return typer.Exit(code)


def home() -> Path:
    """FARM_HOME, created when missing; FarmError when it cannot be a folder."""
    from farm.paths import farm_home

    return farm_home()


def db_url(db: str | None) -> str:
    """``--db`` when given, else the configured store (FARM_DB_URL, else SQLite)."""
    if db:
        return db
    from farm.store.urls import default_db_url

    return default_db_url()


def confirm_reruns(job: JobSpec, ray: str | None) -> Reruns:
    """What reruns a sweep's suspicious cells of ``job`` on Ray (a night's, or a PR's:
    :func:`farm.orchestrate.confirm.run_confirmations`), logging beside the farm's."""
    from farm.orchestrate.confirm import run_confirmations

    def reruns(sweep_id: int, plans: Sequence[ConfirmPlan], landed: Landed) -> None:
        run_confirmations(
            job,
            plans,
            home=home(),
            log_dir=home() / "logs" / f"sweep-{sweep_id}-confirm",
            landed=landed,
            ray_address=ray,
        )

    return reruns


@contextmanager
def open_session(db: str | None) -> Iterator[Session]:
    """A session on the existing store at ``--db`` (migrated first); the engine is
    disposed after. Never creates a store: a typo in ``--db`` is an error.

    Raises StoreError when the store does not exist or cannot be reached or migrated,
    StoreDamagedError when it is not a farm store or reading it meets a malformed row
    (the error names the rows).
    """
    with store_session(db_url(db)) as session:
        yield session


def check_sweep_statuses(*statuses: str) -> None:
    """ValueError when a sweep row read in :func:`open_session` holds a status outside
    :data:`~farm.records.SWEEP_STATUSES`: the session then names the damaged row."""
    from farm.records import SWEEP_STATUSES

    if any(s not in SWEEP_STATUSES for s in statuses):
        raise ValueError("a sweep row holds an unknown status")


def check_output(out: Path, db: str | None = None) -> Path:
    """``out`` when a file may be written there; OutputError when it is a folder, its
    folder does not exist, or it is the store's own file (``db`` or the default store).
    Checked before anything is read or written."""
    if out.is_dir():
        raise OutputError(f"--out {out} is a folder; name a file in it")
    if not out.parent.is_dir():
        raise OutputError(f"--out {out}: the folder {out.parent} does not exist")
    from farm.store.urls import normalize_url, sqlite_file

    try:
        store_file = sqlite_file(normalize_url(db_url(db)))
    except FarmError:
        store_file = None  # a malformed URL is reported when the store is opened
    if store_file is not None:
        target = out.resolve()
        own = {Path(f"{store_file}{suffix}").resolve() for suffix in ("", "-wal", "-shm")}
        if target in own:
            raise OutputError(
                f"--out {out} is the store's own file ({store_file}); writing there would "
                "destroy the store, name another file"
            )
    return out


def write_output(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` (checked by :func:`check_output`); OutputError when the
    system refuses."""
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write --out {out}: {exc.strerror or exc}") from None


def parse_pairs(values: Sequence[str] | None, option: str, form: str = "A=B") -> dict[str, str]:
    """``KEY=VALUE`` option values as a mapping; anything else is a usage error that
    quotes the option, the value and the expected ``form``."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise typer.BadParameter(f"{option} {item!r}: expected {form}")
        if key in out:  # a dict would keep the last one without a word
            raise typer.BadParameter(
                f"{option} {item!r}: {key} is given twice ({key}={out[key]} before); give each once"
            )
        out[key] = value
    return out

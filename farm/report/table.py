"""Terminal tables: the plan before a sweep, the measured matrix after it.

Every cell and title is :class:`~rich.text.Text`: names, remaps, reasons and engine
errors hold brackets that rich markup would eat or fail on, whatever the console.

The matrix chooses its layout where it lands. Piped (a log, CI, cron) and at a
terminal wide enough, it is one row per variant with every axis a column. At a
narrower terminal (80 columns) the axis columns fold into the rows' grouping: each
server cell's id on a line of its own, then its variants, so the figures keep their
columns. Either way a figure is never folded nor cut: figure columns do not wrap and
are at least as wide as their widest figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from farm.analysis import VariantSummary
from farm.axes import REQUEST_AXES, axes_text
from farm.inert import terminal
from farm.plan import Plan
from farm.report.figures import (
    FIGURE_HEADINGS,
    matrix_axes,
    matrix_headings,
    row_axes,
    row_figures,
)

__all__ = ["SweepMatrix", "render_matrix", "render_plan"]

_PER_POSITION = "per position"
# Columns of the grouped layout before the figures.
_VARIANT, _STATUS = "variant", "status"
# Narrowest variant label and status of the grouped layout: narrower, an engine error
# folds into more lines than it has words.
_MIN_LABEL, _MIN_STATUS = 8, 12
# Width to measure a table's natural width with.
_UNLIMITED = 100_000


def _texts(values: Iterable[str]) -> list[Text]:
    return [Text(v) for v in values]


def render_plan(plan: Plan, build_ids: dict[str, str] | None = None) -> list[Table]:
    """Cells to run (with remaps) and cells excluded (with reasons)."""
    cells = Table(
        title=Text(f"{plan.job}: {len(plan.cells)} server cells, {plan.variant_count} variants")
    )
    builds = [(build_ids or {}).get(c.engine, c.engine) for c in plan.cells]
    cells.add_column("cell", overflow="fold")
    # A build id is copied into other commands: whole on one line.
    cells.add_column("build", no_wrap=True, min_width=max(map(cell_len, builds), default=5))
    for col in ("graph (planned)", "variants", "remaps"):
        cells.add_column(col, overflow="fold")
    for c, build in zip(plan.cells, builds, strict=True):
        cells.add_row(
            *_texts(
                (
                    c.cell_id,
                    build,
                    c.planned_graph_mode,
                    ", ".join(v.key for v in c.variants),
                    "\n".join(c.remaps) or "-",
                )
            )
        )
    tables = [cells]
    if plan.excluded:
        excluded = Table(title=f"excluded: {len(plan.excluded)}")
        excluded.add_column("axes", overflow="fold")
        excluded.add_column("reason", overflow="fold")
        for e in plan.excluded:
            excluded.add_row(Text(terminal(e.label)), Text(terminal(e.reason)))
        tables.append(excluded)
    return tables


def _status(r: VariantSummary) -> str:
    status = r.status if not r.failed_requests else f"{r.status} ({r.failed_requests} req failed)"
    if r.decided:
        status += f" ({r.decided})"
    if r.error:  # an engine's: no escape sequence reaches the terminal
        status += f": {terminal(r.error[:60], newlines=True)}"
    return status


def _widest(values: Iterable[str], heading: str = "") -> int:
    """Width of the widest value, and of the heading's longest word (headings wrap
    between words, never inside one)."""
    words = heading.split() or [""]
    return max([cell_len(v) for v in values] + [cell_len(w) for w in words])


def _heading(text: str) -> Text:
    # Wraps between words even above a column that does not wrap (its figures).
    return Text(text, no_wrap=False, overflow="fold")


def _one_figure(column: Iterable[str]) -> int:
    """Width of the widest single figure in a column of space-separated figures."""
    return max((cell_len(p) for f in column for p in f.split()), default=1)


def _add_figure_columns(table: Table, figures: Sequence[tuple[str, ...]]) -> None:
    """The figure columns: never wrapped, at least as wide as their widest figure.
    Per position is several figures: it wraps between them, never inside one."""
    for i, heading in enumerate(FIGURE_HEADINGS):
        column = [f[i] for f in figures]
        if heading == _PER_POSITION:
            width = max(_one_figure(column), _widest((), heading))
            table.add_column(_heading(heading), justify="left", min_width=width)
        else:
            table.add_column(
                _heading(heading),
                justify="right",
                no_wrap=True,
                min_width=_widest(column, heading),
            )


def _wide_table(title: str, rows: Sequence[VariantSummary]) -> Table:
    """One row per variant, every shown axis a column."""
    table = Table(title=Text(title))
    shown = matrix_axes(rows)
    for heading in (*matrix_headings(shown), "status"):
        table.add_column(heading, overflow="fold")
    figures = [row_figures(r) for r in rows]
    _add_figure_columns(table, figures)
    for r, f in zip(rows, figures, strict=True):
        table.add_row(*_texts((*row_axes(r, shown), _status(r), *f)))
    return table


def _request_label(r: VariantSummary) -> str:
    request = {a.name: r.axes[a.name] for a in REQUEST_AXES if a.name in r.axes}
    return axes_text(request) if request else "-"


@dataclass(frozen=True)
class _Group:
    """One server cell of the grouped layout: its id line and its variants."""

    heading: Text
    rows: tuple[VariantSummary, ...]


def _groups(rows: Sequence[VariantSummary]) -> list[_Group]:
    by_cell: dict[str, list[VariantSummary]] = {}
    for r in rows:
        by_cell.setdefault(r.cell_id, []).append(r)
    groups = []
    for cell_id, members in by_cell.items():
        heading = Text(cell_id, style="bold")
        requested = members[0].axes.get("graph_mode")
        effective = members[0].effective_graph_mode
        if effective and effective != requested:
            heading.append(f"  (ran {effective})")
        groups.append(_Group(heading, tuple(members)))
    return groups


def _grouped_widths(rows: Sequence[VariantSummary], width: int) -> list[int]:
    """Column widths of the grouped layout within ``width``: the figures' widths are
    fixed; what is left goes to the variant label, the status and per position."""
    labels = [_request_label(r) for r in rows]
    statuses = [_status(r) for r in rows]
    figures = [row_figures(r) for r in rows]
    natural = [_widest(labels, _VARIANT), _widest(statuses, _STATUS)]
    minimum = [min(natural[0], _MIN_LABEL), min(natural[1], _MIN_STATUS)]
    for i, heading in enumerate(FIGURE_HEADINGS):
        column = [f[i] for f in figures]
        full = _widest(column, heading)
        natural.append(full)
        if heading == _PER_POSITION:
            two = min(full, 2 * _one_figure(column) + 1)  # two figures a line at least
            minimum.append(max(two, _widest((), heading)))
        else:
            minimum.append(full)
    # Borderless columns one space apart (see _grouped_table).
    budget = width - (len(natural) - 1)
    widths = list(natural)
    # Shrink the status first, then per position (it wraps between figures), the
    # variant label last.
    for i in (1, 2 + FIGURE_HEADINGS.index(_PER_POSITION), 0):
        excess = sum(widths) - budget
        if excess <= 0:
            break
        widths[i] = max(minimum[i], widths[i] - excess)
    return widths


def _grouped_table(widths: Sequence[int], header: bool) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD,
        show_header=header,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0),
        collapse_padding=True,
    )
    table.add_column(_heading(_VARIANT), width=widths[0], overflow="fold")
    table.add_column(_heading(_STATUS), width=widths[1], overflow="fold")
    for i, heading in enumerate(FIGURE_HEADINGS):
        w = widths[2 + i]
        if heading == _PER_POSITION:
            table.add_column(_heading(heading), width=w, justify="left")
        else:
            table.add_column(_heading(heading), width=w, justify="right", no_wrap=True)
    return table


def _grouped(title: str, rows: Sequence[VariantSummary], width: int) -> Iterator[Text | Table]:
    """The narrow layout: a title, the headings, then per server cell its id on a line
    and its variants beneath, in columns of the same widths throughout."""
    widths = _grouped_widths(rows, width)
    yield Text(title, style="italic")
    yield _grouped_table(widths, header=True)
    for group in _groups(rows):
        yield group.heading
        table = _grouped_table(widths, header=False)
        for r in group.rows:
            table.add_row(*_texts((_request_label(r), _status(r), *row_figures(r))))
        yield table


@dataclass(frozen=True)
class SweepMatrix:
    """The sweep matrix as a rich renderable that lays itself out for its console:
    the wide table when piped or when it fits, the grouped layout otherwise."""

    title: str
    rows: tuple[VariantSummary, ...]

    def wide(self) -> Table:
        return _wide_table(self.title, self.rows)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.wide()
        if not options.is_terminal or not self.rows:
            yield table
            return
        natural = Measurement.get(console, options.update_width(_UNLIMITED), table).maximum
        fits = natural <= options.max_width
        if fits:
            yield table
        else:
            yield from _grouped(self.title, self.rows, options.max_width)


def render_matrix(title: str, rows: tuple[VariantSummary, ...]) -> SweepMatrix:
    """The sweep matrix: one row per variant with acceptance and agreement figures,
    laid out for the console it is printed on (see the module docstring)."""
    return SweepMatrix(title, rows)

"""The sweep matrix as a grid of AL differences. Pure.

:func:`al_grid` lays the spec-on variants of a sweep out as rows = graph mode x MTP
depth x sliding window and columns = thinking x workload x engine (x model when the
sweep has several), each holding its AL minus the AL of its *reference*: eager at the
same other axes (``mode="graph"``), or the base engine at the same other axes
(``mode="engine"``). Where a check judged the same pair, the cell carries the
verdict's interval and whether it regressed. :mod:`farm.report.heatmap` draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from farm.analysis.check_rules import CheckReport, CheckVerdict
from farm.analysis.summary import VariantSummary
from farm.axes import REQUEST_AXES, SERVER_AXES, AxisValue, axes_text, axis, explicit, speculates
from farm.records import CellResult, SweepRecord
from farm.report.svg import nice_limit

__all__ = ["GRAPH_ORDER", "Grid", "GridCell", "GridMode", "al_grid"]


GridMode = Literal["graph", "engine"]


CellKind = Literal["value", "reference", "failed", "missing", "no_reference"]


GRAPH_ORDER = ("eager", "compiled", "piecewise", "full_decode_only", "full")


@dataclass(frozen=True)
class GridCell:
    """One variant in the grid; ``difference`` = AL - reference AL."""

    kind: CellKind
    label: str = ""
    al: float | None = None
    reference_al: float | None = None
    difference: float | None = None
    interval: tuple[float, float] | None = None
    flagged: bool = False
    detail: str = ""
    reference_label: str | None = None


@dataclass(frozen=True)
class Grid:
    """Rows x columns of :class:`GridCell`, with what the reference is."""

    mode: GridMode
    reference: str
    row_axis: str
    col_axis: str
    rows: tuple[str, ...]
    cols: tuple[tuple[str, ...], ...]
    cells: tuple[tuple[GridCell, ...], ...]

    @property
    def limit(self) -> float:
        """Half-range of the colour scale: the largest |difference|, rounded up."""
        diffs = [abs(c.difference) for r in self.cells for c in r if c.difference is not None]
        return nice_limit(max(diffs, default=0.0))


def _graph_rank(mode: str) -> tuple[int, str]:
    return (GRAPH_ORDER.index(mode) if mode in GRAPH_ORDER else len(GRAPH_ORDER), mode)


# Which axes lay out the grid: server axes down (graph mode first, the reference axis
# of mode "graph"), request axes and the engine/model lists across.
_ROW_AXES = tuple(a.name for a in SERVER_AXES if a.source == "axes")


_COL_AXES = (
    *(a.name for a in REQUEST_AXES),
    *(a.name for a in SERVER_AXES if a.source != "axes"),
)


@dataclass(frozen=True)
class _Slot:
    """A planned variant: its axis values (planned graph mode) and what it measured."""

    axes: dict[str, AxisValue]
    label: str
    al: float | None
    failed: bool
    error: str

    @property
    def row(self) -> tuple[AxisValue, ...]:
        return tuple(self.axes[k] for k in _ROW_AXES)

    @property
    def col(self) -> tuple[AxisValue, ...]:
        return tuple(self.axes[k] for k in _COL_AXES)

    def moved(self, **values: AxisValue) -> tuple[tuple[AxisValue, ...], tuple[AxisValue, ...]]:
        """(row, col) of the slot with ``values`` in place of its own."""
        axes = {**self.axes, **values}
        return tuple(axes[k] for k in _ROW_AXES), tuple(axes[k] for k in _COL_AXES)


def _slots(sweep: SweepRecord, summaries: Sequence[VariantSummary]) -> list[_Slot]:
    by_label = {s.label: s for s in summaries if s.label}
    out = []
    for stored in sweep.cells:
        c = stored.cell
        failed = stored.result is not None and stored.result.status != "ok"
        for v in c.variants:
            label = c.variant_label(v.axes)
            s = by_label.get(label)
            out.append(
                _Slot(
                    axes=c.variant_key(v.axes).axis_values(),
                    label=label,
                    al=None if failed or s is None else s.mean_acceptance_length,
                    failed=failed,
                    error=_error(stored.result),
                )
            )
    return out


def _row_order(row: tuple[AxisValue, ...]) -> tuple[object, ...]:
    return (_graph_rank(str(row[_ROW_AXES.index("graph_mode")])), *row)


def _labels(names: Sequence[str]) -> str:
    return ", ".join(axis(k).label for k in names)


def al_grid(
    sweep: SweepRecord,
    summaries: Sequence[VariantSummary],
    report: CheckReport | None = None,
    *,
    mode: GridMode = "graph",
    base_engine: str | None = None,
) -> Grid:
    """The AL-difference grid of ``sweep`` (spec-on variants only: MTP 0 has no AL).

    ``base_engine`` (``mode="engine"``) defaults to the sweep's first engine. Failed
    cells are placed in every column of their planned variants; combinations the
    sweep did not plan are ``missing``.
    """
    slots = _slots(sweep, summaries)
    first_seen = {k: list(dict.fromkeys(s.axes[k] for s in slots)) for k in _COL_AXES}
    base = base_engine or str(next(iter(first_seen["engine"]), ""))
    spec_on = [s for s in slots if speculates(int(s.axes["mtp_depth"]))]
    rows = sorted({s.row for s in spec_on}, key=_row_order)
    cols = sorted(
        {s.col for s in spec_on},
        key=lambda c: tuple(first_seen[k].index(v) for k, v in zip(_COL_AXES, c, strict=True)),
    )
    at = {(s.row, s.col): s for s in spec_on}

    def reference_of(s: _Slot) -> _Slot | None:
        return at.get(s.moved(graph_mode="eager") if mode == "graph" else s.moved(engine=base))

    verdicts = _al_verdicts(report)
    findings = _flagged(report)
    cells = tuple(
        tuple(
            _grid_cell(at.get((r, c)), reference_of, mode, base, verdicts, findings) for c in cols
        )
        for r in rows
    )
    # Labels read engine (model when several), then the request axes; an axis every
    # column holds at its implicit value is left out, as the labels leave it out.
    col_names = [
        k
        for k in (*_COL_AXES[len(REQUEST_AXES) :], *_COL_AXES[: len(REQUEST_AXES)])
        if (k != "model" or len(first_seen[k]) > 1)
        and (axis(k).implicit is None or first_seen[k] != [axis(k).implicit])
    ]
    col_labels = tuple(
        tuple(
            axis(k).text(v)
            for k in col_names
            for v in (explicit(dict(zip(_COL_AXES, c, strict=True))).get(k),)
            if v is not None
        )
        for c in cols
    )
    held = [k for k in (*_ROW_AXES, *_COL_AXES) if k not in ("graph_mode", "engine", "model")]
    reference = (
        f"eager at the same {_labels(held)} and engine"
        if mode == "graph"
        else f"engine {base} at the same {_labels(['graph_mode', *held])}"
    )
    return Grid(
        mode=mode,
        reference=reference,
        row_axis=" · ".join(axis(k).label for k in _shown_row_axes(rows)),
        col_axis=" · ".join(axis(k).label for k in col_names),
        rows=tuple(axes_text(dict(zip(_ROW_AXES, r, strict=True)), " · ") for r in rows),
        cols=col_labels,
        cells=cells,
    )


def _shown_row_axes(rows: Sequence[tuple[AxisValue, ...]]) -> tuple[str, ...]:
    """The row axes a reader needs named: an axis added later whose every row holds its
    implicit value (the job does not vary it) is left out, as the rows' labels leave
    its value out."""
    return tuple(
        k
        for i, k in enumerate(_ROW_AXES)
        if axis(k).implicit is None or any(r[i] != axis(k).implicit for r in rows)
    )


def _grid_cell(
    slot: _Slot | None,
    reference_of: Callable[[_Slot], _Slot | None],
    mode: GridMode,
    base: str,
    verdicts: dict[tuple[str, str], CheckVerdict],
    findings: dict[str, list[str]],
) -> GridCell:
    if slot is None:
        return GridCell(kind="missing", detail="not planned in this sweep")
    if slot.failed:
        return GridCell(kind="failed", label=slot.label, detail=f"{slot.label}: {slot.error}")
    if slot.al is None:
        return GridCell(kind="missing", label=slot.label, detail=f"{slot.label}: no AL measured")
    flagged = slot.label in findings
    notes = [slot.label, f"AL {slot.al:.3f}", *findings.get(slot.label, [])]
    is_ref = slot.axes["graph_mode"] == "eager" if mode == "graph" else slot.axes["engine"] == base
    if is_ref:
        return GridCell(
            kind="reference",
            label=slot.label,
            al=slot.al,
            flagged=flagged,
            detail="\n".join([*notes, "the reference of this comparison"]),
        )
    ref = reference_of(slot)
    if ref is None or ref.al is None:
        return GridCell(
            kind="no_reference",
            label=slot.label,
            al=slot.al,
            flagged=flagged,
            reference_label=ref.label if ref is not None else None,
            detail="\n".join([*notes, "no reference result (failed or not planned)"]),
        )
    diff = slot.al - ref.al
    v = verdicts.get((slot.label, ref.label))
    interval = (v.difference.low, v.difference.high) if v is not None else None
    ci = f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else ""
    notes.insert(2, f"reference {ref.label}: AL {ref.al:.3f}; difference {diff:+.3f}{ci}")
    return GridCell(
        kind="value",
        label=slot.label,
        al=slot.al,
        reference_al=ref.al,
        difference=diff,
        interval=interval,
        flagged=flagged,
        detail="\n".join(notes),
        reference_label=ref.label,
    )


def _error(result: CellResult | None) -> str:
    if result is None:
        return "not run"
    if not result.error:
        return result.status
    return f"{result.status}: {result.error.splitlines()[0][:160]}"


def _al_verdicts(report: CheckReport | None) -> dict[tuple[str, str], CheckVerdict]:
    """AL verdicts by (candidate label, reference label)."""
    return {
        (v.candidate.label, v.reference.label): v
        for v in (report.verdicts if report else ())
        if v.metric == "mean_acceptance_length"
    }


def _flagged(report: CheckReport | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in report.regressions if report else ():
        out.setdefault(f.candidate.label, []).append(f"FINDING {f.describe()}")
    return out

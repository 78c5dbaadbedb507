"""`farm goldens`: the spec-decode goldens teams keep (vllm-ascend's case files).

``show`` prints what a case file or folder gates; ``check`` holds a stored sweep to
them through the one judgement (:func:`farm.analysis.judgement.judge`). A job names
its goldens with ``goldens: [path, ...]``; `farm nightly` and `farm pr` then hold
every verdict to them. The stages are imported inside the commands: this module
loads only typer, rich and the CLI's common parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.common import DbOption, SweepArg, console, fail, open_session, resolve_sweep, say
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.records import SweepRecord
    from farm.spec.goldens import Golden, GoldenCheck

__all__ = ["goldens_app"]

goldens_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Spec-decode goldens (vllm-ascend case files): show them, hold a sweep to them.",
    no_args_is_help=True,
)


@goldens_app.command()
def show(
    path: Annotated[Path, typer.Argument(help="a case file (YAML) or a folder of them")],
) -> None:
    """Print the spec-decode goldens of a case file or folder: case, model, method and
    k, the per-position baseline, its threshold (absolute), dataset and batch size.
    Exit status 2 when a case file is malformed (file, line and key named)."""
    from farm.report.golden_table import render_goldens
    from farm.spec.goldens import read_goldens

    try:
        goldens = read_goldens(path)
    except FarmError as exc:
        raise fail(exc) from None
    console.print(render_goldens(goldens, f"{path}: {len(goldens)} golden(s)"))


def _read(paths: list[Path]) -> list[Golden]:
    from farm.spec.goldens import read_goldens

    return [g for p in paths for g in read_goldens(p)]


def _bind(
    goldens: list[Golden], record: SweepRecord, model: str | None, workload: str | None
) -> tuple[GoldenCheck, ...]:
    """The goldens bound to the sweep's models (by name, or ``--model``); FarmError
    when ``--model`` / ``--workload`` name none of the sweep's, or no golden is for a
    model the sweep ran."""
    from farm.spec.goldens import bind_goldens

    models = sorted({c.cell.model for c in record.cells})
    workloads = sorted({str(v.axes["workload"]) for c in record.cells for v in c.cell.variants})
    for option, value, known in (("--model", model, models), ("--workload", workload, workloads)):
        if value is not None and value not in known:
            raise FarmError(
                f"{option} {value}: sweep {record.sweep_id} ran no such {option[2:]} "
                f"(it ran {', '.join(known) or 'none'})"
            )
    checks = bind_goldens(goldens, {m: (m,) for m in models}, model=model, workload=workload)
    if not checks:
        raise FarmError(
            f"no golden is for a model of sweep {record.sweep_id}: the goldens are for "
            f"{', '.join(sorted({g.model for g in goldens}))}, the sweep ran "
            f"{', '.join(models) or 'none'}; name the sweep's model with --model"
        )
    return checks


@goldens_app.command()
def check(
    sweep: SweepArg,
    goldens: Annotated[
        list[Path],
        typer.Option("--goldens", help="a case file or a folder of them; repeatable"),
    ],
    model: Annotated[
        str | None,
        typer.Option(help="hold every golden to this model of the sweep (default: by name)"),
    ] = None,
    workload: Annotated[
        str | None, typer.Option(help="only this workload's variants (default: every one)")
    ] = None,
    db: DbOption = None,
) -> None:
    """Hold a stored sweep's variants to the goldens: at MTP depth k, acceptance at
    each draft position must reach the golden's baseline minus its threshold.

    A golden is for the sweep's model whose name is the golden's model or its last
    path part (case aside), or for the model `--model` names. One line per miss, with
    the farm's request-level interval beside it. Exit status: 0 every position held,
    1 a golden was missed, 2 bad input, store unreachable, or no variant held to any
    golden.
    """
    from farm.analysis.judgement import GOLDEN_CHECK, judge
    from farm.analysis.rules import golden_rules
    from farm.store.cells import load_sweep

    try:
        found = _read(goldens)
        with open_session(db) as session:
            record = load_sweep(session, resolve_sweep(session, sweep))
        checks = _bind(found, record, model, workload)
        judgement = judge(record, None, None, golden_rules(checks))
    except FarmError as exc:
        raise fail(exc) from None
    misses = [f for f in judgement.findings if f.check == GOLDEN_CHECK]
    held = judgement.comparisons
    style = "red" if misses else "green"
    say(
        (
            f"sweep {record.sweep_id} ({record.job}): {len(checks)} golden(s), {held} "
            f"golden x variant pair(s) held, {len(misses)} position(s) missed",
            style,
        )
    )
    for f in judgement.findings:
        say(("  " + f.source, "bold"), f" {f.shown_check}: {f.summary}")
    for note in judgement.notes:
        say(("  note:", "yellow"), f" {note}")
    if not held:
        raise fail("no variant of the sweep was held to a golden (see the notes); not a pass")
    if misses:
        raise typer.Exit(1)

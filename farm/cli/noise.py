"""`farm noise JOB`: each key's run-to-run variation over the job's last nights."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from farm.cli.common import DbOption, console, fail, open_session
from farm.cli.inputs import LIMIT
from farm.errors import FarmError
from farm.inert import terminal

__all__ = ["noise_app"]

noise_app = typer.Typer(rich_markup_mode="markdown")


@noise_app.command()
def noise(
    job: Annotated[str, typer.Argument(help="job name (as `farm sweeps` lists it)")],
    nights: Annotated[int, typer.Option(help="the job's last this many sweeps", parser=LIMIT)] = 14,
    db: DbOption = None,
) -> None:
    """Each key's night-to-night spread: AL (the sd the nightly's thresholds are
    calibrated with, and relative to AL), acceptance per draft position, accuracy,
    and how often a prompt's greedy output differs from the night before.

    Reads the job's last NIGHTS sweeps only, whatever the store holds. Run clean
    repeats (`farm nightly JOB.yaml --aa`) to measure an engine's own noise: "A/A"
    counts each key's A/A nights and those with a false alarm on it.
    """
    from farm.analysis.noise import noise_table
    from farm.store.cells import load_sweep
    from farm.store.summaries import job_sweeps
    from farm.store.verdicts import list_verdicts

    try:
        with open_session(db) as session:
            ids = [s.id for s in job_sweeps(session, job)[:nights]]
            if not ids:
                raise FarmError(f"no sweep of job {job!r}; `farm sweeps` lists the jobs' sweeps")
            aa = [v for vs in list_verdicts(session, ids).values() for v in vs if v.kind == "aa"]
            rows = noise_table([load_sweep(session, i) for i in ids], aa)
    except FarmError as exc:
        raise fail(exc) from None
    table = Table(title=f"run-to-run noise of {job}: sweeps {min(ids)}..{max(ids)}")
    columns = ("key", "nights", "AL", "AL sd", "per position sd", "accuracy sd", "flips", "A/A")
    for col in columns:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            Text(terminal(r.key.label)),
            str(r.nights),
            f"{r.al_mean:.3f}",
            f"{r.al_sd:.4f} ({r.al_relative_sd:.2%})",
            " ".join(f"{x:.3f}" for x in r.position_sd) or "-",
            "-" if r.accuracy_sd is None else f"{r.accuracy_sd:.3f}",
            "-" if r.flip_rate is None else f"{r.flip_rate:.0%}",
            f"{r.aa_false_alarms} false alarm(s) in {r.aa_nights}" if r.aa_nights else "-",
        )
    console.print(table)
    console.print(
        "sd: night to night, robust (1.4826 x median |change| / sqrt2); flips: prompts "
        "whose output differs from the night before; A/A: false alarms in the key's A/A "
        "nights (`farm nightly --aa`)"
    )

"""Numbers and shapes. Stored JSON columns that are valid JSON of
the wrong shape (a verdict's findings, its baseline sweep ids, a bisection's commits,
ends, first bad position, a step's position and figures; a cell's axes, remaps,
planned variants, effective configuration and argv; a variant run's and an excluded
cell's axes; a build's pins and patches; an alert's details) are refused naming the
table, the row and the column, in every command that reads them; a position of -1 is no
position. Ids past 2**63 - 1 are refused where they are given, on SQLite and
PostgreSQL alike, before the store is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from tests.support.stores import fill_with_verdict

runner = CliRunner()
HUGE = str(2**63)


def _set(url: str, table: str, column: str, value: object) -> None:
    engine = sa.create_engine(store.normalize_url(url))
    try:
        with engine.begin() as c:
            raw = json.dumps(value) if not isinstance(value, int) or column != "x" else value
            if column in ("first_bad", "last_good", "position"):
                c.execute(sa.text(f"UPDATE {table} SET {column} = :v"), {"v": value})
            else:
                c.execute(sa.text(f"UPDATE {table} SET {column} = :v"), {"v": raw})
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'farm.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    fill_with_verdict(url)
    return url


def _run(url: str, *argv: str) -> tuple[int, str]:
    result = runner.invoke(
        app, list(argv), env={"FARM_DB_URL": url, "COLUMNS": "250", "FARM_HOME": None}
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


BISECTION_FORMS = [["report", "--bisection", "1"], ["report", "--bisection", "1", "--format", "md"]]

SHAPES = {
    "verdict-findings-number": ("verdict", 1, "findings", 7, [["sweeps"]]),
    "verdict-findings-strings": ("verdict", 1, "findings", ["x"], [["sweeps"]]),
    "verdict-baseline-ids-objects": ("verdict", 1, "baseline_sweep_ids", [{"a": 1}], [["sweeps"]]),
    "verdict-baseline-ids-negative": ("verdict", 1, "baseline_sweep_ids", [-3], [["sweeps"]]),
    "bisection-commits-object": ("bisection", 1, "commits", {"a": 1}, BISECTION_FORMS),
    "bisection-commits-empty": ("bisection", 1, "commits", [], BISECTION_FORMS),
    "bisection-endpoints-list": ("bisection", 1, "endpoints", [1, 2], BISECTION_FORMS),
    "bisection-endpoints-no-bad": (
        "bisection",
        1,
        "endpoints",
        {"good": {"commit": "0" * 40, "build_id": "g"}},
        BISECTION_FORMS,
    ),
    "bisection-regressed-list": ("bisection", 1, "regressed", ["x"], BISECTION_FORMS),
    "bisection-first-bad-minus-one": ("bisection", 1, "first_bad", -1, BISECTION_FORMS),
    "bisection-first-bad-past-end": ("bisection", 1, "first_bad", 99, BISECTION_FORMS),
    "step-position-minus-one": ("bisect_step", 1, "position", -1, BISECTION_FORMS),
    "step-figures-number": ("bisect_step", 1, "figures", 3, BISECTION_FORMS),
}


@pytest.mark.parametrize(
    "argv",
    [
        ["report", HUGE],
        ["export", HUGE],
        ["compare", "1", HUGE],
        ["alerts", "ack", HUGE],
        ["alerts", "resolve", HUGE],
        ["alerts", "check", HUGE],
        ["alerts", "list", "--limit", HUGE],
        ["sweeps", "--limit", HUGE],
        ["sweeps", "--limit", "-1"],
        ["report", "--bisection", HUGE],
        ["report", "1", "--bisection", "-4"],
        ["run", "jobs/local.yaml", "--resume", "\u00b2"],
        ["nightly", "jobs/local.yaml", "--resume", HUGE],
        ["bisect", "jobs/local.yaml", "--from-alert", HUGE],
        ["bisect", "jobs/local.yaml", "--resume", HUGE],
        ["db", "prune", "--text-older-than", "999999999d"],
        ["db", "prune", "--text-older-than", "99999999999999999999w"],
    ],
)
def test_ids_limits_and_ages_past_what_a_store_holds_are_refused(
    db_url: str, argv: list[str]
) -> None:
    code, output = _run(db_url, *argv)
    assert code == 2, output
    assert "PostgreSQL running" not in output
    assert "is not" in output or "expected" in output or "longer than" in output, output


SWEEP_FORMS = [["report", "1"], ["export", "1"]]
ROW_SHAPES = {
    **SHAPES,
    "cell-axes-list": ("cell", 1, "axes", [1, 2], SWEEP_FORMS),
    "cell-axes-depth-text": ("cell", 1, "axes", {"mtp_depth": "three"}, SWEEP_FORMS),
    "cell-remaps-number": ("cell", 1, "remaps", 5, SWEEP_FORMS),
    "cell-variants-strings": ("cell", 1, "variants", ["x"], SWEEP_FORMS),
    "cell-effective-list": ("cell", 1, "effective", [1], SWEEP_FORMS),
    "cell-argv-object": ("cell", 1, "argv", {"a": 1}, SWEEP_FORMS),
    "variant-run-axes-list": ("variant_run", 1, "axes", [1], SWEEP_FORMS),
    "excluded-axes-text": ("excluded_cell", 1, "axes", "x", SWEEP_FORMS),
    "build-pins-number": ("build", "b1", "pins", 3, SWEEP_FORMS),
    "build-patches-objects": ("build", "b1", "patches", [{"a": 1}], SWEEP_FORMS),
    "alert-details-list": ("alert", 1, "details", [1], [["alerts", "list"]]),
}


@pytest.mark.parametrize(
    "table,row,column,value,commands", ROW_SHAPES.values(), ids=ROW_SHAPES.keys()
)
def test_a_stored_json_column_of_the_wrong_shape_names_table_row_and_column(
    db_url: str, table: str, row: object, column: str, value: object, commands: list[list[str]]
) -> None:
    _set(db_url, table, column, value)
    for argv in commands:
        code, output = _run(db_url, *argv)
        assert code == 2, output
        assert f"row {table} id={row}: {column}" in output, output

"""Bad input that needs a real store (SQLite files, PostgreSQL databases): damaged rows,
databases that are not the farm's, damaged schemas, output paths onto the store,
``--resume`` of another job, a read-only store, and text with brackets read back.

Each case exits 2 through typer's CliRunner with what and where, no traceback, and
writes nothing: a read command leaves the store file byte for byte as it was, and no
command adds a sweep row. The pure cases are in tests/unit/test_bad_input.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import typer.main
import typer.testing
from click.testing import Result
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from tests.support.stores import BRACKETS, fill_store

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
# typer's runner builds the click command tree on every invoke (0.2 s): build it once.
COMMAND = typer.main.get_command(app)


@pytest.fixture(autouse=True)
def _command_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    build = typer.testing._get_command
    monkeypatch.setattr(typer.testing, "_get_command", lambda a: COMMAND if a is app else build(a))


# --- A store with one sweep: an ok cell, a failed one (brackets), a build, an alert ----


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("template")
    path = folder / "farm.db"
    fill_store(f"sqlite:///{path}")
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture
def db(template: Path, tmp_path: Path) -> Path:
    """A copy of the template store for one test."""
    path = tmp_path / "farm.db"
    shutil.copyfile(template, path)
    return path


def sql(path: Path, *statements: str) -> None:
    """Run ``statements`` on a SQLite file as a damaged or foreign writer would:
    check constraints off."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA ignore_check_constraints=ON")
        for statement in statements:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def invoke(argv: list[str], tmp_path: Path) -> Result:
    env = {"COLUMNS": "200", "FARM_HOME": str(tmp_path / "home"), "FARM_DB_URL": None}
    return runner.invoke(app, argv, env=env)


def assert_refused(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"


def sweeps_in(path: Path) -> int:
    with sqlite3.connect(path) as c:
        return int(c.execute("SELECT count(*) FROM sweep").fetchone()[0])


def test_the_template_store_reads(db: Path, tmp_path: Path) -> None:
    for argv in (["report", "1"], ["sweeps"], ["export", "1"], ["alerts", "list"]):
        result = invoke([*argv, "--db", f"sqlite:///{db}"], tmp_path)
        assert result.exit_code == 0, (argv, result.output)


# --- Text with brackets read back from the store ----------------------------------


@pytest.mark.parametrize(
    "argv,shown",
    [
        (["report", "1"], "[/models/m/config.json]"),  # the status column, cut at 60
        (["report", "1"], "cannot run [full]"),  # the excluded cell's reason
        (["export", "1"], BRACKETS),
        (["alerts", "list"], "[/models/m/config.json]"),
        (["alerts", "check", "1", "--no-notify"], "[/models/m/config.json]"),
        (["sweeps"], "local"),
    ],
    ids=["report-error", "report-excluded", "export", "alerts-list", "alerts-check", "sweeps"],
)
def test_stored_text_with_brackets_is_printed_verbatim(
    argv: list[str], shown: str, db: Path, tmp_path: Path
) -> None:
    result = invoke([*argv, "--db", f"sqlite:///{db}"], tmp_path)
    assert result.exit_code in (0, 1), result.output  # alerts check: 1 when a channel failed
    assert ("Traceback" not in result.output and result.exception is None) or isinstance(
        result.exception, SystemExit
    )
    assert shown in result.output, result.output


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_a_report_file_of_the_failed_cell_is_written(fmt: str, db: Path, tmp_path: Path) -> None:
    out = tmp_path / f"r.{fmt}"
    argv = ["report", "1", "--format", fmt, "--out", str(out), "--db", f"sqlite:///{db}"]
    result = invoke(argv, tmp_path)
    assert result.exit_code == 0, result.output
    assert "[/models/m/config.json]" in out.read_text()


# --- Malformed rows: named, exit 2, the store unchanged ---------------------------

FIRST_CELL = "(SELECT min(id) FROM cell)"
DAMAGE: dict[str, tuple[str, str, list[list[str]]]] = {
    # statement, what the message names, the read commands that meet the row
    "cell-variants-json": (
        f"UPDATE cell SET variants = '{{bad' WHERE id = {FIRST_CELL}",
        "row cell id=1: variants: '{bad' is not valid JSON",
        [["report", "1"], ["export", "1"], ["alerts", "check", "1", "--no-notify"]],
    ),
    "cell-remaps-json": (
        f"UPDATE cell SET remaps = '[\"a\",' WHERE id = {FIRST_CELL}",
        "row cell id=1: remaps:",
        [["report", "1"], ["report", "1", "--format", "md", "--out", "OUT"]],
    ),
    "cell-effective-json": (
        f"UPDATE cell SET effective = 'nope' WHERE id = {FIRST_CELL}",
        "row cell id=1: effective:",
        [["export", "1"]],
    ),
    "variant-axes-json": (
        "UPDATE variant_run SET axes = '{' WHERE id = 1",
        "row variant_run id=1: axes:",
        [["report", "1"], ["export", "1"]],
    ),
    # A variant's requests are one packed row of JSON lists (request_numbers).
    "request-counters-json": (
        "UPDATE request_numbers SET accepted_per_pos = '[[1], ' WHERE variant_run_id = 2",
        "row request_numbers variant_run_id=2 of sweep 1: accepted_per_pos: '[[1], ' is not "
        "valid JSON",
        [["export", "1"], ["report", "1"]],
    ),
    "request-lists-of-different-lengths": (
        "UPDATE request_numbers SET completion_tokens = '[10]' WHERE variant_run_id = 1",
        "row request_numbers variant_run_id=1 of sweep 1: completion_tokens: 1 entries for 3 "
        "requests",
        [["export", "1"]],
    ),
    "request-error-index": (
        "UPDATE request_numbers SET errors = '[[7, \"boom\"]]' WHERE variant_run_id = 1",
        "row request_numbers variant_run_id=1 of sweep 1: errors: [7, 'boom'] is not "
        "[request index, message]",
        [["export", "1"]],
    ),
    "excluded-axes-json": (
        "UPDATE excluded_cell SET axes = 'x' WHERE id = 1",
        "row excluded_cell id=1: axes:",
        [["report", "1"]],
    ),
    "build-pins-json": (
        "UPDATE build SET pins = '[torch' WHERE build_id = 'b1'",
        "row build build_id=b1: pins:",
        [["report", "1"], ["export", "1"]],
    ),
    "alert-details-json": (
        "UPDATE alert SET details = '{]' WHERE id = 1",
        "row alert id=1: details:",
        [["alerts", "list"]],
    ),
    "sweep-started-at": (
        "UPDATE sweep SET started_at = 'yesterday' WHERE id = 1",
        "row sweep id=1: started_at: 'yesterday' is not a timestamp",
        [["sweeps"], ["report", "1"], ["export", "1"], ["report", "latest"]],
    ),
    "cell-finished-at": (
        f"UPDATE cell SET finished_at = '2026-13-45 99:00' WHERE id = {FIRST_CELL}",
        "row cell id=1: finished_at:",
        [["report", "1"], ["export", "1"]],
    ),
    "alert-created-at": (
        "UPDATE alert SET created_at = 'soon' WHERE id = 1",
        "row alert id=1: created_at:",
        [["alerts", "list"]],
    ),
    "sweep-status": (
        "UPDATE sweep SET status = 'bogus' WHERE id = 1",
        "row sweep id=1: status: 'bogus' is not one of running, ok, failed, interrupted",
        [["sweeps"], ["report", "1"], ["export", "1"]],
    ),
    "cell-status": (
        f"UPDATE cell SET status = 'done' WHERE id = {FIRST_CELL}",
        "row cell id=1: status: 'done' is not one of planned, ok, failed, build_failed",
        [["report", "1"], ["export", "1"]],
    ),
    "alert-state": (
        "UPDATE alert SET state = 'snoozed' WHERE id = 1",
        "row alert id=1: state: 'snoozed' is not one of",
        [["alerts", "list"], ["alerts", "check", "1", "--no-notify"]],
    ),
    "alert-severity": (
        "UPDATE alert SET severity = 'fatal' WHERE id = 1",
        "row alert id=1: severity:",
        [["alerts", "list"]],
    ),
    "variant-concurrency-text": (
        "UPDATE variant_run SET concurrency = 'four' WHERE id = 1",
        "row variant_run id=1: concurrency: 'four' is not a whole number",
        [["report", "1"], ["export", "1"]],
    ),
    "metric-value-text": (
        "UPDATE metric SET value = 'many' WHERE id = 1",
        "row metric id=1: value: 'many' is not a whole number",
        [["report", "1"], ["export", "1"]],
    ),
    "request-latency-text": (
        "UPDATE request_numbers SET latencies_s = json_set(latencies_s, '$[1]', 'slow') "
        "WHERE variant_run_id = 1",
        "row request_numbers variant_run_id=1 of sweep 1: latencies_s[1]: 'slow' is not a number",
        [["export", "1"]],
    ),
    "request-per-position-text": (
        "UPDATE request_numbers SET accepted_per_pos = json_set(accepted_per_pos, '$[2][0]', "
        "'one') WHERE variant_run_id = 1",
        "row request_numbers variant_run_id=1 of sweep 1: accepted_per_pos[2]: 'one' is not a "
        "whole number",
        [["export", "1"]],
    ),
}
ROW_CASES = [
    pytest.param(statement, named, argv, id=f"{name}-{'-'.join(a for a in argv if a != 'OUT')}")
    for name, (statement, named, commands) in DAMAGE.items()
    for argv in commands
]


# A text in a number column also makes the row model warn as it dumps the row.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
@pytest.mark.parametrize("statement,named,argv", ROW_CASES)
def test_a_malformed_row_is_named_and_the_store_left_alone(
    statement: str, named: str, argv: list[str], db: Path, tmp_path: Path
) -> None:
    sql(db, statement)
    before = digest(db)
    out = tmp_path / "report.md"
    argv = [str(out) if a == "OUT" else a for a in argv]
    result = invoke([*argv, "--db", f"sqlite:///{db}"], tmp_path)
    assert_refused(result, "holds rows this farm cannot read", named)
    assert digest(db) == before
    assert not out.exists()


# --- Databases that are not (or no longer) a farm store ---------------------------

READ_COMMANDS = [["sweeps"], ["report", "1"], ["export", "1"], ["alerts", "list"]]
ALL_COMMANDS = [*READ_COMMANDS, ["db", "upgrade"], ["spool", "flush"], ["alerts", "ack", "1"]]


def _ids(commands: list[list[str]]) -> list[str]:
    return ["-".join(c) for c in commands]


@pytest.mark.parametrize("argv", ALL_COMMANDS, ids=_ids(ALL_COMMANDS))
def test_a_foreign_sqlite_database_is_refused_not_migrated(argv: list[str], tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    sql(path, "CREATE TABLE users (id INTEGER, name TEXT)", "INSERT INTO users VALUES (1, 'a')")
    before = digest(path)
    result = invoke([*argv, "--db", f"sqlite:///{path}"], tmp_path)
    assert_refused(
        result, "is not an mtp-farm store: it holds tables (users) but no alembic_version"
    )
    assert digest(path) == before


@pytest.mark.parametrize("argv", READ_COMMANDS, ids=_ids(READ_COMMANDS))
def test_an_empty_database_file_is_no_store_for_a_read(argv: list[str], tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    result = invoke([*argv, "--db", f"sqlite:///{path}"], tmp_path)
    assert_refused(result, "no farm store at", "the database is empty")
    assert path.read_bytes() == b""


@pytest.fixture
def full_disk(db: Path, tmp_path: Path) -> Iterator[Path]:
    """The template store on a real 1 MB tmpfs, the rest of it filled: a full disk."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        path = mount / "farm.db"
        shutil.copyfile(db, path)
        # Unbuffered: a buffered file would keep the last partial block and raise
        # ENOSPC again when it closes (how it fell depended on the store's size).
        with (mount / "fill").open("wb", buffering=0) as fill, contextlib.suppress(OSError):
            while True:
                fill.write(b"\0" * 65536)
        yield path
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize("argv", READ_COMMANDS, ids=_ids(READ_COMMANDS))
def test_a_full_disk_is_said_so_not_called_a_foreign_store(
    argv: list[str], full_disk: Path, tmp_path: Path
) -> None:
    before = digest(full_disk)
    result = invoke([*argv, "--db", f"sqlite:///{full_disk}"], tmp_path)
    assert_refused(result, f"cannot read the farm store {full_disk}", "is its disk full")
    assert "not an mtp-farm store" not in result.output
    assert digest(full_disk) == before


DAMAGED_COMMANDS = [["db", "upgrade"], ["sweeps"], ["report", "1"], ["alerts", "list"]]


@pytest.mark.parametrize("argv", DAMAGED_COMMANDS, ids=_ids(DAMAGED_COMMANDS))
def test_a_dropped_table_is_reported_as_damage_not_current(
    argv: list[str], db: Path, tmp_path: Path
) -> None:
    sql(db, "PRAGMA foreign_keys=OFF", "DROP TABLE cell")
    before = digest(db)
    result = invoke([*argv, "--db", f"sqlite:///{db}"], tmp_path)
    assert_refused(result, "is damaged: table cell is missing", "restore it from a backup")
    assert "is at revision" not in result.output
    assert digest(db) == before


def test_a_dropped_column_is_reported_as_damage(db: Path, tmp_path: Path) -> None:
    sql(db, "ALTER TABLE cell DROP COLUMN log_path")
    result = invoke(["db", "upgrade", "--db", f"sqlite:///{db}"], tmp_path)
    assert_refused(result, "table cell lacks column(s) log_path")


@pytest.mark.parametrize("argv", [["sweeps"], ["db", "upgrade"]], ids=["sweeps", "db-upgrade"])
def test_an_unknown_schema_revision_is_refused(argv: list[str], db: Path, tmp_path: Path) -> None:
    sql(db, "UPDATE alembic_version SET version_num = 'ffff9999'")
    before = digest(db)
    result = invoke([*argv, "--db", f"sqlite:///{db}"], tmp_path)
    assert_refused(result, "schema revision 'ffff9999' is not one of ours")
    assert digest(db) == before


# --- Output paths ----------------------------------------------------------------

OUT_CASES: dict[str, tuple[list[str], Callable[[Path], Path], str]] = {
    "export-onto-store": (["export", "1"], lambda d: d, "is the store's own file"),
    "export-onto-wal": (
        ["export", "1"],
        lambda d: d.with_name(d.name + "-wal"),
        "store's own file",
    ),
    "report-md-onto-store": (["report", "1", "--format", "md"], lambda d: d, "store's own file"),
    "report-html-onto-store": (
        ["report", "1", "--format", "html"],
        lambda d: d,
        "store's own file",
    ),
    "compare-onto-store": (["compare", "1", "2"], lambda d: d, "store's own file"),
    "export-into-folder": (["export", "1"], lambda d: d.parent, "is a folder; name a file in it"),
    "report-into-folder": (["report", "1", "--format", "html"], lambda d: d.parent, "is a folder"),
    "export-missing-folder": (
        ["export", "1"],
        lambda d: d.parent / "nope" / "x.json",
        "does not exist",
    ),
    "report-missing-folder": (
        ["report", "1", "--format", "md"],
        lambda d: d.parent / "nope" / "x.md",
        "does not exist",
    ),
    "compare-missing-folder": (
        ["compare", "1", "2"],
        lambda d: d.parent / "no" / "c.md",
        "does not exist",
    ),
}


@pytest.mark.parametrize("argv,target,fragment", OUT_CASES.values(), ids=OUT_CASES.keys())
def test_an_output_path_that_would_destroy_or_cannot_hold_a_file_is_refused(
    argv: list[str], target: Callable[[Path], Path], fragment: str, db: Path, tmp_path: Path
) -> None:
    before = digest(db)
    out = target(db)
    result = invoke([*argv, "--out", str(out), "--db", f"sqlite:///{db}"], tmp_path)
    assert_refused(result, f"--out {out}", fragment)
    assert digest(db) == before
    assert not (tmp_path / "nope").exists() and not (tmp_path / "no").exists()


# --- --resume of a sweep that another job (or slice) started ----------------------


def _job_file(tmp_path: Path, name: str = "local", extra_depth: bool = False) -> Path:
    text = (REPO / "jobs" / "local.yaml").read_text()
    text = text.replace("name: local", f"name: {name}")
    text = text.replace("../models/tiny-step", str(REPO / "models" / "tiny-step"))
    text = text.replace("../workloads/arith-mix.jsonl", str(REPO / "workloads" / "arith-mix.jsonl"))
    if extra_depth:
        text = text.replace("    count: 32", "    count: 16")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


SLICE = ["--only", "graph_mode=eager", "--only", "sliding_window=on"]
RESUME_CASES: dict[str, tuple[str, bool, list[str], str]] = {
    "another-job": ("nightly", False, SLICE, "sweep 1 is of job 'local'"),
    "narrower-only": (
        "local",
        False,
        [*SLICE, "--only", "mtp_depth=1"],
        "with --only graph_mode=eager --only sliding_window=on --only mtp_depth=1 plans 1 of "
        "the 4 cells sweep 1 planned; the others (",
    ),
    "narrower-variants": ("local", False, [*SLICE, "--only", "thinking=on"], "measure something"),
    "wider-only": ("local", False, SLICE[:2], "plans cells sweep 1 did not"),
    "no-only": ("local", False, [], "plans cells sweep 1 did not"),
    "changed-workload": ("local", True, SLICE, "cells measure something else now"),
    "unknown-sweep": ("local", False, SLICE, "no sweep 99"),
}


@pytest.mark.parametrize(
    "name,changed,only,fragment", RESUME_CASES.values(), ids=RESUME_CASES.keys()
)
def test_resume_refuses_a_sweep_of_another_job_or_slice(
    name: str, changed: bool, only: list[str], fragment: str, db: Path, tmp_path: Path
) -> None:
    sql(db, "UPDATE sweep SET status = 'interrupted' WHERE id = 1")
    before = digest(db)
    job = _job_file(tmp_path, name, changed)
    sweep = "99" if "99" in fragment else "1"
    argv = ["run", str(job), *only, "--resume", sweep, "--db", f"sqlite:///{db}"]
    result = invoke(argv, tmp_path)
    assert_refused(result, f"cannot resume sweep {sweep}" if sweep == "1" else "", fragment)
    assert digest(db) == before
    assert sweeps_in(db) == 1


def test_resume_of_its_own_slice_passes_the_check(db: Path, tmp_path: Path) -> None:
    job = _job_file(tmp_path)
    argv = ["run", str(job), *SLICE, "--resume", "1", "--dry-run", "--db", f"sqlite:///{db}"]
    result = invoke(argv, tmp_path)
    assert result.exit_code == 0, result.output


# --- A store that refuses writes --------------------------------------------------


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["spool", "flush"], "the farm store does not accept writes"),
        (["alerts", "ack", "1"], "the farm store refused the command"),
        (["alerts", "resolve", "1"], "the farm store refused the command"),
    ],
    ids=["spool-flush", "alerts-ack", "alerts-resolve"],
)
def test_a_read_only_store_is_named_when_a_command_writes(
    argv: list[str], fragment: str, db: Path, tmp_path: Path
) -> None:
    before = digest(db)
    result = invoke([*argv, "--db", f"sqlite:///file:{db}?mode=ro&uri=true"], tmp_path)
    assert_refused(result, fragment, "readonly database")
    assert digest(db) == before


def test_a_read_only_store_still_reads(db: Path, tmp_path: Path) -> None:
    result = invoke(["report", "1", "--db", f"sqlite:///file:{db}?mode=ro&uri=true"], tmp_path)
    assert result.exit_code == 0, result.output


# --- PostgreSQL ------------------------------------------------------------------


def _pg_tables(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def _pg(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for statement in statements:
            c.execute(statement)


@pytest.mark.parametrize(
    "argv", [["sweeps"], ["db", "upgrade"], ["report", "1"]], ids=["sweeps", "db-upgrade", "report"]
)
def test_a_foreign_postgresql_database_is_refused_not_migrated(
    argv: list[str], pg_url: str, tmp_path: Path
) -> None:
    _pg(pg_url, "CREATE TABLE users (id int)")
    result = invoke([*argv, "--db", pg_url], tmp_path)
    assert_refused(result, "is not an mtp-farm store: it holds tables (users)")
    assert _pg_tables(pg_url) == {"users"}


@pytest.mark.parametrize("argv", [["sweeps"], ["alerts", "list"]], ids=["sweeps", "alerts-list"])
def test_an_empty_postgresql_database_is_no_store_for_a_read(
    argv: list[str], pg_url: str, tmp_path: Path
) -> None:
    result = invoke([*argv, "--db", pg_url], tmp_path)
    assert_refused(result, "no farm store at", "the database is empty")
    assert _pg_tables(pg_url) == set()


def test_postgresql_damage_and_rows_outside_their_literal_are_named(
    pg_url: str, tmp_path: Path
) -> None:
    fill_store(pg_url)
    _pg(
        pg_url,
        "ALTER TABLE sweep DROP CONSTRAINT ck_sweep_status",
        "UPDATE sweep SET status = 'bogus' WHERE id = 1",
    )
    result = invoke(["report", "1", "--db", pg_url], tmp_path)
    assert_refused(result, "row sweep id=1: status: 'bogus' is not one of")
    _pg(
        pg_url,
        "UPDATE sweep SET status = 'ok' WHERE id = 1",
        "ALTER TABLE cell DROP CONSTRAINT ck_cell_status",
        "UPDATE cell SET status = 'done' WHERE id = 1",
    )
    result = invoke(["export", "1", "--db", pg_url], tmp_path)
    assert_refused(result, "row cell id=1: status: 'done' is not one of")
    _pg(pg_url, "DROP TABLE cell CASCADE")
    result = invoke(["db", "upgrade", "--db", pg_url], tmp_path)
    assert_refused(result, "is damaged: table cell is missing")


def test_an_unknown_postgresql_revision_is_refused(pg_url: str, tmp_path: Path) -> None:
    engine = sa.create_engine(store.normalize_url(pg_url))
    try:
        with engine.begin() as c:
            c.execute(sa.text("CREATE TABLE alembic_version (version_num varchar(32))"))
            c.execute(sa.text("INSERT INTO alembic_version VALUES ('abc123')"))
    finally:
        engine.dispose()
    result = invoke(["sweeps", "--db", pg_url], tmp_path)
    assert_refused(result, "schema revision 'abc123' is not one of ours")
    assert _pg_tables(pg_url) == {"alembic_version"}


def test_a_run_into_a_read_only_store_stops_before_any_engine(db: Path, tmp_path: Path) -> None:
    before = digest(db)
    job = _job_file(tmp_path)
    argv = ["run", str(job), *SLICE, "--db", f"sqlite:///file:{db}?mode=ro&uri=true"]
    result = invoke(argv, tmp_path)
    assert_refused(result, "the farm store does not accept writes", "readonly database")
    assert digest(db) == before and sweeps_in(db) == 1

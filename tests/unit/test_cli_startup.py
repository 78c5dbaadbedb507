"""`farm --help` and `farm sweeps` start at once: the CLI imports the store, Ray, numpy,
the HTTP client and the engines only in the commands that need them.

Each check runs the real CLI in a fresh interpreter (`python -c`) and lists what it
loaded; a failure names every heavy module found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Never needed to print help.
HEAVY = (
    "sqlmodel",
    "sqlalchemy",
    "ray",
    "numpy",
    "httpx",
    "farm.engines",
    "farm.store",
    "farm.store.summaries",
)
# `farm sweeps` reads the store, and nothing else heavy: no Ray, no numbers, no HTTP
# client, no engine, no report.
NOT_FOR_SWEEPS = (
    "ray",
    "numpy",
    "httpx",
    "farm.engines",
    "farm.analysis",
    "farm.report",
    "farm.report.charts",
    "farm.orchestrate.driver",
)

_RUN = """
import json, sys
from typer.testing import CliRunner
from farm.cli.main import app
results = [CliRunner().invoke(app, args) for args in json.loads(sys.argv[1])]
print(json.dumps({
    "codes": [r.exit_code for r in results],
    "outputs": [r.output for r in results],
    "modules": sorted(sys.modules),
}))
"""


def _run_cli(*invocations: list[str], env: dict[str, str] | None = None) -> dict[str, list[Any]]:
    out = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(invocations)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    result: dict[str, list[Any]] = json.loads(out.stdout)
    return result


def _loaded(modules: list[str], wanted: tuple[str, ...]) -> list[str]:
    return [m for m in wanted if m in modules]


def _command_paths() -> list[list[str]]:
    """Every group and command of the CLI as it is built (a new one is checked too)."""
    import click
    import typer

    from farm.cli.main import app

    paths: list[list[str]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_help_of_the_cli_and_of_its_groups_imports_nothing_heavy() -> None:
    paths = _command_paths()
    assert len(paths) > 30 and ["nightly"] in paths and ["db", "prune"] in paths
    invocations = [[*p, "--help"] for p in paths]
    result = _run_cli(*invocations)
    failed = [" ".join(i) for i, code in zip(invocations, result["codes"], strict=True) if code]
    assert failed == [], f"help exited non-zero: {failed}"
    assert "sweeps" in result["outputs"][0] and "dashboards" in result["outputs"][0]
    found = _loaded(result["modules"], HEAVY)
    assert found == [], f"`farm --help` and the groups' help imported {found}"


def test_dashboards_push_help_names_the_folder_it_defaults_to() -> None:
    # The default is resolved at run time (farm.dashboards is heavy to import); the help
    # text spells it out and must follow the constant.
    from farm.dashboards.provisioning import DASHBOARD_FOLDER

    result = _run_cli(["dashboards", "push", "--help"])
    assert result["codes"] == [0]
    assert DASHBOARD_FOLDER in " ".join(result["outputs"][0].split())


def test_sweeps_on_an_empty_store_reads_the_store_and_nothing_more(tmp_path: Path) -> None:
    from farm.store import upgrade

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    upgrade(url)  # an empty store at the current schema
    env = {**os.environ, "FARM_HOME": str(tmp_path)}
    result = _run_cli(["sweeps", "--db", url], env=env)
    assert result["codes"] == [0], result["outputs"]
    assert "farm.store.summaries" in result["modules"]  # it did read the store
    found = _loaded(result["modules"], NOT_FOR_SWEEPS)
    farm_modules = [m for m in result["modules"] if m.startswith("farm.")]
    assert found == [], f"`farm sweeps` imported {found}; farm modules loaded: {farm_modules}"

"""The README's own examples. Every `farm` command line the README
shows names a command and options that exist; every concrete example (no placeholder)
parses with the CLI's own parser and names files, engines and axes its job has; the
ones that can run here without an NPU or the network are run. Before: the `farm pr`
and Ascend `farm bisect` examples named an engine no job has (`vllm-ascend`), the
PyPI bisect example a job file that does not exist, and "the HTML report opens with
the verdict" held only for the published page.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from farm.cli.main import app
from farm.spec import load_job
from tests.support.stores import fill_with_verdict

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
ROOT = get_command(app)
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.yaml)?$|\.\.\.|[\[\]|]")
_WORD = re.compile(r"^[a-z][a-z-]*$")
# What a concrete example needs beyond an NPU cluster and the network, run here as is.
_RUNS_HERE = {"plan"}
# Examples that read no job file (`farm goldens show tests/data/goldens`): run as is.
_NO_JOB = {"show"}


@dataclass(frozen=True)
class Line:
    text: str
    where: str  # "README.md:LINE"
    shown: bool  # a command line of a code block (else an inline code span of prose)

    @property
    def concrete(self) -> bool:
        return self.shown and not any(_PLACEHOLDER.search(t) for t in shlex.split(self.text))


def readme_lines() -> list[Line]:
    """Every `farm ...` the README shows: code-block lines (continuations joined,
    comments cut) and inline code spans of its prose."""
    out: list[Line] = []
    fence = False
    pending = ""
    lines = README.read_text().split("\n")
    for number, raw in enumerate(lines, 1):
        if raw.startswith("```"):
            fence = not fence
            continue
        block = fence or raw.startswith("    ")
        if block:
            text = (pending + " " + raw.strip()).strip() if pending else raw.strip()
            if text.endswith("\\"):
                pending = text[:-1]
                continue
            pending = ""
            text = re.sub(r"\s+#.*$", "", text)
            if text.startswith("farm "):
                out.append(Line(text, f"README.md:{number}", shown=True))
            continue
        for span in re.findall(r"`(farm [^`]+)`", raw):
            out.append(Line(span, f"README.md:{number}", shown=False))
    return out


def _is_group(command: Any) -> bool:
    return hasattr(command, "get_command")  # typer's own click: duck-typed


def _resolve(tokens: list[str]) -> tuple[list[Any], list[str]]:
    """The command(s) a line names (alternatives: `list | gc`, `check|list`) and the
    tokens after the command path. Fails naming the word that is no command."""
    command: Any = ROOT
    rest = tokens[1:]
    while _is_group(command):
        if not rest or rest[0].startswith("-"):
            return [command], rest  # `farm --help`
        words = rest.pop(0).split("|")
        while len(rest) > 1 and rest[0] == "|" and _WORD.match(rest[1]):
            words.append(rest[1])
            del rest[:2]
        ctx = command.context_class(command)
        found = [(w, command.get_command(ctx, w)) for w in words]
        missing = [w for w, c in found if c is None]
        assert not missing, f"farm has no command {' '.join(tokens[:1] + missing)!r}"
        commands = [c for _, c in found if c is not None]
        if len(commands) > 1 or not _is_group(commands[0]):
            return commands, rest
        command = commands[0]
    return [command], rest


def _options(command: Any) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


LINES = readme_lines()


def test_the_readme_shows_commands() -> None:
    # The parser finds the command summary and the worked examples (a broken parser
    # would make every test below vacuous).
    assert sum(line.shown for line in LINES) >= 25
    assert sum(line.concrete for line in LINES) >= 3


@pytest.mark.parametrize("line", LINES, ids=[f"{x.where}:{x.text[:40]}" for x in LINES])
def test_every_command_and_option_the_readme_names_exists(line: Line) -> None:
    tokens = shlex.split(line.text.replace("[", " ").replace("]", " "))
    commands, rest = _resolve(tokens)
    known = {"--help"}.union(*(_options(c) for c in commands))
    for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", " ".join(rest)):
        assert option in known, f"{line.where}: {line.text!r}: no option {option}"


CONCRETE = [x for x in LINES if x.concrete]


@pytest.mark.parametrize("line", CONCRETE, ids=[x.where for x in CONCRETE])
def test_every_concrete_example_parses_and_names_what_its_job_has(line: Line) -> None:
    tokens = shlex.split(line.text)
    (command,), rest = _resolve(tokens)
    ctx = command.make_context(command.name or "", list(rest))  # the CLI's own parser
    params = ctx.params
    if command.name in _NO_JOB:
        result = CliRunner().invoke(app, tokens[1:], env={"COLUMNS": "120"})
        assert result.exit_code == 0, f"{line.where}: {line.text}\n{result.output}"
        return
    job_file = params.get("job_file")
    assert job_file is not None, f"{line.where}: which job?"
    path = REPO / job_file
    assert path.is_file(), f"{line.where}: {job_file} does not exist"
    job = load_job(path)
    engines = {e.name for e in job.engines}
    engine = params.get("engine")
    assert engine is None or engine in engines, (
        f"{line.where}: {job_file} has no engine {engine!r} (it has {', '.join(sorted(engines))})"
    )
    if command.name in _RUNS_HERE:
        result = CliRunner().invoke(app, tokens[1:], env={"COLUMNS": "120"})
        assert result.exit_code == 0, f"{line.where}: {line.text}\n{result.output}"


def test_the_fresh_machine_commands_are_make_targets() -> None:
    shown = [raw.strip() for raw in README.read_text().split("\n") if raw.startswith("    make ")]
    assert shown == ["make run", "make test"]
    for target in ("run", "test"):
        dry = subprocess.run(
            ["make", "-n", target], cwd=REPO, capture_output=True, text=True, check=False
        )
        assert dry.returncode == 0, dry.stderr


def test_the_html_report_opens_with_the_stored_verdict(tmp_path: Path) -> None:
    # README: "`farm sweeps` lists it, the HTML report opens with it".
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fill_with_verdict(url)  # sweep 1, its nightly verdict: a failed cell, summary "s"
    sweep_id = 1
    page = tmp_path / "page.html"
    argv = ["report", str(sweep_id), "--format", "html", "--out", str(page), "--db", url]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "Nightly verdict" in html and "failed_cells" in html
    assert html.index("Nightly verdict") < html.index("<h2>Findings</h2>")

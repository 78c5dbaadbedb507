"""Every server argv of the Ascend jobs, parsed by the engines' own argument parsers.

sglang: the real release wheel from PyPI (``pip download --no-deps``, cached under
FARM_HOME/cache/wheels) is put on PYTHONPATH of the cached vLLM CPU build's
interpreter (torch 2.13 CPU, transformers and most of sglang's pure-Python deps),
and ``ServerArgs.add_cli_args(parser); parser.parse_args(argv)`` runs on each argv.
What that interpreter lacks is installed ``--no-deps`` into a per-version folder
next to the wheel: orjson, IPython and traitlets (imported by sglang.utils), and the
transformers release the wheel pins with its tokenizers / huggingface-hub ranges.

One module is a stub, and only because it is a hardware build: PyPI's torchvision is
the CUDA build (its ``_C.so`` links libtorch_cuda.so and libcudart), which cannot
load beside a CPU torch (``operator torchvision::nms does not exist``). sglang's
``srt/utils/common.py`` imports ``torchvision.io.decode_jpeg`` at import time; no
argument parsing touches images. The stub raises if anything calls into it.

Versions verified: 0.5.9 (opt-in piecewise dialect), 0.5.12.post1 (piecewise by
default, the nightly's release), 0.5.14 (per-phase backends with legacy aliases) and
0.5.23 (per-phase backends, aliases removed). vLLM: the vllm-ascend cells' argv are
parsed by vLLM's parser from the CPU build, which vllm-ascend (a platform plugin)
shares.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from farm.builds.patches import fetch_release
from farm.engines import job_capabilities, pd_label, plan_launches
from farm.engines.dialects import SGLANG_GRAPH, pick
from farm.plan import expand_matrix
from farm.records import BuildInfo
from farm.spec import JobSpec, load_job

JOBS = Path(__file__).resolve().parents[2] / "jobs"
VERSIONS = ("0.5.9", "0.5.12.post1", "0.5.14", "0.5.23")
# Pure-Python (orjson: one small wheel) modules sglang imports that the vLLM build lacks;
# versions as verified here.
EXTRA_DEPS = ("orjson==3.13.0", "ipython==9.18.1", "traitlets==5.16.1")

_PARSE = r'''
import argparse, importlib.abc, importlib.machinery, json, sys, types, contextlib, io

class _HardwareStubCall:
    def __init__(self, name): self._name = name
    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._name}: hardware-build stub (CUDA torchvision) called")
    def __getattr__(self, item): return _HardwareStubCall(f"{self._name}.{item}")
    def __mro_entries__(self, bases): return (object,)

class _HardwareStubModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"): raise AttributeError(item)
        return _HardwareStubCall(f"{self.__name__}.{item}")

class _HardwareStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torchvision only: PyPI's build is CUDA-linked and cannot load on CPU torch."""
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = _HardwareStubModule(spec.name)
        m.__path__, m.__file__, m.__version__ = [], "<hardware stub>", "0.0+stub"
        return m
    def exec_module(self, module): pass

sys.meta_path.insert(0, _HardwareStubFinder())
import sglang
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
options = sorted(parser._option_string_actions)
# One request per stdin line (a JSON list of argvs), one FARM-RESULT line per answer.
for line in sys.stdin:
    out = []
    for argv in json.loads(line):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
        except SystemExit:
            out.append({"error": err.getvalue().strip().splitlines()[-1]})
            continue
        out.append({"args": {k: v for k, v in vars(ns).items()
                             if isinstance(v, (str, int, float, bool, type(None), list))}})
    print("FARM-RESULT " + json.dumps({"version": getattr(sglang, "__version__", None),
                                       "options": options, "parsed": out}, default=str),
          flush=True)
'''


def _pip(python: str, target: Path, *reqs: str) -> None:
    argv = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    done = subprocess.run(
        [*argv, "--target", str(target), *reqs], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"pip install {reqs} failed:\n{done.stderr[-2000:]}"


def _requires(dist_info: Path, name: str) -> list[str]:
    """Unconditional ``Requires-Dist`` specs of ``name`` in a dist-info METADATA."""
    specs = []
    for line in (dist_info / "METADATA").read_text().splitlines():
        m = re.match(rf"Requires-Dist: ({name}\b[^;]*)$", line, re.IGNORECASE)
        if m:
            specs.append(m[1].replace(" ", "").replace("(", "").replace(")", ""))
    return specs


def _deps(build: BuildInfo, release: Path, version: str, cache: Path) -> Path:
    """The folder of modules this sglang release needs beyond the vLLM build (cached)."""
    target = cache / "sglang-parser-deps" / version
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / ".farm-ready").exists():
            return target
        _pip(build.python, target, *EXTRA_DEPS)
        pins = _requires(next(release.glob("sglang-*.dist-info")), "transformers")
        have = subprocess.run(
            [
                build.python,
                "-c",
                "import importlib.metadata as m; print(m.version('transformers'))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if pins and pins[0] != f"transformers=={have}":
            _pip(build.python, target, pins[0])
            info = next(target.glob("transformers-*.dist-info"))
            extra = _requires(info, "tokenizers") + _requires(info, "huggingface-hub")
            _pip(build.python, target, *extra)
        (target / ".farm-ready").write_text(version + "\n")
    return target


@pytest.fixture(scope="session")
def sglang_parser(engine_build: BuildInfo, farm_home: Path) -> Iterator[Any]:
    """``parse(version, argvs)`` -> sglang's own verdict on each argv at that release.

    One parser process per version for the whole session (the import takes ~20 s).
    """
    cache = farm_home / "cache"
    procs: dict[str, subprocess.Popen[str]] = {}

    def parse(version: str, argvs: list[list[str]]) -> dict[str, Any]:
        if version not in procs:
            release = fetch_release("sglang", version, cache / "wheels")
            deps = _deps(engine_build, release, version, cache)
            env = {**os.environ, "PYTHONPATH": f"{release}{os.pathsep}{deps}"}
            procs[version] = subprocess.Popen(
                [engine_build.python, "-W", "ignore", "-c", _PARSE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        proc = procs[version]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(argvs) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        while line and not line.startswith("FARM-RESULT "):
            line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate(timeout=60)
            pytest.fail(f"sglang {version} parser did not run:\n{err[-4000:]}")
        result: dict[str, Any] = json.loads(line.removeprefix("FARM-RESULT "))
        assert result["version"] == version
        return result

    yield parse
    for proc in procs.values():
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _servers(job: JobSpec, plan: Any, family: str) -> list[tuple[Any, Any]]:
    """(cell, launch) of every server of the ``family`` cells of ``plan``: a
    disaggregated cell's two (prefill, then decode)."""
    launches = plan_launches(job, plan)
    return [
        (c, launches[key])
        for c in plan.cells
        if c.family == family
        for key in (
            [pd_label(c.cell_id, "prefill"), pd_label(c.cell_id, "decode")]
            if c.disaggregated
            else [c.cell_id]
        )
    ]


def _sglang_launches(job: JobSpec, version: str | None = None) -> list[tuple[Any, Any]]:
    """(cell, launch) of every sglang server of ``job``, optionally at another release."""
    if version is not None:
        engines = tuple(
            e.model_copy(update={"version": version}) if e.family == "sglang" else e
            for e in job.engines
        )
        job = job.model_copy(update={"engines": engines})
    plan = expand_matrix(job, job_capabilities(job))
    return _servers(job, plan, "sglang")


def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


@pytest.mark.parametrize("version", VERSIONS)
def test_job_argvs_parse_in_sglang(version: str, sglang_parser: Any) -> None:
    cells = [
        pair
        for name in ("nightly-ascend.yaml", "pr-ascend.yaml")
        for pair in _sglang_launches(load_job(JOBS / name), version)
    ]
    argvs = [list(launch.argv[3:]) for _, launch in cells]
    got = sglang_parser(version, argvs)
    options = set(got["options"])
    assert any(launch.pd is not None for _, launch in cells)  # the pd cells' servers too
    for (cell, launch), argv, parsed in zip(cells, argvs, got["parsed"], strict=True):
        assert "error" not in parsed, (version, cell.cell_id, parsed)
        # argparse accepts unambiguous prefixes; the farm writes whole flags only.
        assert _flags(argv) <= options, (version, _flags(argv) - options)
        args = parsed["args"]
        assert (args["speculative_algorithm"], args["speculative_num_steps"]) == ("NEXTN", 3)
        assert (args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (1, 4)
        tp = args.get("tp_size", args.get("tensor_parallel_size"))  # dest renamed in 0.5.14
        # A pd cell's servers: two device groups of the model's four NPUs.
        npus = 4 if launch.pd is None else 2
        assert (args["device"], args["attention_backend"], tp) == ("npu", "ascend", npus)
        if launch.pd is None:
            assert args.get("disaggregation_mode", "null") == "null"
        else:
            assert args["disaggregation_mode"] == launch.pd.role
            assert args["disaggregation_transfer_backend"] == "ascend"
            if launch.pd.role == "prefill":
                assert args["disaggregation_bootstrap_port"] == launch.pd.kv_port
        assert args["reasoning_parser"] == "qwen3" and args["enable_metrics"] is True
        # The model's length, and the longest context of the cell's conversations on top.
        longest = max(int(v.axes["context"]) for v in cell.variants)
        assert longest in (65536, 131072), cell.cell_id
        assert args["context_length"] == 40960 + longest and args["host"] == "127.0.0.1"
        eager = cell.planned_graph_mode == "eager"
        if "cuda_graph_backend_decode" in args:
            assert args["cuda_graph_backend_decode"] == ("disabled" if eager else "full")
            assert args["cuda_graph_backend_prefill"] == "disabled"
        else:
            assert args["disable_cuda_graph"] is eager
            if "disable_piecewise_cuda_graph" in args:
                assert args["disable_piecewise_cuda_graph"] is not eager
            else:
                assert args["enable_piecewise_cuda_graph"] is False
        if version == "0.5.12.post1":  # meta_info only reaches the log here
            assert (args["log_requests"], args["log_requests_format"]) == (True, "json")


@pytest.mark.parametrize("version", VERSIONS)
def test_dialect_table_matches_the_parser(version: str, sglang_parser: Any) -> None:
    row = pick(SGLANG_GRAPH, version, "test").value
    options = set(sglang_parser(version, [])["options"])
    for flag in (*row.eager, *row.decode_only, *row.deprecated):
        if flag.startswith("--"):
            assert flag in options, (version, flag)
    for flag in row.removed:
        assert flag not in options, (version, flag)


@pytest.mark.parametrize(
    ("version", "argv"),
    [
        ("0.5.23", ["--cuda-graph-bs", "1", "2", "4"]),  # removed in 0.5.20
        ("0.5.23", ["--disable-piecewise-cuda-graph"]),  # removed in 0.5.20
        ("0.5.12.post1", ["--cuda-graph-backend-decode", "full"]),  # first in 0.5.14
        ("0.5.9", ["--disable-piecewise-cuda-graph"]),  # first in 0.5.10
        ("0.5.12.post1", ["--speculative-num-stepz", "3"]),  # misspelt
        ("0.5.23", ["--cuda-graph-backend-decode", "piecewise"]),  # not a choice
    ],
)
def test_flags_of_another_version_are_rejected(
    version: str, argv: list[str], sglang_parser: Any
) -> None:
    got = sglang_parser(version, [["--model-path", "/m", *argv]])
    assert "error" in got["parsed"][0], (version, argv, got["parsed"][0])


def test_the_same_flags_are_accepted_where_they_belong(sglang_parser: Any) -> None:
    ok = {
        "0.5.12.post1": ["--cuda-graph-bs", "1", "2", "4", "--disable-piecewise-cuda-graph"],
        "0.5.14": ["--cuda-graph-bs", "1", "2", "--cuda-graph-backend-decode", "full"],
        "0.5.23": ["--cuda-graph-bs-decode", "1", "2", "--cuda-graph-max-bs-decode", "8"],
    }
    for version, argv in ok.items():
        got = sglang_parser(version, [["--model-path", "/m", *argv]])
        assert "error" not in got["parsed"][0], (version, got["parsed"][0])


_VLLM_PARSE = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # older layout
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.engine.arg_utils import AsyncEngineArgs
parser = make_arg_parser(FlexibleArgumentParser())
options = set(parser._option_string_actions)
out = []
for argv in json.load(sys.stdin):
    unknown = sorted({a.split("=")[0] for a in argv if a.startswith("--")} - options)
    ea = AsyncEngineArgs.from_cli_args(parser.parse_args(argv))
    out.append({"unknown": unknown, "tp": ea.tensor_parallel_size,
                "executor": ea.distributed_executor_backend,
                "eager": ea.enforce_eager, "spec": ea.speculative_config,
                "mode": str(getattr(ea.compilation_config, "cudagraph_mode", None)),
                "kv": None if ea.kv_transfer_config is None else {
                    k: getattr(ea.kv_transfer_config, k)
                    for k in ("kv_connector", "kv_role", "kv_port", "engine_id",
                              "kv_connector_module_path", "kv_connector_extra_config")}})
print("FARM-RESULT " + json.dumps(out, default=str))
"""


def test_ascend_job_vllm_argvs_parse_in_vllm(engine_build: BuildInfo) -> None:
    launches = []
    for name in ("nightly-ascend.yaml", "pr-ascend.yaml"):
        job = load_job(JOBS / name)
        plan = expand_matrix(job, job_capabilities(job))
        launches += _servers(job, plan, "vllm-ascend")
    assert any(launch.pd is not None for _, launch in launches)  # the pd cells' servers too
    done = subprocess.run(
        [engine_build.python, "-c", _VLLM_PARSE],
        input=json.dumps([list(lx.argv[3:]) for _, lx in launches]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("FARM-RESULT ")), None)
    assert line, done.stderr[-4000:]
    results = json.loads(line.removeprefix("FARM-RESULT "))
    for (cell, launch), got in zip(launches, results, strict=True):
        assert got["unknown"] == [], (cell.cell_id, got["unknown"])
        # A pd cell's servers: two device groups of the model's sixteen NPUs.
        tp = 16 if launch.pd is None else 8
        assert (got["tp"], got["executor"]) == (tp, "mp"), cell.cell_id
        if launch.pd is None:
            assert got["kv"] is None, cell.cell_id
        else:
            kv = got["kv"]
            role = "kv_producer" if launch.pd.role == "prefill" else "kv_consumer"
            assert (kv["kv_connector"], kv["kv_role"]) == ("MooncakeConnectorV1", role)
            assert kv["kv_port"] == launch.pd.kv_port
            assert kv["kv_connector_module_path"] == "vllm_ascend.distributed.mooncake_connector"
            extra = kv["kv_connector_extra_config"]
            assert extra["prefill"]["tp_size"] == extra["decode"]["tp_size"] == 8
        assert got["eager"] is (cell.planned_graph_mode == "eager")
        assert got["spec"]["num_speculative_tokens"] == cell.mtp_depth
        if not got["eager"]:
            assert got["mode"].endswith(cell.planned_graph_mode.upper()), (cell.cell_id, got)

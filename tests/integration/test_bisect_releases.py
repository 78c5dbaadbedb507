"""`farm bisect` over the releases of a PyPI source, and `--from-alert` on them.

The package index is a local one the test makes: a file:// "simple" index of wheels
of a tiny FAKE engine package (``farm-fake-vllm``, whose ``vllm`` module satisfies the
vLLM adapter's import check) and of a tiny FAKE plugin (``farm-fake-plugin``), each
at several versions; pip is pointed at it alone (``PIP_CONFIG_FILE`` off,
``PIP_INDEX_URL``). The releases are listed by pip and every step's build is real (a
cold build for the engine package, a layered build for the overlay); only the sweep is
a FAKE (no Ray, no vLLM): it stores simulated acceptance that drops from the guilty
release on, read from the version the build really installed.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version
from sqlmodel import Session
from typer.testing import CliRunner

from farm import store
from farm.builds.venv import ensure_build
from farm.cli.main import app
from farm.errors import BuildError
from farm.orchestrate.driver import plan_job
from farm.records import BuildInfo, CellResult
from farm.spec import JobSpec, parse_job
from farm.store.bisections import list_bisections
from tests.fakes.bisect_sweeps import PROMPTS, fake_result
from tests.fakes.simulate import prompt_acceptance

REPO = Path(__file__).resolve().parents[2]
ENGINE = "farm-fake-vllm"
PLUGIN = "farm-fake-plugin"
ENGINE_RELEASES = ("0.29.0", "0.30.0", "0.30.1", "0.31.0rc1", "0.31.0", "0.31.1", "0.32.0")
PLUGIN_RELEASES = tuple(f"0.1.{i}" for i in range(9))
BROKEN = "0.1.6"  # a wheel that is no zip file: pip cannot install it
JOB = """\
name: bisect-releases
engines:
  - name: fake
    family: vllm
    package: farm-fake-vllm
    version: 0.32.0
{overlays}models:
  - name: tiny-mtp
    path: {repo}/models/tiny-mtp
    speculative_method: mtp
    max_model_len: 512
axes:
  graph_mode: [eager]
  mtp_depth: [3]
  sliding_window: [on, off]
  thinking: [on]
workloads:
  - name: arith
    prompts: {repo}/workloads/arith.jsonl
    count: 8
    max_tokens: 64
resources: {{cpus: 2}}
"""
OVERLAYS = """\
    overlays:
      - package: farm-fake-plugin
        version: 0.1.0
"""


# --- the local package index ------------------------------------------------------


def _wheel(folder: Path, package: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``package`` at ``version`` holding ``files``."""
    dist = f"{package.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: farm-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    if package == PLUGIN:
        meta[f"{info}/entry_points.txt"] = (
            "[vllm.general_plugins]\nfarm_fake_plugin = farm_fake_plugin:register\n"
        )
    content = {**files, **meta}
    record = []
    for name, text in content.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    content[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in content.items():
            z.writestr(name, text)
    return path


def _engine_files(version: str) -> dict[str, str]:
    return {
        "vllm/__init__.py": f'__version__ = "{version}"\n',
        "vllm/entrypoints/__init__.py": "",
        "vllm/entrypoints/openai/__init__.py": "",
        "vllm/entrypoints/openai/api_server.py": "# the FAKE engine's server module\n",
    }


def _plugin_files(version: str) -> dict[str, str]:
    return {"farm_fake_plugin/__init__.py": f'VERSION = "{version}"\n\ndef register():\n    pass\n'}


def _index(folder: Path) -> Path:
    """A file:// simple index of both FAKE packages; its root folder."""
    files = folder / "files"
    files.mkdir(parents=True)
    wheels: dict[str, list[Path]] = {ENGINE: [], PLUGIN: []}
    for v in ENGINE_RELEASES:
        wheels[ENGINE].append(_wheel(files, ENGINE, v, _engine_files(v)))
    for v in PLUGIN_RELEASES:
        wheels[PLUGIN].append(_wheel(files, PLUGIN, v, _plugin_files(v)))
    broken = files / f"{PLUGIN.replace('-', '_')}-{BROKEN}-py3-none-any.whl"
    broken.write_text("not a zip file")
    simple = folder / "simple"
    for package, paths in wheels.items():
        page = simple / package
        page.mkdir(parents=True)
        links = "".join(f'<a href="../../files/{p.name}">{p.name}</a>\n' for p in paths)
        page.joinpath("index.html").write_text(
            f"<!DOCTYPE html><html><body>\n{links}</body></html>"
        )
    return simple


@pytest.fixture()
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip (the farm's listing and every build's install) sees the local index only."""
    simple = _index(tmp_path / "index")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", simple.as_uri())
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    return simple


# --- the FAKE sweep of a real build -----------------------------------------------


@dataclass
class FakeReleaseEngine:
    """A FAKE sweep runner around a real build: builds the step's engine (from the
    local index), reads the version of ``package`` it installed, and stores simulated
    acceptance, dropped from ``guilty`` on; a build that fails stores build_failed."""

    url: str
    cache: Path
    package: str
    module: str
    guilty: str
    installed: list[str] = field(default_factory=list)  # per sweep, "" when unbuilt
    builds: list[BuildInfo] = field(default_factory=list)

    def __call__(self, job: JobSpec, text: str, references: object = None) -> int:
        [engine] = job.engines
        plan = plan_job(job)
        try:
            build: BuildInfo | None = ensure_build(engine, self.cache)
        except BuildError as exc:
            build, error = None, str(exc)
        version = self._version(build) if build is not None else ""
        self.installed.append(version)
        p = prompt_acceptance(PROMPTS, mean=0.8, concentration=8.0, rng=np.random.default_rng(0))
        with Session(store.open_store(self.url)) as s:
            sweep_id = store.create_sweep(s, plan, text, "fake-host")
            if build is not None:
                self.builds.append(build)
                store.record_build(s, sweep_id, build)
            for i, cell in enumerate(plan.cells):
                if build is None:
                    result = CellResult.never_ran(cell.cell_id, error, "build_failed")
                else:
                    bad = Version(version) >= Version(self.guilty)
                    seed = sum(map(ord, version)) + i
                    result = fake_result(cell.cell_id, cell.variants, p, bad, seed=seed)
                store.save_cell_result(s, sweep_id, result)
            store.finish_sweep(s, sweep_id, "ok")
        return sweep_id

    def _version(self, build: BuildInfo) -> str:
        probe = f"import {self.module} as m; print(getattr(m, '__version__', None) or m.VERSION)"
        argv = [build.python, "-c", probe]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _job(folder: Path, overlays: str = "") -> tuple[JobSpec, Path]:
    path = folder / "job.yaml"
    path.write_text(JOB.format(overlays=overlays, repo=REPO))
    return parse_job(path.read_text(), base_dir=str(folder)), path


def _cli(folder: Path, job_file: Path, url: str, *args: str) -> tuple[int, str]:
    env = {"FARM_HOME": str(folder / "home"), "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["bisect", str(job_file), "--db", url, *args], env=env)
    print(result.output)
    return result.exit_code, result.output


def test_the_releases_of_an_engine_package_are_bisected_on_cold_builds(
    tmp_path: Path, index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _job_spec, job_file = _job(tmp_path)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    cache = tmp_path / "home" / "cache"
    fake = FakeReleaseEngine(url, cache, ENGINE, "vllm", guilty="0.31.0")
    monkeypatch.setattr("farm.cli.bisect._runner", lambda url, only, ray: fake)
    code, output = _cli(
        tmp_path, job_file, url, "--engine", "fake", "--good", "0.29.0", "--bad", "0.32.0"
    )
    assert code == 0, output
    one_line = " ".join(output.split())
    assert (
        "first bad release: farm-fake-vllm==0.31.0; last good: farm-fake-vllm==0.30.1" in one_line
    )
    assert "pull request" not in output
    with Session(store.open_store(url)) as s:
        [b] = list_bisections(s)
    # Between the ends: 0.30.0, 0.30.1, 0.31.0, 0.31.1 (0.31.0rc1 is a pre-release).
    assert [c.sha for c in b.commits] == [
        "0.29.0",
        "0.30.0",
        "0.30.1",
        "0.31.0",
        "0.31.1",
        "0.32.0",
    ]
    assert all(c.release for c in b.commits) and b.repo == "the package index"
    assert len(b.steps) <= math.ceil(math.log2(5))
    # Each sweep ran on a cold build of exactly the release it was asked for.
    asked = ["0.29.0", "0.32.0", *(b.commits[s.position].sha for s in b.steps)]
    assert fake.installed == asked
    assert len({x.build_id for x in fake.builds}) == len(asked)
    assert all(x.source is None and x.version == v for x, v in zip(fake.builds, asked, strict=True))
    regressed_cells = len(set(b.regressed.values()))
    assert run_line(output) == (len(asked), 2 * 2 + len(b.steps) * regressed_cells)

    # Run again: every build and step is reused, nothing is measured.
    code, again = _cli(
        tmp_path, job_file, url, "--engine", "fake", "--good", "0.29.0", "--bad", "0.32.0"
    )
    assert code == 0 and "this run: 0 build(s), 0 cell(s)" in again
    assert len(fake.installed) == len(asked)

    # Pre-releases are candidates only when an end is one.
    code, output = _cli(
        tmp_path, job_file, url, "--engine", "fake", "--good", "0.30.1", "--bad", "0.31.0"
    )
    assert code == 2, output
    assert (
        "no release of farm-fake-vllm between --good 0.30.1 and --bad 0.31.0 "
        "(1 pre-release(s) left out)" in " ".join(output.split())
    )


def run_line(output: str) -> tuple[int, int]:
    """(builds, cells) of the ``this run:`` line."""
    m = re.search(r"this run: (\d+) build\(s\), (\d+) cell\(s\)", output)
    assert m, output
    return int(m[1]), int(m[2])


def test_a_pypi_overlay_from_an_alert_is_bisected_on_layered_builds(
    tmp_path: Path, index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two FAKE nights on plugin 0.1.1 and 0.1.8, judged by the real nightly check,
    raise an alert; `farm bisect --from-alert` takes the plugin releases from the
    nights' layered builds, builds each step as a layer over the one cached base, and
    skips the release whose wheel pip cannot install."""
    from farm.store.alerts import list_alerts
    from farm.workflows.bisect.setup import prepare_bisect
    from farm.workflows.nightly.steps import check_night

    job, job_file = _job(tmp_path, OVERLAYS)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    cache = tmp_path / "home" / "cache"
    fake = FakeReleaseEngine(url, cache, PLUGIN, "farm_fake_plugin", guilty="0.1.5")
    setup = prepare_bisect(job, "fake", "0.1.1", "0.1.8", {}, cache)
    night = job.model_copy(update={"name": job.name})
    nights = [
        fake(night.model_copy(update={"engines": (setup.engine_at(v),)}), "night")
        for v in ("0.1.1", "0.1.8")
    ]
    with Session(store.open_store(url)) as s:
        check_night(s, nights[0], history=1, notifiers=())
        assert check_night(s, nights[1], history=1, notifiers=()).verdict.outcome == "regression"
        [alert, *_] = [a for a in list_alerts(s) if a.kind == "nightly_vs_last_good"]
    assert [x.source for x in fake.builds] == [
        f"{ENGINE}==0.32.0 + {PLUGIN}==0.1.1",
        f"{ENGINE}==0.32.0 + {PLUGIN}==0.1.8",
    ]

    monkeypatch.setattr("farm.cli.bisect._runner", lambda url, only, ray: fake)
    code, output = _cli(tmp_path, job_file, url, "--from-alert", str(alert.id))
    assert code == 0, output
    one_line = " ".join(output.split())
    assert f"first bad release: {PLUGIN}==0.1.5; last good: {PLUGIN}==0.1.4" in one_line
    with Session(store.open_store(url)) as s:
        [b] = list_bisections(s)
    assert (b.good.commit, b.bad.commit) == ("0.1.1", "0.1.8") and b.overlay == PLUGIN
    assert b.good.sweep_ids == (nights[0],) and b.bad.sweep_ids == (nights[1],)
    skipped = [s for s in b.steps if s.verdict == "skip"]
    [skip] = skipped  # the midpoint after the first (good) step
    assert skip.commit == BROKEN and "build_failed" in skip.reason and PLUGIN in skip.reason
    assert f"skipped {PLUGIN}=={BROKEN}" in one_line
    assert len(b.steps) <= math.ceil(math.log2(7)) + len(skipped)
    # Steps: one cell (the alert's), each a layer over the single cached base.
    built = fake.builds[2:]
    assert len(built) == len(b.steps) - len(skipped)
    bases = {p.name for p in (cache / "builds").iterdir() if p.is_dir()}
    assert len(bases) == 1 + 2 + len(built)  # the base, the nights' layers, the steps'
    assert fake.installed[2:] == ["" if s.verdict == "skip" else s.commit for s in b.steps]


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        (
            "0.29.5",
            "0.32.0",
            r"--good 0.29.5: farm-fake-vllm has no release 0.29.5 on the "
            r"package index \(nearest: 0.29.0, 0.30.0, 0.30.1\)",
        ),
        ("0.29.0", "0.40.0", r"--bad 0.40.0: farm-fake-vllm has no release 0.40.0"),
        ("0.32.0", "0.29.0", r"--good 0.32.0 is newer than --bad 0.29.0: .* ends swapped\?"),
        ("0.30.0", "0.30.0", r"same release of farm-fake-vllm: nothing to bisect"),
        ("0.30.0", "0.30.1", r"no release of farm-fake-vllm between --good 0.30.0 and --bad"),
        ("main", "0.32.0", r"--good main: not a release version \(PEP 440\)"),
    ],
)
def test_bad_release_ranges_exit_2_with_one_line_and_write_nothing(
    tmp_path: Path, index: Path, good: str, bad: str, message: str
) -> None:
    _spec, job_file = _job(tmp_path)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    code, output = _cli(tmp_path, job_file, url, "--engine", "fake", "--good", good, "--bad", bad)
    assert code == 2, output
    [line] = [x for x in output.splitlines() if x.startswith("error:")]
    assert re.search(message, " ".join(output.split())), output
    assert line and not (tmp_path / "farm.db").exists()
    assert not (tmp_path / "home" / "cache" / "builds").exists()

"""A job: its parts, axes, resources, timeouts and nightly settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from farm.axes import AXES, AxisValue
from farm.spec.base import _MAX_SECONDS, Name, _job_path, _located, _Spec
from farm.spec.matrix import AxesSpec, MatrixRule, _rule_problems
from farm.spec.parts import EngineSpec, ModelSpec, WorkloadSpec
from farm.yamlfile import line_of


class ResourceSpec(_Spec):
    """What one cell holds while it runs (Ray logical resources) and where it may run.

    ``label_selector`` pins cells to nodes by Ray node labels (for example
    ``{"pool": "a3"}`` or ``{"ray.io/accelerator-type": "in(Ascend910B,Ascend910C)"}``).
    """

    cpus: float = Field(default=1, gt=0, le=100_000)
    npus: int = Field(default=0, ge=0, le=4096)
    memory_gb: float | None = Field(default=None, gt=0, le=1e7)
    label_selector: dict[str, str] = Field(default_factory=dict)
    node_retries: int = Field(default=2, ge=0, le=100, description="re-runs when a node dies")
    build_dir: str | None = Field(
        default=None,
        description="shared folder every node mounts: each build is made once, there; "
        "default: each node builds into its own FARM_HOME/cache",
    )


class TimeoutSpec(_Spec):
    startup_s: float = Field(default=900, gt=0, le=_MAX_SECONDS)
    request_s: float = Field(default=600, gt=0, le=_MAX_SECONDS)
    stop_s: float = Field(default=20, gt=0, le=_MAX_SECONDS)
    cell_s: float | None = Field(
        default=None,
        gt=0,
        le=_MAX_SECONDS,
        description="deadline of one cell, start-up to last variant; default: what "
        "startup_s and request_s allow for its variants (farm.runner.cell)",
    )


class NightlySpec(_Spec):
    """How `farm nightly` checks and publishes this job's sweeps.

    ``history``: the change-point checks look at the job's last N sweeps (0 or 1: no
    history check); ``publish``: a folder (relative to the job file) that receives one
    HTML report per sweep, ``latest.html`` and ``index.html``; none when absent;
    ``confirm_runs``: how many times a suspicious cell (a drop the night cannot yet call
    under run-to-run noise) is rerun in its night, and the last good night's build of
    the same cell as often, interleaved on one node (0: never); ``confirm_budget_s``: the
    device time all of a night's confirmations may take (device-seconds: a server's
    busy time on each NPU it holds; an hour by default). ``farm pr`` confirms by the same
    two settings (a suspicious candidate cell rerun with the PR head's build and the
    base's; the budget is the PR run's), and calibrates its keys on the last
    ``history`` nights.
    """

    history: int = Field(default=14, ge=0, le=1000)
    publish: str | None = None
    confirm_runs: int = Field(default=6, ge=0, le=20)
    confirm_budget_s: float = Field(default=3600.0, ge=0.0, le=1e7)

    @field_validator("publish")
    @classmethod
    def _publish(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("an empty folder name; leave `publish` out to publish nothing")
        return None if value is None else _job_path(value, info)


class GoldenRef(_Spec):
    """A golden case file (or a folder of them) the job's verdicts hold variants to.

    Written as a path, or as ``{path, model, workload}``: ``model`` names the job
    model its goldens are for (default: matched by name, :mod:`farm.spec.goldens`),
    ``workload`` the only workload whose variants they gate (default: every one).
    """

    path: str = Field(min_length=1)
    model: Name | None = None
    workload: Name | None = None

    @model_validator(mode="before")
    @classmethod
    def _path_only(cls, data: Any) -> Any:
        return {"path": data} if isinstance(data, str) else data

    @field_validator("path")
    @classmethod
    def _path(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise ValueError("an empty path; name a golden case file or a folder of them")
        return _job_path(value, info)


class JobSpec(_Spec):
    """A whole job file."""

    name: Name
    engines: tuple[EngineSpec, ...] = Field(min_length=1)
    models: tuple[ModelSpec, ...] = Field(min_length=1)
    axes: AxesSpec = AxesSpec()
    workloads: tuple[WorkloadSpec, ...] = Field(min_length=1)
    resources: ResourceSpec = ResourceSpec()
    timeouts: TimeoutSpec = TimeoutSpec()
    nightly: NightlySpec = NightlySpec()
    goldens: tuple[GoldenRef, ...] = ()
    include: tuple[MatrixRule, ...] = ()
    exclude: tuple[MatrixRule, ...] = ()
    base_dir: str = Field(default=".", description="set by load_job: paths resolve from here")

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _rules(cls, rules: Any) -> Any:
        if not isinstance(rules, list):
            return rules
        problems = [p for i, rule in enumerate(rules) for p in _rule_problems(i, rule)]
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return rules

    @model_validator(mode="after")
    def _references(self) -> JobSpec:
        """Names are unique per list, and rules name engines, models and workloads the
        job has."""
        problems: list[tuple[tuple[int | str, ...], str, Any]] = []
        names = {
            "engines": [e.name for e in self.engines],
            "models": [m.name for m in self.models],
            "workloads": [w.name for w in self.workloads],
        }
        for kind, listed in names.items():
            first: dict[str, int] = {}
            for i, name in enumerate(listed):
                if name in first:
                    where = (kind, first[name], "name")
                    problems.append(((kind, i, "name"), f"{name!r} is named twice", where))
                first.setdefault(name, i)
        known = self.axis_values()
        for i, ref in enumerate(self.goldens):
            for axis in ("model", "workload"):
                value = getattr(ref, axis)
                if value is not None and value not in known[axis]:
                    problems.append(
                        (
                            ("goldens", i, axis),
                            f"{value!r} is not one of the job's {axis}s "
                            f"({', '.join(map(str, known[axis]))})",
                            None,
                        )
                    )
        for kind, rules in (("include", self.include), ("exclude", self.exclude)):
            for i, rule in enumerate(rules):
                for ax in AXES:
                    if (
                        ax.source != "axes"
                        and ax.name in rule
                        and rule[ax.name] not in known[ax.name]
                    ):
                        problems.append(
                            (
                                (kind, i, ax.name),
                                f"{rule[ax.name]!r} is not one of the job's {ax.source} "
                                f"({', '.join(map(str, known[ax.name]))})",
                                None,
                            )
                        )
        if problems:
            raise _located("; ".join(p[1] for p in problems), problems)
        return self

    def axis_values(self) -> dict[str, tuple[AxisValue, ...]]:
        """Each axis's values in this job, in the job file's order."""
        lists: dict[str, tuple[Any, ...]] = {
            "engines": self.engines,
            "models": self.models,
            "workloads": self.workloads,
        }
        return {
            a.name: (
                tuple(getattr(self.axes, a.name))
                if a.source == "axes"
                else tuple(e.name for e in lists[a.source])
            )
            for a in AXES
        }

    def resolve(self, path: str) -> Path:
        """A path from the job file, made absolute against the job file's folder."""
        p = Path(path)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()


@dataclass(frozen=True)
class JobFile:
    """A validated job and where each of its keys is written (for errors that name the
    line); jobs built in code have no ``root`` and name only the key."""

    spec: JobSpec
    source: str = "<job>"
    root: yaml.Node | None = None

    def where(self, *loc: int | str) -> str:
        """``jobs/x.yaml:12: models.0.path``: the file, line and key of ``loc``."""
        key = ".".join(str(p) for p in loc) or "<root>"
        line = line_of(self.root, loc)
        return f"{self.source}:{line}: {key}" if line else f"{self.source}: {key}"

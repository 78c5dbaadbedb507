"""Job specs: YAML validated by pydantic, with errors that name file, line and key.

By concern: :mod:`~farm.spec.sources` (where an engine is built from),
:mod:`~farm.spec.parts` (engines, models, workloads), :mod:`~farm.spec.matrix` (the
axes and the include / exclude rules), :mod:`~farm.spec.job` (the job),
:mod:`~farm.spec.files` (reading and parsing job files), :mod:`~farm.spec.paths` (the
local paths a run reads), :mod:`~farm.spec.goldens` (the golden case files a job
names, read and bound to its models). The engine families and axes reach validation
as data (:mod:`~farm.spec.families`, :mod:`farm.axes`).
"""

from farm.axes import GraphMode, OnOff
from farm.spec.base import is_distribution_name
from farm.spec.files import load_job, parse_job, parse_job_file, read_job
from farm.spec.job import GoldenRef, JobFile, JobSpec, NightlySpec, ResourceSpec, TimeoutSpec
from farm.spec.matrix import AxesSpec
from farm.spec.parts import (
    ContextSpec,
    EngineSpec,
    HarnessSpec,
    ModelSpec,
    OverlaySpec,
    SequentialSpec,
    WorkloadSpec,
)
from farm.spec.paths import check_job_paths
from farm.spec.sources import (
    BuildSource,
    GitSource,
    PullRequestSource,
    PypiSource,
    TreeSource,
    WheelSource,
)

__all__ = [
    "AxesSpec",
    "BuildSource",
    "ContextSpec",
    "EngineSpec",
    "GitSource",
    "GoldenRef",
    "GraphMode",
    "HarnessSpec",
    "JobFile",
    "JobSpec",
    "ModelSpec",
    "NightlySpec",
    "OnOff",
    "OverlaySpec",
    "PullRequestSource",
    "PypiSource",
    "ResourceSpec",
    "SequentialSpec",
    "TimeoutSpec",
    "TreeSource",
    "WheelSource",
    "WorkloadSpec",
    "check_job_paths",
    "is_distribution_name",
    "load_job",
    "parse_job",
    "parse_job_file",
    "read_job",
]

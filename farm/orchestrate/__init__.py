"""Placement of cells on a Ray cluster: the only package that imports ray.

By concern: :mod:`~farm.orchestrate.placement` (where a cell may run),
:mod:`~farm.orchestrate.node_builds` (builds on the nodes),
:mod:`~farm.orchestrate.dispatch` (cells handed to Ray in the driver's order),
:mod:`~farm.orchestrate.host_cluster` (this host's own cluster) and
:mod:`~farm.orchestrate.ray_pool` (the pool that ties them together).
"""

from farm.orchestrate.dispatch import CellRunner
from farm.orchestrate.node_builds import BuildOutcome, BuildRunner, NodeBuilds, default_build
from farm.orchestrate.placement import Placement, node_label
from farm.orchestrate.ray_pool import RayPool

__all__ = [
    "BuildOutcome",
    "BuildRunner",
    "CellRunner",
    "NodeBuilds",
    "Placement",
    "RayPool",
    "default_build",
    "node_label",
]

"""Placement of cells on a Ray cluster: the only package that imports ray."""

from farm.orchestrate.ray_pool import (
    BuildOutcome,
    BuildRunner,
    CellRunner,
    NodeBuilds,
    Placement,
    RayPool,
    default_build,
    node_label,
)

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

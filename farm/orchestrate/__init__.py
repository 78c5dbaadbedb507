"""Placement of cells on a Ray cluster: the only package that imports ray."""

from farm.orchestrate.ray_pool import CellRunner, Placement, RayPool

__all__ = ["CellRunner", "Placement", "RayPool"]

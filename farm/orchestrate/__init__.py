"""Placement of cells on a Ray cluster: the only package that imports ray."""

from farm.orchestrate.ray_pool import RayPool

__all__ = ["RayPool"]

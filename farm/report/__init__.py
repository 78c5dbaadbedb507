"""Reports of stored sweeps."""

from farm.report.table import render_matrix, render_plan

__all__ = ["render_matrix", "render_plan"]

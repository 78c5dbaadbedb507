"""A stored cell offered as a baseline: which sweep and build it came from. Pure.

:mod:`farm.store.baselines` reads them; :func:`farm.workflows.pr.select_baseline`
chooses among them.
"""

from __future__ import annotations

from farm.frozen import Frozen
from farm.records import StoredCell

__all__ = ["StoredBaselineCell"]


class StoredBaselineCell(Frozen):
    """A stored cell of a sweep that ran ``build_id`` (read by the pipeline)."""

    sweep_id: int
    build_id: str
    stored: StoredCell

"""Pure analysis of stored sweeps: no I/O, no ray, no SQL."""

from farm.analysis.summary import VariantSummary, summarize_sweep

__all__ = ["VariantSummary", "summarize_sweep"]

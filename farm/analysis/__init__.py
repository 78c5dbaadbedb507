"""Pure analysis of stored sweeps: no I/O, no ray, no SQL."""

from farm.analysis.attribution import (
    Attribution,
    BranchTable,
    LabeledCell,
    Predicate,
    attribute,
    branch_table,
    labels_from_report,
)
from farm.analysis.check_rules import CheckConfig, CheckReport, CheckVerdict, Note, VariantRef
from farm.analysis.checks import (
    check_depth_invariance,
    check_graph_modes,
    check_patches,
    check_sweep,
)
from farm.analysis.history import (
    ChangePoint,
    HistoryAnalysis,
    HistoryConfig,
    HistoryPoint,
    analyze_histories,
    analyze_history,
    series_from_sweeps,
)
from farm.analysis.stats import (
    AcceptanceDifference,
    AcceptanceSample,
    AcceptanceStats,
    Interval,
    acceptance_stats,
    accuracy,
    compare_acceptance,
    compare_proportions,
    greedy_divergence,
    wilson_interval,
)
from farm.analysis.summary import (
    CategoryAcceptance,
    VariantSummary,
    acceptance_by_category,
    patched_bases,
    summarize_sweep,
)
from farm.comparable import ComparableKey

__all__ = [
    "AcceptanceDifference",
    "AcceptanceSample",
    "AcceptanceStats",
    "Attribution",
    "BranchTable",
    "CategoryAcceptance",
    "ChangePoint",
    "CheckConfig",
    "CheckReport",
    "CheckVerdict",
    "ComparableKey",
    "HistoryAnalysis",
    "HistoryConfig",
    "HistoryPoint",
    "Interval",
    "LabeledCell",
    "Note",
    "Predicate",
    "VariantRef",
    "VariantSummary",
    "acceptance_by_category",
    "acceptance_stats",
    "accuracy",
    "analyze_histories",
    "analyze_history",
    "attribute",
    "branch_table",
    "check_depth_invariance",
    "check_graph_modes",
    "check_patches",
    "check_sweep",
    "compare_acceptance",
    "compare_proportions",
    "greedy_divergence",
    "labels_from_report",
    "patched_bases",
    "series_from_sweeps",
    "summarize_sweep",
    "wilson_interval",
]

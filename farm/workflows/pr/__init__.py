"""`farm pr`: decide (pure), steps (sources, baseline, GitHub), order, run (the workflow)."""

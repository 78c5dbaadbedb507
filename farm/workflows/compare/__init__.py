"""`farm compare`: decide (judge two sweeps), steps (post), run (the workflow)."""

"""`farm bisect`: decide (pure search), setup, ends, steps (measure, store), run (the workflow)."""

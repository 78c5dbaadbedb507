"""`farm nightly`: decide (pure), steps (the store, alerts, pages), run (the workflow)."""

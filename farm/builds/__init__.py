"""Engine builds: isolated, content-addressed, cached virtual environments."""

from farm.builds.venv import build_id, ensure_build

__all__ = ["build_id", "ensure_build"]

"""Where the farm keeps its files on a machine (FARM_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["farm_home"]


def farm_home() -> Path:
    """The farm's folder: database, engine builds, wheels, logs (FARM_HOME, ~/.mtp-farm)."""
    home = Path(os.environ.get("FARM_HOME", "~/.mtp-farm")).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home

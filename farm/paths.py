"""Where the farm keeps its files on a machine (FARM_HOME)."""

from __future__ import annotations

from pathlib import Path

from farm.settings import get_settings

__all__ = ["farm_home"]


def farm_home() -> Path:
    """The farm's folder: database, engine builds, wheels, logs (FARM_HOME, ~/.mtp-farm).

    Created when missing.
    """
    home = get_settings().paths.home
    home.mkdir(parents=True, exist_ok=True)
    return home

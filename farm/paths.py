"""Where the farm keeps its files on a machine (FARM_HOME)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from farm.errors import FarmError
from farm.settings import get_settings

__all__ = ["farm_home", "ray_temp_dir"]


def farm_home() -> Path:
    """The farm's folder: database, engine builds, wheels, logs (FARM_HOME, ~/.mtp-farm).

    Created when missing. Raises FarmError when it cannot be (a file is in the way,
    no permission).
    """
    home = get_settings().paths.home
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FarmError(
            f"FARM_HOME cannot be used as the farm's folder: {home} ({exc.strerror}); "
            "set FARM_HOME to a folder"
        ) from None
    return home


def ray_temp_dir(home: Path) -> Path:
    """The temp folder of the local Ray cluster the farm starts for ``home``: one per
    FARM_HOME and user, short for Ray's socket paths (``farm logs gc`` prunes them)."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"mtpfarm-ray-{os.getuid()}-{digest}"

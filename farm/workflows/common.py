"""What every workflow shares: writing a page whole."""

from __future__ import annotations

import os
from pathlib import Path

from farm.errors import OutputError

__all__ = ["write_page"]


def write_page(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader never sees half a page);
    OutputError when it cannot be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None

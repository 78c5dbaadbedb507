"""`farm export` files: a stored sweep as JSON, for analyses away from the store.

The file is a :class:`~farm.records.SweepRecord` with ``format_version``
(:mod:`farm.fileformat`); files exported before the key existed are version 1.
``bench/detection_recorded.py`` reads them with :func:`read_sweep_export`.
"""

from __future__ import annotations

from pathlib import Path

from farm.fileformat import dump_versioned, read_versioned
from farm.records import SweepRecord

__all__ = ["EXPORT_FORMAT", "dump_sweep_export", "read_sweep_export"]

EXPORT_FORMAT = 2
# Version 2 keeps axis values under ``axes`` (farm.axes); version 1 wrote them flat
# (``thinking``, ``graph_mode``...), which the records' validators still fold in.
_UPGRADES = {1: lambda data: data}
"""The export format this code writes and reads (``format_version``)."""


def dump_sweep_export(record: SweepRecord) -> str:
    """``record`` as the text of an export file (indented JSON, no trailing newline)."""
    return dump_versioned(record, EXPORT_FORMAT, indent=1)


def read_sweep_export(path: Path) -> SweepRecord:
    """The sweep in export file ``path``. Raises UnreadableFileError naming the file and
    why it cannot be read (truncated, newer format, does not validate)."""
    return read_versioned(
        path, SweepRecord, version=EXPORT_FORMAT, what="sweep export", upgrades=_UPGRADES
    )

"""The farm's error tree: every error says what failed, where, and what to do."""

from __future__ import annotations

__all__ = [
    "BuildError",
    "CellError",
    "EngineError",
    "FarmError",
    "GoldenError",
    "OutputError",
    "PlanError",
    "SpecError",
    "StoreDamagedError",
    "StoreError",
]


class FarmError(Exception):
    """Base of every error the farm raises on purpose."""


class SpecError(FarmError):
    """A job file is malformed; the message names file, line and key."""


class GoldenError(SpecError):
    """A golden case file (vllm-ascend's spec-decode gates) is malformed or cannot be
    read; the message names file, line and key."""


class PlanError(FarmError):
    """A job cannot be expanded into cells (for example, an unknown engine family)."""


class BuildError(FarmError):
    """An engine environment could not be built."""


class EngineError(FarmError):
    """An engine server failed to start, died, or answered wrongly."""


class CellError(FarmError):
    """One cell failed; carries the engine log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class StoreError(FarmError):
    """The SQL store could not be reached or migrated."""


class StoreDamagedError(StoreError):
    """The database is not a farm store, or a table or row of it is damaged; the message
    names the table (and the row) and what to do."""


class OutputError(FarmError):
    """A file the farm was asked to write cannot be written there (the store itself, a
    folder, a folder that does not exist); nothing was written."""

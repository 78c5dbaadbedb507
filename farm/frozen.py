"""The one base of the package's frozen pydantic models.

Typed data between the stages (cells, results, verdicts, rules) is immutable and
refuses unknown fields: a value handed on is the value that was checked, and a typo
in a field name fails where the value is made.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    """A frozen pydantic model that refuses unknown fields (``extra="forbid"``).

    A subclass that needs more configuration sets only its own keys in
    ``model_config``; pydantic merges them with these.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

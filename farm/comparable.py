"""Which results may be compared: the one comparable key. Pure: no I/O.

Two measurements are the same measurement, in another sweep or of another build,
when their :class:`ComparableKey` is equal: the Conbench ``history_fingerprint``
idea. What enters it:

- the engine line (the job's engine name, stable across nightlies while the version
  moves; it keeps a patched line apart from its base) and its family;
- the model (by name: its path is where this machine keeps it);
- every axis value of :mod:`farm.axes` (but an axis's implicit value), with the graph
  mode the engine really runs (the planned one: ``compiled`` on the CPU build);
- the workload's identity: its prompt set (file name, or harness task and dataset),
  count, sampling (temperature, seed) and max tokens. Concurrency does not enter: it
  changes speed, not what is measured.

Build and sweep ids never enter: history compares builds. Callers that need one
build (PR baselines) match the build id beside the key. History, alerts, ``farm
compare``, schedule estimates and the dashboards all use :attr:`fingerprint`; its
:attr:`label` is the key's readable text (also the alert deduplication text).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import model_validator

from farm.axes import AXES, AxisValue, axes_text
from farm.frozen import Frozen

__all__ = ["ComparableKey"]


class ComparableKey(Frozen):
    """The comparable identity of a variant, or of a server cell (no request axes).

    ``axes`` holds every axis value except engine and model, in :data:`AXES` order;
    ``workload_identity`` is empty for a server-level key and for variants stored
    before the key existed whose job file could not be read.
    """

    family: str
    engine: str
    model: str
    axes: tuple[tuple[str, AxisValue], ...]
    workload_identity: str = ""

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        # Alerts stored before this key existed hold its fields flat (graph_mode=...).
        if isinstance(data, dict) and "axes" not in data:
            data = dict(data)
            flat = [a.name for a in AXES if a.name not in ("engine", "model")]
            values = {name: data.pop(name, None) for name in flat}
            data["axes"] = tuple((k, v) for k, v in values.items() if v is not None)
        return data

    def value(self, name: str) -> AxisValue:
        """The value of axis ``name`` (engine and model included)."""
        return self.axis_values()[name]

    def axis_values(self) -> dict[str, AxisValue]:
        """Axis name -> value for every axis of the key, in :data:`AXES` order (axes at
        their implicit value, which the key leaves out, included)."""
        given: dict[str, AxisValue] = {"engine": self.engine, "model": self.model}
        given |= dict(self.axes)
        out: dict[str, AxisValue] = {}
        for a in AXES:
            value = given.get(a.name, a.implicit)
            if value is not None:
                out[a.name] = value
        return out

    @property
    def fingerprint(self) -> str:
        """16 hex digits of sha256 over the key's canonical JSON: the stored, indexed id."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def label(self) -> str:
        """``engine(family).model.graph.mtpN.swa-on.think-off.workload``."""
        return f"{self.engine}({self.family}).{self.model}.{axes_text(dict(self.axes))}"

    def __str__(self) -> str:
        return self.label

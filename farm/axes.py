"""The matrix axes, defined once. Pure data: no I/O.

Every other place that needs the axes (job-file validation, the planner's product,
``--only``, include/exclude rules, cell ids, report columns, the comparable key, the
store's axis columns) derives them from :data:`AXES`. Adding an axis is one entry
here plus the adapters that map its values to engine flags.

Two levels: a *server* axis needs a new engine server per
value; a *request* axis is served by the same server (one variant per value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "AXES",
    "AXIS_NAMES",
    "REQUEST_AXES",
    "SERVER_AXES",
    "Axis",
    "AxisValue",
    "Deployment",
    "DraftGraphMode",
    "GraphMode",
    "OnOff",
    "axes_text",
    "axis",
    "axis_label",
    "explicit",
    "fold_axis_values",
    "parse_axis_value",
    "speculates",
    "variant_label",
]

AxisValue = str | int
GraphMode = Literal["eager", "compiled", "piecewise", "full_decode_only", "full"]
# The drafter's own graph mode: the target's (the engines' default) or eager beside a
# graph-mode target (vLLM's speculative config ``"enforce_eager": true``).
DraftGraphMode = Literal["target", "eager"]
OnOff = Literal["on", "off"]
# How a cell's servers are deployed: one server doing prefill and decode, or a prefill
# server and a decode server joined by a KV connector (disaggregated prefill/decode).
Deployment = Literal["colocated", "pd"]


@dataclass(frozen=True)
class Axis:
    """One axis of the matrix.

    ``source`` says where a job file names the values: ``axes`` (the job's ``axes:``
    section, validated against ``words`` or ``bounds``) or the name of the job's list
    whose entries' names are the values (``engines``, ``models``, ``workloads``).
    ``id_prefix`` is how a value reads in cell ids and key labels (``mtp`` + 2);
    ``short`` is its column heading in the sweep-matrix tables. ``implicit`` is the
    value every result had before the axis existed (an axis added later, e.g. a KV
    cache dtype whose engine default is ``auto``): cell ids and comparable keys leave
    it out, so adding the axis changes neither for results measured before.
    """

    name: str
    level: Literal["server", "request"]
    label: str
    source: Literal["axes", "engines", "models", "workloads"] = "axes"
    words: tuple[str, ...] = ()
    bounds: tuple[int, int] | None = None
    default: tuple[AxisValue, ...] = ()
    id_prefix: str = ""
    short: str = ""
    implicit: AxisValue | None = None

    @property
    def is_int(self) -> bool:
        return self.bounds is not None

    @property
    def on_off(self) -> bool:
        return self.words == get_args(OnOff)

    def text(self, value: Any) -> str:
        """``value`` as it reads in a cell id or a key label."""
        return f"{self.id_prefix}{value}"


AXES: tuple[Axis, ...] = (
    Axis("engine", "server", "engine", source="engines", short="engine"),
    Axis("model", "server", "model", source="models", short="model"),
    Axis(
        "graph_mode",
        "server",
        "graph mode",
        words=get_args(GraphMode),
        default=("eager",),
        short="graph",
    ),
    Axis(
        "draft_graph_mode",
        "server",
        "drafter graph mode",
        words=get_args(DraftGraphMode),
        default=("target",),
        id_prefix="draft-",
        short="draft",
        # The engines run the drafter in the target's mode unless told otherwise: every
        # result before the axis was measured so (the CPU build's forced eager drafter
        # aside, which only tiny-hybrid's compiled cells had: its drafter compiles).
        implicit="target",
    ),
    Axis(
        "mtp_depth",
        "server",
        "MTP depth",
        bounds=(0, 16),
        default=(0,),
        id_prefix="mtp",
        short="mtp",
    ),
    Axis(
        "sliding_window",
        "server",
        "sliding window",
        words=get_args(OnOff),
        default=("on",),
        id_prefix="swa-",
        short="swa",
    ),
    Axis(
        "prefix_caching",
        "server",
        "prefix caching",
        words=get_args(OnOff),
        default=("on",),
        id_prefix="prefix-",
        short="prefix",
        # Both engine families cache prefixes unless told not to (vLLM v1, sglang's
        # radix cache): every result before the axis was measured with it on.
        implicit="on",
    ),
    Axis(
        "deployment",
        "server",
        "deployment",
        words=get_args(Deployment),
        default=("colocated",),
        short="deploy",
        # One server per cell until the axis existed: every earlier result was measured
        # colocated. ``pd``: a prefill and a decode server, acceptance read on the
        # decode side (vllm-ascend #13523, #12521).
        implicit="colocated",
    ),
    Axis(
        "thinking",
        "request",
        "thinking",
        words=get_args(OnOff),
        default=("off",),
        id_prefix="think-",
    ),
    Axis(
        "context",
        "request",
        "context tokens",
        bounds=(0, 1 << 24),
        default=(0,),
        id_prefix="ctx",
        short="ctx",
        # Tokens of context placed before each prompt (the workload's ``context`` says
        # which: earlier turns, a shared document). Every result before the axis was
        # measured with none.
        implicit=0,
    ),
    Axis("workload", "request", "workload", source="workloads"),
)
AXIS_NAMES: tuple[str, ...] = tuple(a.name for a in AXES)
SERVER_AXES: tuple[Axis, ...] = tuple(a for a in AXES if a.level == "server")
REQUEST_AXES: tuple[Axis, ...] = tuple(a for a in AXES if a.level == "request")
_BY_NAME: Mapping[str, Axis] = {a.name: a for a in AXES}


def axis(name: str) -> Axis:
    """The axis called ``name``; KeyError names the known axes."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown axis {name!r}; axes: {', '.join(AXIS_NAMES)}") from None


def axis_label(name: str) -> str:
    """Column heading of an axis (its name when it is not an axis, e.g. ``status``)."""
    found = _BY_NAME.get(name)
    return found.label if found else name


def axes_text(values: Mapping[str, Any], sep: str = ".") -> str:
    """``eager.mtp3.swa-on``: axis values as cell ids and key labels spell them
    (implicit values left out), joined by ``sep``."""
    return sep.join(axis(name).text(value) for name, value in explicit(values).items())


def explicit(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without the axes that hold their implicit value (see :class:`Axis`)."""
    return {
        name: value
        for name, value in values.items()
        if value is None or value != _BY_NAME[name].implicit
    }


def variant_label(cell_id: str, request_values: Mapping[str, Any]) -> str:
    """``cell_id[think-on.arith]``: how findings and reports name a variant."""
    return f"{cell_id}[{axes_text(request_values)}]"


def parse_axis_value(name: str, text: str, known: Mapping[str, tuple[AxisValue, ...]]) -> AxisValue:
    """A value of axis ``name`` given as text (``--only``), checked against ``known``.

    ``known`` maps each axis to the values the job gives it. Raises ValueError saying
    which values there are.
    """
    ax = axis(name)
    value: AxisValue = text
    if ax.is_int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name}={text!r}: {name} takes a whole number") from None
    elif ax.on_off and text.lower() in ("true", "false"):
        value = "on" if text.lower() == "true" else "off"
    allowed = known.get(name, ())
    if value not in allowed:
        shown = ", ".join(str(v) for v in allowed) or "none"
        raise ValueError(f"{name}={text!r} is not in this job; its values: {shown}")
    return value


def fold_axis_values(data: Any, level: Literal["server", "request"]) -> Any:
    """Validator input with axis values given as keywords (``thinking="on"``, as code
    and rows written before axes were a mapping give them) folded into ``axes``, in
    :data:`AXES` order, and axes added since filled with their implicit value; other
    input is returned as it is."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    given = dict(data.pop("axes", None) or {})
    for a in AXES:
        if a.level == level and a.name in data:
            given[a.name] = data.pop(a.name)
    for a in AXES:
        # Written before the axis existed: it had the axis's implicit value.
        if a.level == level and a.name not in given and a.implicit is not None:
            given[a.name] = a.implicit
    data["axes"] = {a.name: given.pop(a.name) for a in AXES if a.name in given} | given
    return data


def speculates(mtp_depth: int) -> bool:
    """Whether a cell at ``mtp_depth`` drafts tokens. Depth 0 is the spec-off run: it
    has no acceptance (no drafts), serves as the greedy reference, and is left out of
    every acceptance comparison. The one place that decides it."""
    return int(mtp_depth) > 0

"""Where a cell may run: node labels, accelerator types, the live nodes and their room."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
import ray.util.client

from farm.spec import ResourceSpec


def node_label(node: Mapping[str, Any]) -> str:
    """``host:node-id-prefix`` of a ``ray.nodes()`` entry, as cells record it."""
    return f"{node.get('NodeManagerHostname', '?')}:{str(node['NodeID'])[:8]}"


class Placement:
    """Ray scheduling options of one cell: resources, node labels, retries on node loss."""

    def __init__(
        self, resources: ResourceSpec, pools: tuple[str, ...] = (), npus: int | None = None
    ) -> None:
        """``npus`` (a model's own count) overrides ``resources.npus``."""
        self.need: dict[str, float] = {"CPU": resources.cpus}
        npus = npus if npus is not None else resources.npus
        if npus:
            self.need["NPU"] = npus
        self.memory = int(resources.memory_gb * 2**30) if resources.memory_gb else None
        self.labels = dict(resources.label_selector)
        if pools:
            self.labels["pool"] = pools[0] if len(pools) == 1 else f"in({','.join(pools)})"
        self.retries = resources.node_retries

    @property
    def holds(self) -> dict[str, float]:
        """Every resource the cell holds, memory (bytes) included."""
        return {**self.need, **({"memory": float(self.memory)} if self.memory else {})}

    def options(self, name: str) -> dict[str, Any]:
        custom = {k: v for k, v in self.need.items() if k != "CPU"}
        options: dict[str, Any] = {
            "num_cpus": self.need["CPU"],
            "resources": custom,
            # System failures only (a node or worker lost): an engine that fails
            # returns a failed result and is not retried.
            "max_retries": self.retries,
            "retry_exceptions": False,
            "name": name,
        }
        if self.memory:
            options["memory"] = self.memory
        if self.labels:
            options["label_selector"] = self.labels
        return options

    def fits(self, node: Mapping[str, Any]) -> bool:
        """Whether a node of ``ray.nodes()`` could ever hold this cell."""
        have = node.get("Resources", {})
        if not all(have.get(k, 0) >= v for k, v in self.holds.items()):
            return False
        labels = node.get("Labels", {}) or {}
        return all(_label_matches(labels.get(k), v) for k, v in self.labels.items())


def _label_matches(value: str | None, selector: str) -> bool:
    negate = selector.startswith("!")
    body = selector[1:] if negate else selector
    if body.startswith("in(") and body.endswith(")"):
        hit = value in {v.strip() for v in body[3:-1].split(",")}
    else:
        hit = value == body
    return hit != negate


def _driver_node() -> str | None:
    """The node the driver runs on; None through Ray Client, where the driver is elsewhere
    (Ray then reports the head's id)."""
    if ray.util.client.ray.is_connected():  # type: ignore[no-untyped-call]
        return None
    return str(ray.get_runtime_context().get_node_id())


def _alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]


def _capacity(node: Mapping[str, Any]) -> dict[str, float]:
    have = node.get("Resources", {})
    return {k: float(have[k]) for k in ("CPU", "NPU", "memory") if k in have}

"""Imports point down (STYLE.md "One judgement, one direction").

Every module of ``farm/`` sits on a floor; a module imports only modules of its own
floor or below, and no set of modules imports itself round in a circle. Every import
counts: at module level, inside a function, and under ``TYPE_CHECKING`` (a cycle that
only type checking sees is still a cycle for a reader). ``importlib.import_module``
of a farm module (the way to hide an import from this test) is refused outright.

``FARM_LAYERS_ROOT`` names another checkout to hold to the same rules (to show that
the test fails on a tree that breaks them).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("FARM_LAYERS_ROOT", Path(__file__).resolve().parents[2]))

# Lowest floor first. A module takes the floor of the longest prefix listed; the bare
# package ``farm`` stands for its __init__ alone, so a new top-level module must be
# placed.
FLOORS: tuple[tuple[str, ...], ...] = (
    # 0: base: errors, settings, files, the axis list (data); the pure checks of bad
    # input every layer shares (bounds, inert text, masking, job text)
    (
        "farm",
        "farm.errors",
        "farm.frozen",
        "farm.axes",
        "farm.yamlfile",
        "farm.fileformat",
        "farm.settings",
        "farm.paths",
        "farm.bounds",
        "farm.inert",
        "farm.masking",
        "farm.job_text",
    ),
    # 1: what a job is and what it measured
    (
        "farm.spec",
        "farm.comparable",
        "farm.plan",
        "farm.records",
    ),
    # 2: stored result types (verdicts, findings, alerts, bisections, baseline cells)
    ("farm.results",),
    # 3: pure statistics and the one judgement
    ("farm.analysis",),
    # 4: the stages that build, run and measure
    ("farm.builds", "farm.engines", "farm.workload", "farm.runner", "farm.dashboards"),
    # 5: the store and the Ray pool
    ("farm.store", "farm.orchestrate"),
    # 6: views of results: renderers and notification channels
    ("farm.report", "farm.notify"),
    # 7: the uses, end to end
    ("farm.workflows",),
    # 8: parse and print
    ("farm.cli",),
)

# Pure modules: below every renderer, channel and store, whatever their floor.
PURE = ("farm.plan", "farm.spec", "farm.results", "farm.analysis", "farm.orchestrate.schedule")
IO_PACKAGES = ("farm.store", "farm.report", "farm.notify", "farm.orchestrate", "farm.runner")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((ROOT / "farm").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("farm"):
            for alias in node.names:
                target = _resolve(f"{node.module}.{alias.name}")
                if target is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("farm") and (target := _resolve(alias.name)):
                    yield target, node.lineno


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in _imports(p)} - {m} for m, p in MODULES.items()}


def floor_of(module: str) -> int:
    best, floor = -1, -1
    for i, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            below = module.startswith(prefix + ".") and prefix != "farm"
            if (module == prefix or below) and len(prefix) > best:
                best, floor = len(prefix), i
    assert floor >= 0, f"{module} stands on no floor: add it to FLOORS"
    return floor


def test_every_module_has_a_floor() -> None:
    for module in MODULES:
        floor_of(module)


def test_a_module_nobody_placed_has_no_floor() -> None:
    """Before: the base floor's ``farm`` prefix took any module, so the test above
    could not fail."""
    for unplaced in ("farm.nosuch", "farm.nosuch.deeper"):
        with pytest.raises(AssertionError, match="stands on no floor"):
            floor_of(unplaced)
    assert floor_of("farm") == 0 and floor_of("farm.analysis.judgement") == 3


def test_no_import_runs_up_a_floor() -> None:
    upward = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: {m} (floor {floor_of(m)}) imports "
        f"{t} (floor {floor_of(t)})"
        for m, path in MODULES.items()
        for t, line in _imports(path)
        if floor_of(t) > floor_of(m)
    ]
    assert not upward, "imports that run up:\n" + "\n".join(upward)


def test_pure_modules_import_no_store_renderer_or_channel() -> None:
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {t}"
        for m, path in MODULES.items()
        if m.startswith(PURE)
        for t, line in _imports(path)
        if t.startswith(IO_PACKAGES)
    ]
    assert not bad, "pure modules import I/O:\n" + "\n".join(bad)


def test_no_workflow_decision_imports_a_renderer() -> None:
    # The pure decisions of the three uses (nightly, pr, bisect) feed the renderers.
    pure = (
        "farm.workflows.nightly.decide",
        "farm.workflows.pr.decide",
        "farm.workflows.bisect.decide",
    )
    bad = [
        f"{m} imports {t}"
        for m in pure
        if m in MODULES
        for t, _ in _imports(MODULES[m])
        if t.startswith(IO_PACKAGES)
    ]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # Tarjan's strongly connected components; a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_hidden_import() -> None:
    hidden = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
            ):
                hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}: {m}")
    assert not hidden, "imports hidden from this test:\n" + "\n".join(hidden)


def test_every_family_has_one_adapter() -> None:
    from farm.engines import ADAPTERS
    from farm.spec.families import ENGINE_FAMILIES

    assert tuple(ADAPTERS) == ENGINE_FAMILIES

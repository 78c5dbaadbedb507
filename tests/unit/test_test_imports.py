"""Tests share through ``tests/support/`` (helpers), ``tests/fakes/`` (FAKE services,
runners and adapters) and fixtures registered in ``tests/conftest.py``; no module under
``tests/`` or ``bench/`` imports a test module (``test_*.py``), at module level or inside
a function. A test module imported by another runs its module-level code twice under
two names, and its private helpers become an interface nobody declared. The package
stands without its tests: nothing in ``farm/`` imports ``tests``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def imports_of_test_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in ``path`` that names a test module."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from tests.integration import test_x` names the module in the alias
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            if _is_test_module(name):
                yield node.lineno, name


def _python_files() -> Iterator[Path]:
    for folder in ("tests", "bench"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_imports_a_test_module() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in _python_files()
        for line, name in imports_of_test_modules(path)
    ]
    assert not found, "move what they share to tests/support/ or tests/fakes/:\n" + "\n".join(found)


def test_the_package_imports_nothing_from_tests() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "farm").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if (isinstance(node, ast.Import) and any(_in_tests(a.name) for a in node.names))
        or (isinstance(node, ast.ImportFrom) and node.level == 0 and _in_tests(node.module))
    ]
    assert not found, "fakes and helpers of the tests live under tests/:\n" + "\n".join(found)


def _in_tests(module: str | None) -> bool:
    return module is not None and (module == "tests" or module.startswith("tests."))


def test_each_kind_of_import_of_a_test_module_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import tests.unit.test_a\n"
        "from tests.integration.test_b import helper\n"
        "from tests.integration import test_c\n"
        "from test_d import fixture\n"
        "def f():\n"
        "    from tests.unit.test_e import _late\n"
        "from tests.support.stores import fill_store\n"
        "from tests.fakes.receiver import Receiver\n"
    )
    assert [line for line, _ in imports_of_test_modules(module)] == [1, 2, 3, 4, 6]

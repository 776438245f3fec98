"""No module of trtpack, and no test, uses another module's private (``_name``) functions or
constants, by import (``from trtpack.x import _y``) or by attribute (``x._y`` on an imported
trtpack module): what is shared is public, in one home."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent
TESTS = Path(__file__).resolve().parents[1]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def private_uses(source: str) -> list[str]:
    """``module._name`` for each private name of a trtpack module that ``source`` uses."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> trtpack module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 \
                and (node.module or "").split(".")[0] == "trtpack":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _private(a.name):
                    found.append(full)
                elif _is_module(full):
                    modules[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "trtpack" and a.asname:
                    modules[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in modules and _private(node.attr):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return found


def test_private_uses_are_found() -> None:
    assert private_uses("def f():\n    from trtpack.x import _y, z\n") == ["trtpack.x._y"]
    assert private_uses("from trtpack.stages import export\nexport._example_inputs(1)\n") \
        == ["trtpack.stages.export._example_inputs"]
    assert private_uses("from trtpack.stages import export\nexport.run(1)\n") == []


def test_no_module_or_test_uses_a_private_name_of_another() -> None:
    files = [*sorted(PACKAGE.rglob("*.py")), *sorted(TESTS.rglob("*.py"))]
    found = {str(p): private_uses(p.read_text(encoding="utf-8")) for p in files}
    assert {k: v for k, v in found.items() if v} == {}

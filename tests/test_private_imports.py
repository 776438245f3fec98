"""No trtpack module imports another module's private (``_name``) functions or constants:
what is shared is public, in one home."""

from __future__ import annotations

import ast
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent


def private_imports(source: str) -> list[str]:
    """``module.name`` for each ``from trtpack... import _name`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trtpack"):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_private_imports_are_found() -> None:
    assert private_imports("def f():\n    from trtpack.x import _y, z\n") == ["trtpack.x._y"]


def test_no_module_imports_a_private_name_of_another() -> None:
    found = {str(p.relative_to(PACKAGE)): private_imports(p.read_text(encoding="utf-8"))
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}

"""trtpack declares ``requires-python >=3.10`` (Ubuntu 22.04 LTS ships Python 3.10): every
standard-library name the package, its tests and its benchmarks import or read off a module
(``from typing import Self``, ``datetime.UTC``, ``import tomllib``) must exist in Python
3.10's standard library, unless the code picks another under a ``sys.version_info`` check or
a ``try: ... except ModuleNotFoundError`` (or only for type checking). Checked against a real
Python 3.10 (pyenv's, or ``TRTPACK_PYTHON310``); ``.ci/run`` also installs and imports
trtpack there and runs the tests that need no torch."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON310 = Path(os.environ.get("TRTPACK_PYTHON310",
                                Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python"))
FOLDERS = ("trtpack", "tests", "benchmarks")


def _guarded(node: ast.AST) -> bool:
    """A block that chooses by Python version, catches a missing module, or runs only for
    the type checker."""
    if isinstance(node, ast.If):
        text = ast.unparse(node.test)
        return "version_info" in text or "TYPE_CHECKING" in text
    if isinstance(node, ast.Try):
        return any(h.type is not None and any(n in ast.unparse(h.type) for n in
                                              ("ImportError", "ModuleNotFoundError"))
                   for h in node.handlers)
    return False


def stdlib_names(tree: ast.AST) -> set[tuple[str, str]]:
    """(module, name) for each ``import m`` (name ""), ``from m import n`` and ``m.n`` of a
    standard-library module outside the guarded blocks."""
    found: set[tuple[str, str]] = set()
    aliases: dict[str, str] = {}

    def stdlib(module: str) -> bool:
        return module.split(".")[0] in sys.stdlib_module_names

    def visit(node: ast.AST) -> None:
        if _guarded(node):
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                if stdlib(a.name):
                    found.add((a.name, ""))
                    aliases[a.asname or a.name.split(".")[0]] = (a.asname and a.name) or \
                        a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and stdlib(node.module):
            found.update((node.module, a.name) for a in node.names if a.name != "*")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            found.add((aliases[node.value.id], node.attr))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


CHECK = """
import importlib, json, sys
missing = []
for module, name in json.load(sys.stdin):
    try:
        m = importlib.import_module(module)
    except ModuleNotFoundError:
        missing.append([module, name, "no module"]); continue
    except ImportError:
        continue  # present, but needs something this interpreter lacks (tkinter, ...)
    if name and not hasattr(m, name):
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append([module, name, "no name"])
print(json.dumps(missing))
"""


def missing_in(python: Path, names: set[tuple[str, str]]) -> list[list[str]]:
    result = subprocess.run([str(python), "-I", "-c", CHECK], input=json.dumps(sorted(names)),
                            capture_output=True, text=True, timeout=120, check=True)
    return json.loads(result.stdout)


def test_the_scan_finds_python311_names() -> None:
    """The scan sees what broke trtpack on 3.10 (issue 45, item 1), and not a guarded one."""
    code = ("import datetime\nfrom typing import Self\nimport tomllib\n"
            "x = datetime.UTC\n"
            "if sys.version_info >= (3, 11):\n    from typing import NotRequired\n"
            "try:\n    import tomllib as t\nexcept ModuleNotFoundError:\n    pass\n")
    names = stdlib_names(ast.parse(code))
    assert {("typing", "Self"), ("datetime", "UTC")} <= names
    # tomllib is a standard module from 3.11 on (sys.stdlib_module_names of 3.10 lacks it)
    assert (("tomllib", "") in names) == ("tomllib" in sys.stdlib_module_names)
    assert ("typing", "NotRequired") not in names


@pytest.mark.skipif(not PYTHON310.is_file(), reason=f"no Python 3.10 at {PYTHON310} "
                    "(set TRTPACK_PYTHON310)")
def test_every_standard_library_name_exists_in_python310() -> None:
    names: dict[tuple[str, str], str] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for key in stdlib_names(ast.parse(path.read_text(encoding="utf-8"))):
                names.setdefault(key, str(path.relative_to(ROOT)))
    # names this interpreter's standard library has (a local variable that shadows a module,
    # ``html.count`` of a string named html, is not one)
    real = set(names) - {(m, n) for m, n, _ in missing_in(Path(sys.executable), set(names))}
    # the check itself must be able to fail: Self is the name that broke 3.10
    assert missing_in(PYTHON310, {("typing", "Self")}) == [["typing", "Self", "no name"]]
    missing = missing_in(PYTHON310, real)
    assert not missing, [f"{names[(m, n)]}: {m}{'.' + n if n else ''} ({why} in Python 3.10)"
                         for m, n, why in missing]

"""One home for each fact: a module-level constant (an UPPER_CASE name bound to a literal)
is defined once in trtpack, and imported where else it is needed."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent
KNOWN: dict[str, str] = {}
"""Duplicates left on purpose, with the reason."""


def duplicated_constants(sources: dict[str, str]) -> dict[str, list[str]]:
    """NAME=value -> the modules that each define it, for those defined in more than one."""
    homes: dict[str, list[str]] = defaultdict(list)
    for module, source in sources.items():
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                homes[f"{node.targets[0].id}={value!r}"].append(module)
    return {k: v for k, v in homes.items() if len(v) > 1}


def test_duplicates_are_found() -> None:
    assert duplicated_constants({"a.py": "X = '1'\nY = 2\n", "b.py": "X = '1'\nY = 3\n"}) \
        == {"X='1'": ["a.py", "b.py"]}


def test_each_constant_has_one_home() -> None:
    sources = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8")
               for p in sorted(PACKAGE.rglob("*.py"))}
    found = duplicated_constants(sources)
    assert {k: v for k, v in found.items() if k.split("=")[0] not in KNOWN} == {}

"""No import circle between trtpack's modules: the dependency graph (every import, at module
level, in a function or under ``TYPE_CHECKING``) has no cycle. A module that needs another's
shape for typing takes a Protocol of its own instead of importing the class (as
``precision.conversion.ConversionContext`` does), and a lower module that needs a higher one's
work takes it as a callback (as ``precision.int8.fallback.search_groups`` does)."""

from __future__ import annotations

import ast

from tests.architecture.test_layers import module_sources


def module_imports(module: str, source: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` imports: ``from trtpack.x import y`` is
    ``trtpack.x.y`` when that is a module, else ``trtpack.x``; relative imports resolve
    against ``module`` (a package is named for its ``__init__``)."""
    is_package = any(m.startswith(f"{module}.") for m in modules)
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return (found & modules) - {module}


def import_circles(sources: dict[str, str]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (a circle), sorted."""
    modules = set(sources)
    graph = {m: sorted(module_imports(m, s, modules)) for m, s in sources.items()}
    # Tarjan's algorithm, iterative (the package is deep enough to matter for recursion)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, next_edge = work.pop()
            if next_edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            edges = graph[node]
            if next_edge < len(edges):
                work.append((node, next_edge + 1))
                target = edges[next_edge]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return sorted(circles)


def test_a_circle_is_found() -> None:
    sources = {
        "trtpack.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from trtpack.b import B\n",
        "trtpack.b": "def f():\n    from trtpack import c\n",
        "trtpack.c": "import trtpack.a\n",
        "trtpack.d": "from trtpack.a import x\n",
    }
    assert import_circles(sources) == [["trtpack.a", "trtpack.b", "trtpack.c"]]
    del sources["trtpack.c"]
    assert import_circles(sources) == []


def test_a_relative_import_counts() -> None:
    sources = {"trtpack.p": "", "trtpack.p.a": "from . import b\n",
               "trtpack.p.b": "from .a import x\n"}
    assert import_circles(sources) == [["trtpack.p.a", "trtpack.p.b"]]


def test_no_import_circle() -> None:
    assert import_circles(module_sources()) == []

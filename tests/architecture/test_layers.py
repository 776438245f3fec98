"""Imports go one way: cli -> api -> pipeline -> stages -> (precision, serving and the other
libraries) -> engine -> runtimes -> core. A module may import its own layer or a lower one, never
a higher one (function-level imports count: they are dependencies too). The layers list rooms:
the packages under trtpack/ and the few modules at its top level, each room in one layer, so a
new module inside a package needs no entry, and a new room must be placed (ARCHITECTURE.md says
where things go). Between rooms there is no circle, in a layer either."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent

# lowest first: the rooms (packages and top-level modules) of each layer
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("trtpack", "trtpack.errors", "trtpack.report", "trtpack.json_values",
              "trtpack.shapes", "trtpack.options",
              "trtpack.cases", "trtpack.processes", "trtpack.resources", "trtpack.timing",
              "trtpack.model_io", "trtpack.out_files",
              "trtpack.sources", "trtpack.machine", "trtpack.onnx_tools")),
    ("runtimes", ("trtpack.runtimes",)),
    ("engine", ("trtpack.engine",)),  # builder settings, provenance: never serving
    ("libraries", ("trtpack.pytorch", "trtpack.verify", "trtpack.precision", "trtpack.serving",
                   "trtpack.report_page")),
    ("stages", ("trtpack.stages",)),
    ("pipeline", ("trtpack.pipeline",)),
    ("api", ("trtpack.api", "trtpack.python_api", "trtpack.bench", "trtpack.diagnostics")),
    ("cli", ("trtpack.cli", "trtpack.testing")),
)


def room_of(module: str) -> str:
    """``trtpack.sources.recipe`` -> ``trtpack.sources``; ``trtpack.errors`` stays."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int | None:
    room = room_of(module)
    for index, (_, rooms) in enumerate(LAYERS):
        if room in rooms:
            return index
    return None


def imported_modules(source: str) -> set[str]:
    """The trtpack modules ``source`` imports (``from trtpack import x`` counts as
    ``trtpack.x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "trtpack":
            if node.module == "trtpack":
                found.update(f"trtpack.{a.name}" for a in node.names
                             if not a.name.startswith("__"))
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "trtpack")
    return found


def module_sources() -> dict[str, str]:
    """Every module of the package (the Triton Python-backend models in serving/templates/
    run inside Triton and import nothing of trtpack)."""
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "serving" / "templates"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def upward_imports(sources: dict[str, str]) -> list[str]:
    """``a -> b`` for each import of a module in a higher layer than the importer's."""
    found = []
    for module, source in sources.items():
        own = layer_of(module)
        for dep in sorted(imported_modules(source)):
            other = layer_of(dep)
            if own is not None and other is not None and other > own:
                found.append(f"{module} ({LAYERS[own][0]}) -> {dep} ({LAYERS[other][0]})")
    return found


def test_an_upward_import_is_found() -> None:
    sources = {"trtpack.stages.x": "def f():\n    from trtpack.pipeline.runner import build\n",
               "trtpack.pipeline.y": "from trtpack.stages import x\n"}
    assert upward_imports(sources) == [
        "trtpack.stages.x (stages) -> trtpack.pipeline.runner (pipeline)"]


def test_every_module_has_a_layer() -> None:
    assert [m for m in module_sources() if layer_of(m) is None] == []


def test_imports_go_one_way() -> None:
    assert upward_imports(module_sources()) == []


def room_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Room -> the other rooms it imports."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        edges = graph.setdefault(room_of(module), set())
        edges.update(room_of(dep) for dep in imported_modules(source))
    for room, edges in graph.items():
        edges.discard(room)
    return graph


def circle(graph: Mapping[str, set[str]]) -> list[str]:
    """A circle of rooms (``a -> b -> a``), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(room: str) -> list[str]:
        state[room] = 1
        path.append(room)
        for nxt in sorted(graph.get(room, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[room] = 2
        return []

    for room in sorted(graph):
        if room not in state and (found := visit(room)):
            return found
    return []


def test_a_circle_is_found() -> None:
    sources = {"trtpack.verify.a": "from trtpack.precision.b import x\n",
               "trtpack.precision.b": "def f():\n    from trtpack.verify import a\n",
               "trtpack.serving.c": "from trtpack.verify.a import y\n"}
    assert circle(room_graph(sources)) == ["trtpack.precision", "trtpack.verify",
                                           "trtpack.precision"]


def test_rooms_import_each_other_without_circles() -> None:
    assert circle(room_graph(module_sources())) == []


def test_each_room_is_in_one_layer() -> None:
    rooms = [room for _, layer in LAYERS for room in layer]
    assert len(rooms) == len(set(rooms))
    assert [r for r in rooms if r != "trtpack" and r.count(".") != 1] == []


def test_the_top_level_holds_few_modules() -> None:
    """Packages show the layers: trtpack/ keeps at most 12 modules beside its packages."""
    modules = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    assert len(modules) <= 12, sorted(modules)

"""Imports go one way: cli -> api -> pipeline -> stages -> (precision, serving and the other
libraries) -> engine -> runtimes -> core. A module may import its own layer or a lower one, never
a higher one (function-level imports count: they are dependencies too). Every module has a
layer, so a new module must be placed (ARCHITECTURE.md says where things go)."""

from __future__ import annotations

import ast
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent

# lowest first; a module belongs to the layer of its longest matching prefix
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("trtpack", "trtpack.errors", "trtpack.report", "trtpack.sources.recipe",
              "trtpack.sources.recipe_files", "trtpack.sources.resolve", "trtpack.sources.heads", "trtpack.sources.hf_recipe",
              "trtpack.sources.onnx_recipe", "trtpack.shapes", "trtpack.machine.targets", "trtpack.options",
              "trtpack.onnx_tools.files", "trtpack.processes", "trtpack.resources", "trtpack.cases",
              "trtpack.verify.samples", "trtpack.sources.tokenizer_files", "trtpack.timing",
              "trtpack.model_io", "trtpack.machine", "trtpack.machine.local_targets",
              "trtpack.out_files")),
    ("runtimes", ("trtpack.runtimes",)),
    ("engine", ("trtpack.engine",)),  # builder settings, provenance: never serving
    ("libraries", ("trtpack.precision", "trtpack.serving", "trtpack.verify.compare",
                   "trtpack.verify.sample_metrics", "trtpack.onnx_tools.simplify_graph", "trtpack.pytorch.models",
                   "trtpack.pytorch.onnx_export",
                   "trtpack.report_page.html", "trtpack.report_page.charts", "trtpack.report_page.svg_bars")),
    ("stages", ("trtpack.stages",)),
    ("pipeline", ("trtpack.pipeline",)),
    ("api", ("trtpack.api", "trtpack.diagnostics.doctor", "trtpack.diagnostics.inspection", "trtpack.bench",
             "trtpack.bench.runners", "trtpack.bench.timing", "trtpack.bench.served",
             "trtpack.pipeline.build_folder")),
    ("cli", ("trtpack.cli", "trtpack.cli.outputs", "trtpack.cli.cache", "trtpack.cli.console",
             "trtpack.cli.views", "trtpack.testing")),
)


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "trtpack"
                                          and module.startswith(prefix + "."))
            if inside and (
                    best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


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

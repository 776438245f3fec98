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
    ("core", ("trtpack", "trtpack.errors", "trtpack.report", "trtpack.recipe",
              "trtpack.recipe_files", "trtpack.resolve", "trtpack.heads", "trtpack.hf_recipe",
              "trtpack.onnx_recipe", "trtpack.shapes", "trtpack.targets", "trtpack.options",
              "trtpack.onnx_files", "trtpack.processes", "trtpack.resources", "trtpack.cases",
              "trtpack.samples", "trtpack.tokenizer_files", "trtpack.timing",
              "trtpack.model_io", "trtpack.machine", "trtpack.local_targets",
              "trtpack.out_files")),
    ("runtimes", ("trtpack.runtimes",)),
    ("engine", ("trtpack.engine",)),  # builder settings, provenance: never serving
    ("libraries", ("trtpack.precision", "trtpack.serving", "trtpack.verification",
                   "trtpack.sample_metrics", "trtpack.simplify_graph", "trtpack.models",
                   "trtpack.onnx_export",
                   "trtpack.report_html", "trtpack.report_charts", "trtpack.svg_bars")),
    ("stages", ("trtpack.stages",)),
    ("pipeline", ("trtpack.pipeline",)),
    ("api", ("trtpack.api", "trtpack.doctor", "trtpack.inspection", "trtpack.bench",
             "trtpack.bench_runners", "trtpack.bench_timing", "trtpack.bench_served",
             "trtpack.build_folder")),
    ("cli", ("trtpack.cli", "trtpack.cli_outputs", "trtpack.cli_cache", "trtpack.console",
             "trtpack.console_views", "trtpack.testing")),
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

"""engine/, serving/ and the modules below them import one way: serving may import engine,
engine never imports serving, and neither imports the stages, the pipeline, the API or the
CLI. Every import counts, also those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent
HIGHER = ("trtpack.stages", "trtpack.pipeline", "trtpack.api", "trtpack.cli", "trtpack.bench",
          "trtpack.inspect", "trtpack.doctor")
FORBIDDEN = {
    "engine": ("trtpack.serving", *HIGHER),
    "runtimes": ("trtpack.serving", "trtpack.engine", "trtpack.precision", *HIGHER),
    "model_io.py": ("trtpack.serving", "trtpack.engine", "trtpack.runtimes", *HIGHER),
    "machine.py": ("trtpack.serving", "trtpack.engine", "trtpack.runtimes", *HIGHER),
    "serving": HIGHER,
}


def imported_modules(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def violations(files: dict[str, str]) -> list[str]:
    """``file -> module`` for each import of a module a file's room may not import."""
    found = []
    for name, source in files.items():
        room = name.split("/")[0]
        for module in sorted(imported_modules(source)):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN.get(room, ())):
                found.append(f"{name} -> {module}")
    return found


def test_a_wrong_way_import_is_found() -> None:
    assert violations({"engine/x.py": "def f():\n    from trtpack.serving.config import a\n",
                       "serving/y.py": "from trtpack.engine import provenance\n"}) == [
        "engine/x.py -> trtpack.serving.config", "engine/x.py -> trtpack.serving.config.a"]


def test_engine_and_serving_import_one_way() -> None:
    files = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8")
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert violations(files) == []

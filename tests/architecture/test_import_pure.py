"""Every module of trtpack imports, and the CLI starts, with the heavy frameworks (and
matplotlib) blocked: they are imported inside the stage or function that needs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trtpack

BLOCKER = r"""
import sys, importlib.abc
HEAVY = {"torch", "onnx", "onnxruntime", "modelopt", "tensorrt", "transformers",
         "polygraphy", "onnxsim", "onnxscript", "onnx_graphsurgeon"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"blocked heavy import: {name}")
        return None
sys.meta_path.insert(0, Block())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True,
                          text=True, timeout=120, check=False)


def every_module() -> list[str]:
    """Every module under trtpack/, found on disk (a new module is checked without listing
    it here), except the Triton Python-backend models in serving/templates/, which are
    copied into model repositories and run inside Triton, not imported by trtpack."""
    root = Path(trtpack.__file__).parent
    names = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(root / "serving" / "templates"):
            continue
        parts = path.relative_to(root.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_without_heavy_packages() -> None:
    modules = every_module()
    assert "trtpack.pipeline" in modules and "trtpack.stages.export" in modules
    proc = run_blocked(
        f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
        "from trtpack.sources.resolve import resolve_model\n"
        "r = resolve_model('minilm')\n"
        "from trtpack.shapes import parse_profile\n"
        "print(parse_profile('1x8:4x32:8x128', r.input_specs()))\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in HEAVY | {'matplotlib'}]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "input_ids=1x8:4x32:8x128" in proc.stdout


def test_block_really_blocks() -> None:
    """The blocker itself works (so the test above can fail)."""
    proc = run_blocked("import torch")
    assert proc.returncode != 0
    assert "blocked heavy import: torch" in proc.stderr


def test_cli_help_and_light_commands_without_heavy_packages() -> None:
    for argv in (["--help"], ["build", "--help"], ["recipes", "list"], ["targets"]):
        proc = run_blocked(f"import sys; sys.argv = ['trtpack', *{argv!r}]\n"
                    "from trtpack.cli.app import main\n"
                    "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")
        assert proc.returncode == 0, (argv, proc.stderr)
        assert proc.stdout.strip(), argv

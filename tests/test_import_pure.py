"""The core imports, and the CLI starts, with the heavy frameworks blocked."""

from __future__ import annotations

import subprocess
import sys

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


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True,
                          text=True, timeout=120, check=False)


def test_core_modules_import_without_heavy_packages() -> None:
    proc = _run(
        "import trtpack, trtpack.api, trtpack.cli, trtpack.recipe, trtpack.shapes, "
        "trtpack.targets, trtpack.report, trtpack.pipeline, trtpack.options, trtpack.stages.base, trtpack.onnx_files, trtpack.serving.config, "
        "trtpack.verification, trtpack.cases, trtpack.samples, trtpack.doctor, trtpack.gpu, "
        "trtpack.tokenizer_files\n"
        "from trtpack.recipe import resolve_model\n"
        "r = resolve_model('minilm')\n"
        "from trtpack.shapes import parse_profile\n"
        "print(parse_profile('1x8:4x32:8x128', r.input_specs()))\n"
        "from trtpack.serving.config import model_config, ModelIO, TensorIO\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in HEAVY]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "input_ids=1x8:4x32:8x128" in proc.stdout


def test_block_really_blocks() -> None:
    """The blocker itself works (so the test above can fail)."""
    proc = _run("import torch")
    assert proc.returncode != 0
    assert "blocked heavy import: torch" in proc.stderr


def test_cli_help_and_light_commands_without_heavy_packages() -> None:
    for argv in (["--help"], ["build", "--help"], ["recipes", "list"], ["targets"]):
        proc = _run(f"import sys; sys.argv = ['trtpack', *{argv!r}]\n"
                    "from trtpack.cli import main\n"
                    "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")
        assert proc.returncode == 0, (argv, proc.stderr)
        assert proc.stdout.strip(), argv


def test_bench_and_report_page_modules_import_light() -> None:
    """bench, bench_served and report_html import without the heavy frameworks, and matplotlib
    only when a page is drawn."""
    proc = _run(
        "import trtpack.bench, trtpack.bench_served, trtpack.report_html\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in HEAVY | {'matplotlib'}]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout

"""The docs' Python as a test, as ``tests/test_readme.py`` does for commands: every fenced
``python`` block of the README and ``docs/`` compiles, and each page's blocks run in order,
in one fresh folder, in a Python process of their own with this checkout's package (each
build writes its OUT under that folder and its stage cache under the test's)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, python_path

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(document: Path) -> list[tuple[int, str]]:
    """(line, code) of each fenced python block."""
    text = document.read_text()
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)]


PAGES = [d for d in DOCUMENTS if python_blocks(d)]


def test_the_docs_have_python_examples() -> None:
    assert ROOT / "docs" / "any-model.md" in PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_compiles(page: Path) -> None:
    for line, code in python_blocks(page):
        try:
            ast.parse(code)
        except SyntaxError as e:
            pytest.fail(f"{page.relative_to(ROOT)}:{line + (e.lineno or 1) - 1}: {e.msg}")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page: Path, tmp_path: Path) -> None:
    # python_path(): this checkout first, once, as for every trtpack process the tests start
    # (the suite's stage server serves a build only in its own environment, PYTHONPATH too)
    env = {**os.environ, "PYTHONPATH": python_path(),
           "TRTPACK_CACHE_DIR": str(tmp_path / "cache")}
    for line, code in python_blocks(page):
        script = tmp_path / f"block_{line}.py"
        script.write_text(code)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, (f"{page.relative_to(ROOT)}:{line}: the block failed\n"
                                      f"{done.stderr[-3000:]}")

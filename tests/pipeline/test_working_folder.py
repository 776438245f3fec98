"""Every Python process trtpack starts imports the installed trtpack wherever the user stands:
a folder named ``trtpack/`` in the working directory (the folder that holds a clone) shadows
nothing, in the stage processes, the memory estimate's describe process, the TensorRT probe
or the ModelOpt worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from trtpack.processes import python_code_command, python_module_command

SHADOW = "raise ImportError('the working folder trtpack/ was imported')\n"


def _shadowed_folder(tmp_path: Path) -> Path:
    """A working folder holding a ``trtpack/`` package that fails on import, and a
    ``trtpack/`` namespace folder as a clone's parent has."""
    here = tmp_path / "here"
    (here / "trtpack").mkdir(parents=True)
    (here / "trtpack" / "__init__.py").write_text(SHADOW)
    return here


def test_child_commands_import_the_installed_package(tmp_path: Path) -> None:
    here = _shadowed_folder(tmp_path)
    code = "import trtpack, sys; print(trtpack.__file__); print(sys.argv[1:])"
    done = subprocess.run(python_code_command(code), cwd=here, capture_output=True,
                          text=True, check=True)
    assert Path(done.stdout.splitlines()[0]).parent == ROOT / "trtpack", done.stdout
    # a module run as ``-m`` gets its arguments and runs as __main__
    done = subprocess.run(python_module_command("trtpack.cli", "--version"), cwd=here,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip(), done.stdout + done.stderr
    # what plain ``python -m`` does there: the reason for all this
    plain = subprocess.run([sys.executable, "-m", "trtpack.cli", "--version"], cwd=here,
                           capture_output=True, text=True, check=False)
    assert plain.returncode != 0 and "working folder trtpack/" in plain.stderr


def test_a_build_from_a_folder_holding_trtpack(tmp_path: Path) -> None:
    """The issue's blocker: a first build (an empty cache, so the memory estimate's process
    runs too) from the folder that holds a ``trtpack/`` folder."""
    here = _shadowed_folder(tmp_path)
    script = Path(sys.executable).parent / "trtpack"
    done = subprocess.run(
        [str(script), "build", "tiny-bert", "--random-weights", "--target", "cpu",
         "--precision", "fp32", "--profile", "1x4:2x8:4x16", "--cache-dir", "fresh-cache",
         "--out", "out"], cwd=here, capture_output=True, text=True, timeout=600,
        check=False, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (here / "out" / "model_repository").is_dir()
    assert "memory not estimated" not in done.stdout + done.stderr

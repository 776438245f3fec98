"""The export stage's process imports transformers' model code without scipy
(``pytorch.models.import_model_code``, issue 47), and a model still loads and runs; the
switch it turns while importing is turned back."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from trtpack.pytorch.models import TRANSFORMERS_WITHOUT_SCIPY

CHECK = """
import sys
import transformers.utils
original = transformers.utils.is_scipy_available
from trtpack.pipeline.isolate import import_quietly
from trtpack.pipeline.stage import STAGES
export = next(s for s in STAGES if s.name == "export")
import_quietly(export.warm_modules)
assert "transformers.modeling_utils" in sys.modules
print("scipy imported:", "scipy.optimize" in sys.modules)
assert transformers.utils.is_scipy_available is original
from trtpack.api import BuildRequest, resolve_options
from trtpack.pytorch.models import load_model
from trtpack.stages.export import build_cases, output_selector
from trtpack.stages.reference_pass import run_torch
plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu", profiles=["1x4:2x8:4x16"]))
loaded = load_model(plan.recipe, random_weights=True, seed=plan.seed)
cases, _, _ = build_cases(plan, loaded)
run_torch(output_selector(loaded.module, plan.recipe), plan.recipe, cases)
assert all(abs(c.outputs["last_hidden_state"]).sum() > 0 for c in cases)
print("scipy imported after a forward:", "scipy.optimize" in sys.modules)
"""


def test_the_export_process_imports_model_code_without_scipy() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    if importlib.metadata.version("transformers") != TRANSFORMERS_WITHOUT_SCIPY:
        pytest.skip("another transformers version imports model code as usual")
    assert "scipy imported: False" in proc.stdout
    assert "scipy imported after a forward: False" in proc.stdout

"""``--sample-inputs FILE`` leaves a trace (issue 46): the import stage's line in the
terminal, its metrics in report.json, report.html and a comment in recipe.yaml; and a
one-element input whose real value is only in that file (silero-vad's ``sr`` = 16000) takes
it from there instead of being refused for want of ``--input sr=16000``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import trtpack


def test_sample_inputs_are_traced_and_give_the_sample_rate(tmp_path: Path) -> None:
    silero_vad = pytest.importorskip("silero_vad")
    model = Path(silero_vad.__file__).parent / "data" / "silero_vad.onnx"
    rng = np.random.default_rng(0)
    samples = tmp_path / "speech.npz"
    np.savez(samples, input=rng.uniform(-0.5, 0.5, (6, 576)).astype(np.float32),
             state=np.zeros((2, 6, 128), np.float32), sr=np.array(16000, np.int64))
    out = tmp_path / "out"
    done = trtpack("build", str(model), "--target", "cpu", "--sample-inputs", str(samples),
                   "--input", "input=float32[batch,576]", "--input",
                   "state=float32[2,batch,128]", "--profile", "1:2:4", "--out", str(out),
                   "--cache-dir", str(tmp_path / "cache"), env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    trace = "samples from speech.npz at 3/3 corners"
    assert trace in done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    imported = next(s for s in report["stages"] if s["name"] == "import")
    assert imported["metrics"]["sample_inputs"] == trace
    assert trace in (out / "report.html").read_text()
    recipe = (out / "recipe.yaml").read_text()
    assert f"--sample-inputs {samples}" in recipe
    assert "value: 16000" in recipe  # sr's value, from the file
    assert all(r["passed"] for r in report["verification"])

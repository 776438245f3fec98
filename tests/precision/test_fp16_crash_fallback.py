"""FP16 when ModelOpt AutoCast's process dies by a signal (issue 46): a GRU with a
hidden-state input exported at opset 9 (as a torch 1.9 export was; ONNX Runtime segfaults on
its FP16 form) builds with onnxconverter-common's FP16 instead, exit 0. The AutoCast process
is killed on demand (``TRTPACK_TEST_KILL_AUTOCAST=1``) so the test does not depend on where
today's ModelOpt and ONNX Runtime crash; the fallback's own check survives ONNX Runtime's
crash on its FP16 graph (run in a forked copy) and keeps the nodes it crashes on in FP32."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.conftest import trtpack
from trtpack.precision.modelopt_worker import KILL_AUTOCAST_VARIABLE


def gru_opset9(path: Path) -> None:
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(8, 16, batch_first=True)
            self.out = torch.nn.Linear(16, 3)

        def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y, hn = self.gru(x, h)
            return self.out(y), hn

    torch.manual_seed(0)
    torch.onnx.export(Tagger().eval(), (torch.randn(1, 10, 8), torch.zeros(1, 1, 16)),
                      str(path), dynamo=False, opset_version=9, input_names=["x", "h"],
                      output_names=["y", "hn"],
                      dynamic_axes={"x": {0: "batch", 1: "time"}, "h": {1: "batch"},
                                    "y": {0: "batch", 1: "time"}, "hn": {1: "batch"}})


@pytest.mark.parametrize("killed", [True, False], ids=["autocast-killed", "as-is"])
def test_fp16_falls_back_when_autocast_dies(tmp_path: Path, killed: bool) -> None:
    model = tmp_path / "gru.onnx"
    gru_opset9(model)
    assert onnx.load(str(model)).opset_import[0].version == 9
    out = tmp_path / "out"
    env = {"TRTPACK_NO_COMPILE_CHECK": "1", **({KILL_AUTOCAST_VARIABLE: "1"} if killed else {})}
    done = trtpack("build", str(model), "--target", "g5", "--no-engine", "--precision",
                   "fp16", "--profile", "1x4:2x10:4x16", "--out", str(out), "--cache-dir",
                   str(tmp_path / "cache"), env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    precision = next(s for s in report["stages"] if s["name"] == "precision")["metrics"]
    assert precision["converter"] == "onnxconverter-common float16"
    if killed:
        assert "killed by signal 11" in precision["autocast_failure"]
    served = onnx.load(str(next((out / "model_repository").glob("*/1/model.onnx"))))
    fp16 = [t.name for t in served.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert fp16, "the fallback's graph holds FP16 weights"
    assert {i.type.tensor_type.elem_type for i in served.graph.input} == {
        onnx.TensorProto.FLOAT}  # FP32 at its inputs (keep_io_types)
    rows = [r for r in report["verification"] if r["check"] == "fp16-vs-fp32"]
    assert rows and all(r["passed"] for r in rows)

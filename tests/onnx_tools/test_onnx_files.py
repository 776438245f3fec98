"""The one weight layout (``model.onnx`` + ``model.onnx.data``) written by ``save_model``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtpack.onnx_tools.files import data_path, save_model


def _matmul_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    weight = rng.standard_normal((256, 256)).astype(np.float32)  # 256 KiB: a sidecar tensor
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight


def test_save_model_ignores_a_sidecar_named_alike_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx's own external-data writer refuses when ``model.onnx.data`` exists relative to the
    working directory, whatever folder the model goes to: a build run where the user keeps
    an ONNX model of that name failed (``trtpack build model.onnx`` in the README)."""
    rng = np.random.default_rng(0)
    model, weight = _matmul_model(rng)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx.data").write_text("the user's own file")
    target = tmp_path / "out" / "model.onnx"
    target.parent.mkdir()
    save_model(model, target)
    assert (tmp_path / "model.onnx.data").read_text() == "the user's own file"
    assert data_path(target).stat().st_size == weight.nbytes
    assert os.path.getsize(target) < 4096  # the weight went to the sidecar
    x = rng.standard_normal((1, 256)).astype(np.float32)
    (got,) = ort.InferenceSession(str(target)).run(None, {"x": x})
    np.testing.assert_allclose(got, x @ weight, rtol=1e-5, atol=1e-5)

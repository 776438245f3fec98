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


def test_save_model_streams_weights_left_on_disk_into_the_same_files(tmp_path: Path) -> None:
    """A model loaded without its weights (the CPU model's fusions run so) and saved with
    ``weights_dir`` writes the same bytes as the model with its weights loaded: tensors
    are copied from the old sidecar one at a time; a small one goes inline, a pruned one is
    not copied; a Constant's external tensor comes back inline."""
    rng = np.random.default_rng(1)
    model, weight = _matmul_model(rng)
    small = rng.standard_normal((8,)).astype(np.float32)
    pruned = rng.standard_normal((128, 256)).astype(np.float32)
    const = rng.standard_normal((256,)).astype(np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(pruned, "unused"),
                                    numpy_helper.from_array(small, "b")])
    model.graph.node.extend([
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(const, "c")),
        helper.make_node("Add", ["y", "c"], ["z"])])
    model.graph.output[0].name = "z"
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    onnx.save_model(model, str(source), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data",
                    size_threshold=0, convert_attribute=True)  # even b and c external

    def edit(m: onnx.ModelProto) -> None:
        del m.graph.initializer[1]  # "unused"

    loaded = onnx.load(str(source))
    edit(loaded)
    (tmp_path / "loaded").mkdir()
    save_model(loaded, tmp_path / "loaded" / "model.onnx")
    lazy = onnx.load(str(source), load_external_data=False)
    edit(lazy)
    streamed = tmp_path / "streamed" / "model.onnx"
    streamed.parent.mkdir()
    save_model(lazy, streamed, weights_dir=source.parent)
    for name in ("model.onnx", "model.onnx.data"):
        assert (streamed.parent / name).read_bytes() == (tmp_path / "loaded" / name).read_bytes()
    assert data_path(streamed).stat().st_size == weight.nbytes  # only the kept weight
    x = rng.standard_normal((1, 256)).astype(np.float32)
    (got,) = ort.InferenceSession(str(streamed)).run(None, {"x": x})
    np.testing.assert_allclose(got, x @ weight + const, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="no folder"):
        save_model(onnx.load(str(source), load_external_data=False), tmp_path / "x.onnx")


def test_the_same_model_is_written_as_the_same_bytes_whatever_its_value_info_order(
        tmp_path: Path) -> None:
    """Tools fill ``value_info`` in an order that changes from process to process; the
    file written is the same (two machines sharing a cache serve the same bytes)."""
    def model(order: list[str]) -> onnx.ModelProto:
        nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                 helper.make_node("Abs", ["b"], ["y"])]
        infos = {n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "ab"}
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            value_info=[infos[n] for n in order])
        return helper.make_model(graph)

    save_model(model(["a", "b"]), tmp_path / "one.onnx")
    save_model(model(["b", "a"]), tmp_path / "two.onnx")
    assert (tmp_path / "one.onnx").read_bytes() == (tmp_path / "two.onnx").read_bytes()

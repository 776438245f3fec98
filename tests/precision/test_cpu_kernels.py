"""SkipLayerNormalization written back as Sum + LayerNormalization
(``trtpack.precision.cpu.kernels``): the same outputs, and ONNX Runtime does not fuse it back
when it loads the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tests.precision_fixtures import transformer_graph
from trtpack.precision.cpu.kernels import split_skip_layer_norms

HIDDEN = 32


def _model(bias: bool = True, opset: int = 18, read_mean: bool = False) -> onnx.ModelProto:
    """x -> SkipLayerNormalization(x, skip) -> MatMul -> SkipLayerNormalization(·, first's
    output): two post-LN residual blocks, as BERT's fused graph has them."""
    rng = np.random.default_rng(7)

    def array(name: str, shape: tuple[int, ...], scale: float = 0.5) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    inits = [array(n, (HIDDEN,)) for n in ("g1", "b1", "bias1", "g2", "b2", "bias2")]
    inits.append(array("w", (HIDDEN, HIDDEN), 0.2))
    first_inputs = ["x", "skip", "g1", "b1", *(["bias1"] if bias else [])]
    first_outputs = ["ln1", *(["mean1"] if read_mean else [])]
    nodes = [
        helper.make_node("SkipLayerNormalization", first_inputs, first_outputs, name="sln1",
                         domain="com.microsoft", epsilon=1e-12),
        helper.make_node("MatMul", ["ln1", "w"], ["h"], name="mm"),
        helper.make_node("SkipLayerNormalization", ["h", "ln1", "g2", "b2",
                                                    *(["bias2"] if bias else [])],
                         ["y"], name="sln2", domain="com.microsoft", epsilon=1e-12),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if read_mean:
        outputs.append(helper.make_tensor_value_info("mean1", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "blocks",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", HIDDEN])
         for n in ("x", "skip")], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
         optimized: Path | None = None) -> np.ndarray:
    options = ort.SessionOptions()
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], feeds)[0])


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq)
    return {"x": rng.normal(0, 2, (batch, seq, HIDDEN)).astype(np.float32),
            "skip": rng.normal(0, 2, (batch, seq, HIDDEN)).astype(np.float32)}


def test_split_skip_layer_norms_give_the_same_outputs(tmp_path: Path) -> None:
    for bias in (True, False):
        fused = _model(bias=bias)
        split = _model(bias=bias)
        assert split_skip_layer_norms(split) == 2
        ops = [n.op_type for n in split.graph.node]
        assert "SkipLayerNormalization" not in ops
        assert ops.count("Sum") == 2 and ops.count("LayerNormalization") == 2
        assert ops.count("Add") == (2 if bias else 0)
        for batch, seq in ((1, 3), (4, 17)):
            feeds = _feeds(batch, seq)
            np.testing.assert_allclose(_run(split, feeds), _run(fused, feeds), atol=1e-5)


def test_onnx_runtime_does_not_fuse_the_split_form_back(tmp_path: Path) -> None:
    """The point of the split: at load, ONNX Runtime (all optimizations on) fuses an Add
    that feeds a LayerNormalization into SkipLayerNormalization, but not a Sum."""
    split = _model()
    split_skip_layer_norms(split)
    optimized = tmp_path / "runtime.onnx"
    _run(split, _feeds(2, 5), optimized)
    ops = {n.op_type for n in onnx.load(str(optimized)).graph.node}
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    # the control: the same graph with Add for the residual is fused back
    for node in split.graph.node:
        if node.op_type == "Sum":
            node.op_type = "Add"
    _run(split, _feeds(2, 5), optimized)
    assert "SkipLayerNormalization" in {n.op_type for n in onnx.load(str(optimized)).graph.node}


def test_a_read_mean_output_or_an_old_opset_keeps_the_fused_node() -> None:
    reads_mean = _model(read_mean=True)
    assert split_skip_layer_norms(reads_mean) == 1  # only the second node
    assert [n.name for n in reads_mean.graph.node if n.op_type == "SkipLayerNormalization"] \
        == ["sln1"]
    old = _model(opset=16)
    assert split_skip_layer_norms(old) == 0
    assert sum(n.op_type == "SkipLayerNormalization" for n in old.graph.node) == 2


def _gelu_block() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (HIDDEN, 4 * HIDDEN)).astype(np.float32),
                                     "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, 4 * HIDDEN).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="up"),
             helper.make_node("BiasGelu", ["h", "b"], ["y"], name="gelu", domain="com.microsoft")]
    return transformer_graph(nodes, inits, {"x": HIDDEN})


def test_bias_gelu_split_lets_the_int8_matmul_take_the_bias(tmp_path: Path) -> None:
    """BiasGelu -> Add + Gelu is the same function; once the MatMul is quantized, ONNX
    Runtime folds the Add into DynamicQuantizeMatMul and runs Gelu alone."""
    from trtpack.onnx_tools.files import save_model
    from trtpack.precision.cpu.int8 import quantize_cpu_graph
    from trtpack.precision.cpu.kernels import split_bias_gelus

    fused, split = _gelu_block(), _gelu_block()
    assert split_bias_gelus(split) == 1
    assert [n.op_type for n in split.graph.node] == ["MatMul", "Add", "Gelu"]
    feeds = {"x": _feeds(3, 7)["x"]}
    reference = _run(fused, feeds)
    np.testing.assert_allclose(_run(split, feeds), reference, atol=1e-5)
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    save_model(split, fp32)
    quantize_cpu_graph(fp32, int8, [])
    optimized = tmp_path / "runtime.onnx"
    got = _run(onnx.load(str(int8)), feeds, optimized)
    ops = [n.op_type for n in onnx.load(str(optimized)).graph.node]
    assert "DynamicQuantizeMatMul" in ops and "Gelu" in ops
    assert "Add" not in ops and "BiasGelu" not in ops
    assert np.abs(got - reference).max() < 0.05 * np.abs(reference).max()

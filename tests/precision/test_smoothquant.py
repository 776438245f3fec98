"""SmoothQuant activation smoothing (trtpack.precision.smoothquant): the smoothed FP32 model is the
same function, and the activation channels ModelOpt quantizes get evened out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from trtpack.precision.smoothquant import smooth_model, smoothing_scales, smoothing_targets

HIDDEN, FFN = 16, 32


def _block() -> onnx.ModelProto:
    """LayerNorm -> (Q, K) MatMuls and a residual Add; FFN: MatMul -> Gelu -> MatMul.
    One LayerNorm channel is an outlier (scale 40), as in BERT."""
    rng = np.random.default_rng(3)
    gamma = np.ones(HIDDEN, np.float32)
    gamma[5] = 40.0
    inits = [
        numpy_helper.from_array(gamma, "gamma"),
        numpy_helper.from_array(rng.normal(0, 0.1, HIDDEN).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.normal(0, 0.2, (HIDDEN, HIDDEN)).astype(np.float32), "wq"),
        numpy_helper.from_array(rng.normal(0, 0.2, (HIDDEN, HIDDEN)).astype(np.float32), "wk"),
        numpy_helper.from_array(rng.normal(0, 0.2, (HIDDEN, FFN)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.2, (FFN, HIDDEN)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1,
                         name="ln"),
        helper.make_node("MatMul", ["ln", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["ln", "wk"], ["k"], name="k"),
        helper.make_node("Add", ["q", "k"], ["qk"], name="qk"),
        helper.make_node("Add", ["qk", "ln"], ["res"], name="residual"),
        helper.make_node("MatMul", ["res", "w1"], ["h"], name="ffn_in"),
        helper.make_node("Gelu", ["h"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("MatMul", ["g", "w2"], ["y"], name="ffn_out"),
    ]
    graph = helper.make_graph(
        nodes, "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", HIDDEN])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray], *names: str
         ) -> list[np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name in names:
        if name not in {o.name for o in m.graph.output}:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(list(names) or None, feed)]


def _feeds(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (2, 7, HIDDEN)).astype(np.float32)} for _ in range(n)]


def test_smoothed_model_equals_the_original_in_fp32() -> None:
    original = _block()
    smoothed = _block()
    done = smooth_model(smoothed, _feeds(0, 3), alpha=0.5)
    # LayerNorm output (Q and K share one Mul), the residual sum, the Gelu output
    assert sorted(done) == ["g", "ln", "res"]
    muls = [n for n in smoothed.graph.node if n.op_type == "Mul"]
    assert len(muls) == 3
    assert [n.input[0] for n in smoothed.graph.node if n.name in ("q", "k")] == \
        ["trtpack_smooth/ln", "trtpack_smooth/ln"]
    # the residual Add still reads the unsmoothed LayerNorm output
    assert next(n for n in smoothed.graph.node if n.name == "residual").input[1] == "ln"
    onnx.checker.check_model(smoothed)
    for feed in _feeds(1, 3):  # inputs the scales were not computed on
        (a,), (b,) = _run(original, feed), _run(smoothed, feed)
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, float(np.abs(a).max())), \
            np.abs(a - b).max()


def test_smoothing_evens_out_the_outlier_channel() -> None:
    model = _block()
    feed = _feeds(0, 1)[0]
    (before,) = _run(model, feed, "ln")
    smooth_model(model, _feeds(0, 3), alpha=0.5)
    (after,) = _run(model, feed, "trtpack_smooth/ln")

    def spread(x: np.ndarray) -> float:  # largest channel max over the median channel max
        m = np.abs(x).reshape(-1, HIDDEN).max(axis=0)
        return float(m.max() / np.median(m))

    assert spread(before) > 10
    assert spread(after) < spread(before) / 3


def test_producer_filter_and_scales() -> None:
    model = _block()
    assert [t.tensor for t in smoothing_targets(model, ["LayerNormalization"])] == ["ln"]
    assert smooth_model(model, _feeds(0, 2), 0.5, ["LayerNormalization"]) == ["ln"]
    # s_j = max|X_j|^a / max|W_j|^(1-a) over every weight reading X; dead channels keep 1
    w = [np.array([[2.0, -4.0], [1.0, 0.0], [0.0, 0.0]], np.float32),
         np.array([[8.0, 0.0], [0.5, 0.5], [0.0, 0.0]], np.float32)]
    s = smoothing_scales(np.array([4.0, 9.0, 3.0], np.float32), w, 0.5)
    np.testing.assert_allclose(s, [4.0 ** 0.5 / 8.0 ** 0.5, 9.0 ** 0.5 / 1.0, 1.0], rtol=1e-6)


def test_int8_stage_quantizes_the_smoothed_model(tiny_build: Path, tmp_path: Path) -> None:
    """precision_options.int8.smoothquant: ModelOpt quantizes the smoothed copy (each
    smoothed activation's Mul feeds quantized MatMuls), judged against the original FP32."""
    from tests.precision_fixtures import (
        build_options,
        fp32_artifacts,
        run_stage,
        tiny_npz,
        with_recipe,
    )
    from trtpack.precision.graph import int8_quantized_nodes

    plan = build_options("tiny-bert", "int8", tmp_path / "out", ["1x4:2x8:4x16"],
                            calibration=tiny_npz(tmp_path / "calibration.npz"))
    settings = plan.recipe.precision_options.model_dump()
    settings["int8"]["smoothquant"] = 0.5
    plan = with_recipe(plan, precision_options=settings)
    outcome, messages, _ = run_stage(plan, fp32_artifacts(tiny_build), tmp_path / "stage")
    smoothed = outcome.metrics["calibration"]["smoothquant"]
    assert smoothed["alpha"] == 0.5 and smoothed["activations"] > 0
    assert any("SmoothQuant" in m for m in messages)
    model = onnx.load(str(outcome.artifacts["precision_onnx"]))
    muls = {n.output[0] for n in model.graph.node
            if n.op_type == "Mul" and n.name.startswith("trtpack_smooth/")}
    assert len(muls) == smoothed["activations"]
    quantizing = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert muls & quantizing  # the smoothed activations are what gets quantized
    assert int8_quantized_nodes(model)
    assert all(r.passed for r in outcome.verification)

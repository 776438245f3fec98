"""Feed-forward outlier channels moved to an FP32 branch
(``trtpack.precision.cpu.outlier_channels``): the FP32 function is unchanged, the channels are
the ones that stand out, and the INT8 form is more accurate for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tests.precision_fixtures import transformer_graph
from trtpack.precision.cpu.outlier_channels import (
    outlier_channels,
    split_outlier_channels,
)

HIDDEN, FFN, OUTLIER = 32, 128, 77


def _block(residual_sum: bool) -> onnx.ModelProto:
    """LayerNorm -> MatMul(w1) -> BiasGelu -> MatMul(w2) -> Add(bias) -> Sum(residual) ->
    LayerNorm (``residual_sum`` False: the second MatMul's output is the graph's). Channel
    ``OUTLIER`` of the GELU output is huge on the first token only, like BERT's [CLS]."""
    rng = np.random.default_rng(11)
    w1 = rng.normal(0, 0.3, (HIDDEN, FFN)).astype(np.float32)
    b1 = rng.normal(0, 0.1, FFN).astype(np.float32)
    w1[0, OUTLIER] = 30.0  # input channel 0 is large only on the first token (see _feeds)
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (w1, "w1"), (b1, "b1"), (rng.normal(0, 0.2, (FFN, HIDDEN)).astype(np.float32), "w2"))]
    if residual_sum:
        inits += [numpy_helper.from_array(a, n) for a, n in (
            (rng.normal(0, 0.1, HIDDEN).astype(np.float32), "b2"),
            (np.ones(HIDDEN, np.float32), "gamma"), (np.zeros(HIDDEN, np.float32), "beta"))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["up"], name="ffn_in"),
        helper.make_node("BiasGelu", ["up", "b1"], ["gelu"], name="gelu",
                         domain="com.microsoft"),
        helper.make_node("MatMul", ["gelu", "w2"], ["down"], name="ffn_out")]
    if residual_sum:
        nodes += [helper.make_node("Add", ["down", "b2"], ["biased"], name="bias"),
                  helper.make_node("Sum", ["biased", "x"], ["total"], name="residual"),
                  helper.make_node("LayerNormalization", ["total", "gamma", "beta"], ["y"],
                                   name="ln", axis=-1)]
    else:
        nodes.append(helper.make_node("Identity", ["down"], ["y"], name="out"))
    return transformer_graph(nodes, inits, {"x": HIDDEN})


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).normal(0, 1, (batch, seq, HIDDEN)).astype(np.float32)
    x[:, 0, 0] = 1.5  # the first token's channel 0 drives GELU channel OUTLIER to ~45
    x[:, 1:, 0] = np.clip(x[:, 1:, 0], -0.1, 0.1)
    return {"x": x}


def _run(path_or_model: Path | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    source = (path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto)
              else str(path_or_model))
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], feeds)[0])


CALIBRATION = [_feeds(2, 6, seed) for seed in range(4)]


def test_the_channels_that_stand_out_are_chosen() -> None:
    maxima = np.random.default_rng(0).uniform(0.5, 3.0, 1536)
    assert outlier_channels(maxima) == []  # nothing stands out: no branch
    maxima[[856, 12]] = [24.0, 11.0]
    assert outlier_channels(maxima) == [12, 856]
    maxima[:20] = 30.0  # more than 8 large channels: none stands out above the 9th
    assert outlier_channels(maxima) == []


@pytest.mark.parametrize("residual_sum", [True, False])
def test_the_split_block_is_the_same_function(residual_sum: bool) -> None:
    model = _block(residual_sum)
    before = [_run(model, _feeds(b, s, 9)) for b, s in ((1, 3), (3, 11))]
    splits = split_outlier_channels(model, CALIBRATION)
    assert [(s.matmul, s.channels) for s in splits] == [("ffn_out", [OUTLIER])]
    ops = [n.op_type for n in model.graph.node]
    # one channel: the branch's second product is a broadcast Mul; with a residual Sum the
    # branch is one more term of it, otherwise an Add
    assert ops.count("MatMul") == 3 and "Mul" in ops
    assert ops.count("Add") == 1  # the bias Add, or the branch's Add
    if residual_sum:
        residual = next(n for n in model.graph.node if n.op_type == "Sum")
        assert len(residual.input) == 3
    weights = {i.name: i.dims for i in model.graph.initializer}
    assert list(weights["w1"]) == [HIDDEN, FFN - 1] and list(weights["w2"]) == [FFN - 1, HIDDEN]
    for (b, s), expected in zip(((1, 3), (3, 11)), before, strict=True):
        np.testing.assert_allclose(_run(model, _feeds(b, s, 9)), expected, atol=1e-4)


def test_the_int8_form_of_the_split_block_is_more_accurate(tmp_path: Path) -> None:
    """ONNX Runtime's dynamic INT8 of the block, with and without the split, against FP32
    on unseen inputs: the outlier no longer coarsens every other channel's step."""
    from trtpack.onnx_tools.files import save_model
    from trtpack.precision.cpu.int8 import quantize_cpu_graph

    errors = {}
    for split in (False, True):
        model = _block(residual_sum=False)
        excluded = []
        if split:
            excluded = [n for s in split_outlier_channels(model, CALIBRATION)
                        for n in s.fp32_nodes]
        fp32, int8 = tmp_path / f"fp32-{split}.onnx", tmp_path / f"int8-{split}.onnx"
        save_model(model, fp32)
        quantize_cpu_graph(fp32, int8, excluded)
        feeds = _feeds(2, 9, 99)
        reference, got = _run(fp32, feeds), _run(int8, feeds)
        # the tokens after the first: the ones whose precision the outlier ruins
        errors[split] = float(np.abs(got[:, 1:] - reference[:, 1:]).max())
    assert errors[True] < errors[False] / 2, errors  # measured: 0.13 vs 0.42

"""``mse`` INT8 calibration (``trtpack.precision.int8.activation_ranges``): the range of
least squared quantization error over a histogram of |x|, NVIDIA's histogram calibrator's
method, judged here on the data itself, not on the histogram."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtpack.precision.int8.activation_ranges import (
    HISTOGRAM_BINS,
    ActivationHistogram,
    mse_ranges,
    quantization_error,
)
from trtpack.precision.int8.placement import Calibration


def _histogram(*batches: np.ndarray) -> ActivationHistogram:
    histogram = ActivationHistogram()
    for batch in batches:
        histogram.add(batch)
    return histogram


def test_gaussian_with_outliers_clips_below_max_with_less_error() -> None:
    """A Gaussian tensor with a few large values (as BERT's LayerNorm outputs): the chosen
    range is well below the largest value and its squared error on the data itself is
    lower than ``max``'s, by far."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(400_000).astype(np.float32)
    x[rng.choice(x.size, 40, replace=False)] *= 10.0
    absmax = float(np.abs(x).max())
    amax = _histogram(*np.array_split(x, 5)).mse_amax()
    assert amax < 0.7 * absmax  # 0.57 x
    assert quantization_error(x, amax) < 0.6 * quantization_error(x, absmax)  # 0.51 x
    # and it is (near) the best of a fine sweep on the data: the histogram's bins cost little
    sweep = np.linspace(0.05 * absmax, absmax, 400)
    best = min(quantization_error(x, a) for a in sweep)
    assert quantization_error(x, amax) <= 1.02 * best


def test_uniform_data_keeps_max() -> None:
    """Where no value is rare (uniform), clipping only costs: the range stays at the max
    (within a bin's rounding) and its error is no more than ``max``'s."""
    x = np.random.default_rng(4).uniform(-2.0, 2.0, 300_000).astype(np.float32)
    absmax = float(np.abs(x).max())
    amax = _histogram(x[:100_000], x[100_000:]).mse_amax()
    assert amax >= 0.99 * absmax
    assert quantization_error(x, amax) <= 1.001 * quantization_error(x, absmax)


def test_later_batch_beyond_the_range_grows_bins_of_the_same_width() -> None:
    """A later batch with larger values adds bins (NVIDIA's ``collect``); every value is
    counted once, zeros and all; an all-zero tensor keeps range 0."""
    first = np.linspace(-1.0, 1.0, 1001, dtype=np.float32)
    later = np.array([3.0, -2.5, 0.0], dtype=np.float32)
    histogram = _histogram(first, later)
    assert histogram.width == pytest.approx(1.0 / HISTOGRAM_BINS)
    assert len(histogram.counts) == int(np.ceil(3.0 / histogram.width))
    assert histogram.counts.sum() == first.size + later.size
    assert histogram.absmax == 3.0
    assert histogram.counts[-1] >= 1 and histogram.counts[int(2.5 / histogram.width)] >= 1
    zeros = _histogram(np.zeros(10, dtype=np.float32))
    assert zeros.mse_amax() == 0.0 and zeros.counts.sum() == 10


def test_histogram_counts_a_batch_without_keeping_it() -> None:
    """One batch at a time: adding a batch holds a few copies of it at most while counting,
    and keeps only the bin counts afterwards (not a concatenation of every batch)."""
    rng = np.random.default_rng(5)
    batch = rng.standard_normal(1_000_000).astype(np.float32)
    histogram = ActivationHistogram()
    histogram.add(batch)
    tracemalloc.start()
    try:
        for k in range(4):
            histogram.add(batch * (1.0 + 0.1 * k))
        _, peak = tracemalloc.get_traced_memory()
        held = histogram.counts.nbytes
    finally:
        tracemalloc.stop()
    assert peak < 5 * batch.nbytes  # the scaled batch, its |x| and one integer copy
    assert held < 4 * HISTOGRAM_BINS * 8  # counts only: 1.4 x the first range here


def _matmul_model() -> onnx.ModelProto:
    """x [n, 16] -> MatMul -> y -> Relu -> z."""
    w = np.random.default_rng(6).standard_normal((16, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 16])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_mse_ranges_streams_feeds_one_at_a_time() -> None:
    """``mse_ranges`` takes feeds from an iterator, one at a time (a generator that would
    fail if a second feed were asked for before the first was counted cannot tell), and
    gives each tensor the histogram's range over all of them."""
    rng = np.random.default_rng(7)
    feeds = [{"x": rng.standard_normal((2048, 16)).astype(np.float32)} for _ in range(3)]
    feeds[1]["x"][:8, 0] = 12.0  # a few large values in one batch only: later bins
    asked: list[int] = []

    def lazily() -> Iterator[dict[str, np.ndarray]]:
        for k, feed in enumerate(feeds):
            asked.append(k)
            yield feed

    ranges = mse_ranges(_matmul_model(), ["x", "y"], lazily())
    assert asked == [0, 1, 2]
    xs = np.concatenate([f["x"] for f in feeds])
    assert ranges["x"] == pytest.approx(_histogram(*[f["x"] for f in feeds]).mse_amax())
    assert quantization_error(xs, ranges["x"]) <= quantization_error(xs, np.abs(xs).max())
    assert set(ranges) == {"x", "y"} and ranges["y"] > 0


def test_calibration_ranges_by_method() -> None:
    """``max`` gives each absmax; ``mse`` the histogram's range where there is one (a
    tensor whose range is fixed by rule has none and keeps its absmax)."""
    x = np.random.default_rng(8).standard_normal(50_000).astype(np.float32)
    x[:5] *= 30.0
    calibration = Calibration(absmax={"a": float(np.abs(x).max()), "softmax": 0.3})
    calibration.histograms = {"a": _histogram(x)}
    assert calibration.ranges("max") == calibration.absmax
    mse = calibration.ranges("mse")
    assert mse["softmax"] == 0.3 and mse["a"] == calibration.histograms["a"].mse_amax()
    assert mse["a"] < calibration.absmax["a"]


def test_mse_ranges_of_a_modelopt_model_leave_softmax_fixed() -> None:
    """``apply_mse_ranges`` (a ModelOpt max model rescaled): each measured activation's
    Q/DQ pair gets its ``mse_ranges`` range / 127; a Softmax output keeps ModelOpt's fixed
    [0, 1] (scale 1/127) whatever its measured values are."""
    from trtpack.precision.int8.activation_ranges import apply_mse_ranges

    rng = np.random.default_rng(9)
    w = rng.standard_normal((16, 16)).astype(np.float32)

    def qdq(tensor: str, scale: float) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [tensor, f"{tensor}_scale", "zp"],
                                 [f"{tensor}_q"]),
                helper.make_node("DequantizeLinear", [f"{tensor}_q", f"{tensor}_scale", "zp"],
                                 [f"{tensor}_dq"])]

    def model(quantized: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1)]
        inits = [numpy_helper.from_array(w, "w")]
        if quantized:
            nodes += [*qdq("x", 0.5), *qdq("p", 1 / 127),
                      helper.make_node("MatMul", ["x_dq", "w"], ["y"]),
                      helper.make_node("MatMul", ["p_dq", "w"], ["z"])]
            inits += [numpy_helper.from_array(np.asarray(0.5, np.float32), "x_scale"),
                      numpy_helper.from_array(np.asarray(1 / 127, np.float32), "p_scale"),
                      numpy_helper.from_array(np.asarray(0, np.int8), "zp")]
        else:
            nodes += [helper.make_node("MatMul", ["x", "w"], ["y"]),
                      helper.make_node("MatMul", ["p", "w"], ["z"])]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["n", 16]) for o in "yz"],
            inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])

    feeds = [{"x": rng.standard_normal((512, 16)).astype(np.float32)} for _ in range(2)]
    feeds[0]["x"][:3, 0] = 9.0
    quantized, fp32 = model(True), model(False)
    assert apply_mse_ranges(quantized, fp32, feeds) == 1
    scales = {i.name: float(numpy_helper.to_array(i)) for i in quantized.graph.initializer
              if i.name.endswith("_scale")}
    assert scales["p_scale"] == pytest.approx(1 / 127)
    expected = mse_ranges(fp32, ["x"], feeds)["x"] / 127
    assert scales["x_scale"] == pytest.approx(expected) and expected != pytest.approx(0.5)

"""ONNX Runtime's static INT8 of a convolutional model (``trtpack.precision.cpu.static_int8``):
its activation ranges come from every calibration batch.

onnxruntime 1.32's MinMax calibrator drops each full group of ``CalibMaxIntermediateOutputs``
batches without folding it into its ranges (microsoft/onnxruntime#18893): with that option set
the ranges came from the last (count mod N) batches alone, or from none ("No data is
collected." for an even count of batches at N = 2). These checks read the input's
QuantizeLinear scale: u8, asymmetric, (max - min) / 255 over all batches, wherever the
widest batch stands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtpack.testing.models import conv_onnx


def _input_scale(path: Path) -> float:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node
                if n.op_type == "QuantizeLinear" and n.input[0] == "image")
    return float(inits[node.input[1]])


@pytest.mark.parametrize(("batches", "widest"), [(4, 0), (3, 0), (3, 1), (5, 4)])
def test_every_calibration_batch_sets_the_ranges(tmp_path: Path, batches: int,
                                                 widest: int) -> None:
    from trtpack.precision.cpu.static_int8 import quantize_static_int8

    source = conv_onnx(tmp_path / "conv.onnx", channels=(8, 16))
    rng = np.random.default_rng(0)
    feeds = []
    for k in range(batches):
        x = rng.uniform(-1.0, 1.0, (2, 3, 16, 16)).astype(np.float32)
        x[0, 0, 0, 0], x[0, 0, 0, 1] = -1.0, 1.0  # every batch spans [-1, 1] at least
        feeds.append({"image": x * (8.0 if k == widest else 1.0)})
    out = tmp_path / "int8.onnx"
    quantize_static_int8(source, tmp_path / "work", out, feeds, "max")
    assert _input_scale(out) == pytest.approx(16.0 / 255, rel=1e-4)

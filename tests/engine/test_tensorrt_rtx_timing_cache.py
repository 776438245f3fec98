"""What TensorRT-RTX (the NVIDIA builder that runs on these CPU-only machines) does with a
timing cache: nothing. Its bindings say "Timing cache operations are no-ops in TensorRT-RTX"
(deprecated since 1.2), and a build leaves the cache as it was (a header, no tactics). So
sharing and combining timing caches across a fleet (issue 48, item 3) cannot be tested
through it here; this test fails the day a TensorRT-RTX build writes tactics into one, which
is when that test becomes possible (docs/fleet.md, TensorRT timing caches)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest


def test_a_tensorrt_rtx_cpu_build_writes_no_timing_cache(tmp_path: Path) -> None:
    trt = pytest.importorskip("tensorrt_rtx")
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((16, 16), dtype=np.float32), name="w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [weights])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
        empty = bytes(memoryview(cache.serialize()))
        assert builder.build_serialized_network(network, config) is not None
        after = bytes(memoryview(cache.serialize()))
    assert after == empty  # no tactic was recorded
    assert any("no-ops" in str(w.message) for w in said)

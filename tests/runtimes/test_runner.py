"""The runner interface (``trtpack.runtimes.runner.ModelRunner``): ONNX Runtime's runner run
for real on a small model; the TensorRT runner's feed handling with a labelled stand-in for
the engine's I/O (no TensorRT here; engines run in tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtpack.model_io import EngineTensor
from trtpack.runtimes.runner import InactiveRunnerError, ModelRunner


def scale_and_shift(path: Path) -> Path:
    """y = x * w + b, and an int64 passthrough z = ids (two inputs, two outputs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.array([2.0, -1.0, 0.5], np.float32), "w")
    b = numpy_helper.from_array(np.array([0.25, 0.0, 1.0], np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"]),
         helper.make_node("Identity", ["ids"], ["z"])],
        "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
                  helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("z", TensorProto.INT64, ["batch"])],
        initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_onnxruntime_runner_infers_every_output_and_ignores_other_feeds(tmp_path: Path) -> None:
    from trtpack.runtimes.onnxruntime import OnnxRuntimeRunner

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    ids = rng.integers(0, 30000, size=4)
    runner: ModelRunner = OnnxRuntimeRunner(scale_and_shift(tmp_path / "m.onnx"), threads=1)
    with runner:
        assert runner.input_names == ("x", "ids")
        assert runner.output_names == ("y", "z")
        got = runner.infer({"x": x, "ids": ids, "not_an_input": x})
        again = runner.infer_all([{"x": x[:1], "ids": ids[:1]}])
    assert set(got) == {"y", "z"}
    np.testing.assert_allclose(got["y"], x * np.array([2.0, -1.0, 0.5]) + [0.25, 0.0, 1.0],
                               rtol=1e-6)
    np.testing.assert_array_equal(got["z"], ids)
    np.testing.assert_allclose(again[0]["y"], got["y"][:1], rtol=1e-6)
    with pytest.raises(InactiveRunnerError, match="onnxruntime is not active"):
        runner.infer({"x": x, "ids": ids})


def test_onnxruntime_runner_takes_a_model_in_memory(tmp_path: Path) -> None:
    import onnx

    from trtpack.runtimes.onnxruntime import OnnxRuntimeRunner

    model = onnx.load(scale_and_shift(tmp_path / "m.onnx"))
    x = np.ones((2, 3), np.float32)
    with OnnxRuntimeRunner(model, few_runs=True) as runner:
        y = runner.infer({"x": x, "ids": np.arange(2)})["y"]
    np.testing.assert_allclose(y, np.tile([2.25, -1.0, 1.5], (2, 1)), rtol=1e-6)


def test_tensorrt_runner_casts_the_feed_to_the_engine_types(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's I/O list is a stand-in (NOT TensorRT: ``engine_tensors`` replaced, no
    engine exists here); what is tested is the runner's own feed handling and its guard."""
    from trtpack.runtimes import tensorrt as tensorrt_api

    tensors = [EngineTensor("input_ids", "input", "INT32", (-1, -1)),
               EngineTensor("attention_mask", "input", "INT64", (-1, -1)),
               EngineTensor("last_hidden_state", "output", "FLOAT", (-1, -1, 8))]
    monkeypatch.setattr(tensorrt_api, "engine_tensors", lambda engine: tensors)
    runner = tensorrt_api.TensorRTRunner(engine=None, profile=1)
    assert runner.input_names == ("input_ids", "attention_mask")
    assert runner.output_names == ("last_hidden_state",)
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2]  # not contiguous
    feed = runner.feed({"input_ids": ids, "attention_mask": np.ones((2, 2), np.int64),
                        "token_type_ids": np.zeros((2, 2), np.int64)})
    assert list(feed) == ["input_ids", "attention_mask"]
    assert feed["input_ids"].dtype == np.int32 and feed["input_ids"].flags.c_contiguous
    np.testing.assert_array_equal(feed["input_ids"], ids)
    assert feed["attention_mask"].dtype == np.int64
    with pytest.raises(InactiveRunnerError, match="tensorrt is not active"):
        runner.infer({"input_ids": ids, "attention_mask": ids})


def test_few_long_runs_prepack_the_weights_few_short_ones_do_not(tmp_path: Path) -> None:
    """A few runs skip ONNX Runtime's weight pre-packing unless they push many rows through
    each weight (``few_runs_prepacked``: bert-large's design card, not minilm's profile)."""
    from trtpack.runtimes.onnxruntime import PREPACK_FROM_ROWS, cpu_session, few_runs_prepacked

    def tokens(*shapes: tuple[int, int]) -> list[dict[str, np.ndarray]]:
        return [{"input_ids": np.ones(s, np.int64), "attention_mask": np.ones(s, np.int64)}
                for s in shapes]

    assert not few_runs_prepacked(tokens((1, 8), (4, 32), (8, 128)))  # minilm: 1,160 rows
    assert not few_runs_prepacked(tokens((1, 16), (4, 64), (8, 128)))  # 1,296
    assert few_runs_prepacked(tokens((1, 128), (16, 128), (128, 128)))  # 18,560
    assert few_runs_prepacked(tokens((1, PREPACK_FROM_ROWS)))
    assert not few_runs_prepacked(tokens((1, PREPACK_FROM_ROWS - 1)))
    model = scale_and_shift(tmp_path / "m.onnx")

    def disabled(**kwargs: bool) -> bool:
        options = cpu_session(model, **kwargs).get_session_options()
        try:
            return bool(options.get_session_config_entry("session.disable_prepacking") == "1")
        except RuntimeError:  # ONNX Runtime's answer for an entry never set
            return False

    assert disabled(few_runs=True)
    assert not disabled(few_runs=True, prepacked=True)

"""onnxsim and ModelOpt AutoCast run on the graph without its large weights (the workers of
the simplify and precision stages). The results must be what the tools give on the whole
model: checked in ONNX Runtime on a small model built here with weights over the 64 KiB
threshold, a shape subgraph for onnxsim, a weight onnxsim can fold, one beyond FP16's range
and values below FP16's smallest subnormal."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtpack.onnx_tools.simplify_graph import unfoldable_large_initializers

HIDDEN, INNER = 128, 256
ROOT = Path(__file__).resolve().parents[2]


def _model(external: Path | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w_in = rng.normal(0, 0.05, (HIDDEN, INNER)).astype(np.float32)
    w_in[0, :4] = [1e-9, -1e-9, 3e-8, 0.0]  # below FP16's smallest subnormal
    w_out_t = rng.normal(0, 0.05, (HIDDEN, INNER)).astype(np.float32)  # used transposed
    w_big = rng.normal(0, 0.05, (HIDDEN, HIDDEN)).astype(np.float32)
    w_big[3, 5] = 1e5  # beyond FP16: AutoCast keeps its reader in FP32
    inits = [
        numpy_helper.from_array(w_in, "w_in"),
        numpy_helper.from_array(rng.normal(0, 0.1, INNER).astype(np.float32), "b_in"),
        numpy_helper.from_array(w_out_t, "w_out_t"),
        numpy_helper.from_array(w_big, "w_big"),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "ln_scale"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "ln_bias"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1, HIDDEN], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name="up"),
        helper.make_node("Add", ["h", "b_in"], ["hb"], name="up_bias"),
        helper.make_node("Softmax", ["hb"], ["p"], axis=-1, name="softmax"),
        helper.make_node("Transpose", ["w_out_t"], ["w_out"], perm=[1, 0], name="fold_me"),
        helper.make_node("MatMul", ["p", "w_out"], ["d"], name="down"),
        helper.make_node("MatMul", ["x", "w_big"], ["e"], name="big_reader"),
        helper.make_node("Mul", ["e", "ln_scale"], ["e_small"], name="scale"),
        helper.make_node("Add", ["d", "e_small"], ["s"], name="residual"),
        helper.make_node("LayerNormalization", ["s", "ln_scale", "ln_bias"], ["n"], axis=-1,
                         name="norm"),
        # shape arithmetic onnxsim folds away: reshape to (-1, HIDDEN) and back
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Reshape", ["n", "flat"], ["n2"], name="flatten"),
        helper.make_node("Reshape", ["n2", "x_shape"], ["y"], name="unflatten"),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch_dim"], axis=0, name="batch"),
    ]
    graph = helper.make_graph(
        nodes, "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    if external is not None:
        onnx.save_model(model, str(external), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=external.name + ".data",
                        size_threshold=1024)
    return model


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    return y  # type: ignore[no-any-return]


X = np.random.default_rng(3).normal(0, 1, (2, 9, HIDDEN)).astype(np.float32)


def test_only_weights_no_folding_can_reach_are_taken_out() -> None:
    graph = _model().graph
    # w_out_t is read by a Transpose of constants only (foldable); the rest is small
    assert sorted(unfoldable_large_initializers(graph)) == ["w_big", "w_in"]


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_simplify_worker_matches_the_model_and_keeps_weights_outside(external: bool,
                                                                     tmp_path: Path) -> None:
    src_dir, dst_dir = tmp_path / "src", tmp_path / "dst"
    src_dir.mkdir()
    dst_dir.mkdir()
    src = src_dir / "model.onnx"
    if external:
        _model(src)
    else:
        onnx.save_model(_model(), str(src))
    dst = dst_dir / "model.onnx"
    proc = subprocess.run([sys.executable, "-m", "trtpack.onnx_tools.simplify_graph", str(src),
                           str(dst), str(tmp_path / "result.json")],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["weights_outside_onnxsim"] == 2
    assert result["nodes_after"] < result["nodes_before"]  # onnxsim did work on the graph
    model = onnx.load(str(dst), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert "Transpose" not in ops and "Gather" not in ops  # folded / dead code removed
    assert [i.name for i in model.graph.input] == ["x"]
    # the weights (and the folded transpose, a new large constant) are in dst's data file
    external_names = {t.name for t in model.graph.initializer
                      if t.data_location == TensorProto.EXTERNAL}
    assert {"w_in", "w_big"} <= external_names and len(external_names) == 3
    assert sorted(p.name for p in dst_dir.iterdir()) == ["model.onnx", "model.onnx.data"]
    np.testing.assert_allclose(_run(dst, X), _run(src, X), rtol=1e-5, atol=1e-5)


AUTOCAST_BOTH_WAYS = """
import json, sys
from pathlib import Path
import numpy as np, onnx
from modelopt.onnx.autocast import convert_to_mixed_precision
from trtpack.precision import modelopt_worker as w
from trtpack.precision.modelopt_jobs import Fp16Job, ModelOptJob

src, ref, out, tmp = map(Path, sys.argv[1:5])
job = ModelOptJob("fp16", input=str(src), output=str(out), fp16=Fp16Job(
    keep_io_types=True, reference_inputs=str(ref), range_nodes_file=str(tmp / "ranges.json")))
result = w.run_fp16(job, tmp)
# AutoCast on the whole model, told the same I/O range exclusions, no own reference run
whole = convert_to_mixed_precision(
    onnx_path=str(src), low_precision_type="fp16", keep_io_types=True,
    nodes_to_exclude=w.exact(result["out_of_range_nodes"]) or None, data_max=np.inf,
    providers=["cpu"])
onnx.save(whole, str(tmp / "whole.onnx"))
print(json.dumps(result))
"""


def test_autocast_on_the_graph_alone_equals_autocast_on_the_whole_model(tmp_path: Path
                                                                       ) -> None:
    if importlib.util.find_spec("modelopt") is None:  # not imported here: see below
        pytest.skip("the precision stage needs nvidia-modelopt")
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = src_dir / "model.onnx"
    _model(src)
    reference = tmp_path / "reference.npz"
    feed = {"x": (X[:1] * 3).astype(np.float32)}
    np.savez(reference, **feed)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    proc = subprocess.run([sys.executable, "-c", AUTOCAST_BOTH_WAYS, str(src), str(reference),
                           str(out), str(tmp_path)], capture_output=True, text=True,
                          check=False, cwd=ROOT)  # ModelOpt stays out of the test process
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["weights_outside_autocast"] == 3
    mine, whole = onnx.load(str(out)), onnx.load(str(tmp_path / "whole.onnx"))
    inits = {t.name: t for t in mine.graph.initializer}
    # the weight beyond FP16's range stays FP32, and so does the node reading it
    assert inits["w_big"].data_type == TensorProto.FLOAT
    fp16 = [t for t in mine.graph.initializer if t.data_type == TensorProto.FLOAT16]
    assert len(fp16) >= 2
    assert [n.op_type for n in mine.graph.node] == [n.op_type for n in whole.graph.node]
    x = X.astype(np.float32)
    np.testing.assert_array_equal(_run(out, x), _run(tmp_path / "whole.onnx", x))
    # and it is an FP16 model that stays close to the FP32 one
    assert 0 < np.abs(_run(out, x) - _run(src, x)).max() < 0.05


def test_range_rule_matches_every_tensor_taken_out_and_measured(tmp_path: Path) -> None:
    """The I/O range rule's nodes (the graph computes each tensor's largest absolute value)
    equal those found by making every tensor an output and measuring it here, at
    thresholds that split the model's nodes, on inputs with large values."""
    from trtpack.precision.fp16.autocast_weights import out_of_range_nodes

    src = tmp_path / "model.onnx"
    _model(src)
    before = sorted(p.name for p in tmp_path.iterdir())
    feed = {"x": (X[:1] * 40).astype(np.float32)}
    model = onnx.load(str(src), load_external_data=False)
    tensors = [o for n in model.graph.node for o in n.output]
    probe = onnx.load(str(src))
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    absmax = {t: float(np.abs(v).max()) for t, v in zip(tensors, session.run(tensors, feed),
                                                        strict=True)}
    absmax["x"] = float(np.abs(feed["x"]).max())
    assert absmax["x_shape"] == HIDDEN and absmax["e"] > 1e5  # int and beyond-FP16 tensors
    for threshold in (65504.0, 1000.0, 100.0, 1.5, 0.5):
        expected = [n.name for n in model.graph.node if n.op_type != "Constant" and any(
            absmax.get(t, 0.0) > threshold for t in (*n.input, *n.output))]
        assert out_of_range_nodes(src, feed, threshold) == expected
        assert 0 < len(expected) < len(model.graph.node) or threshold == 0.5
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # the probe is gone


AUTOCAST_CLEANUP_BOTH_WAYS = """
import contextlib, json, sys
from types import SimpleNamespace
import onnx
from onnx import TensorProto, helper
from modelopt.onnx.autocast.precisionconverter import PrecisionConverter
from trtpack.precision.fp16.autocast_cleanup import indexed_autocast_cleanup

F16 = TensorProto.FLOAT16
nodes = [
    helper.make_node("Cast", ["x"], ["x16"], to=F16, name="used_cast"),
    helper.make_node("Relu", ["x16"], ["r"], name="relu"),
    helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT, name="to_output"),
    helper.make_node("Cast", ["x"], ["dead16"], to=F16, name="dead_cast"),
    helper.make_node("Cast", ["dead16"], ["dead32"], to=TensorProto.FLOAT, name="dead_after"),
    helper.make_node("Relu", ["r"], ["unread"], name="dead_relu"),
    helper.make_node("Split", ["x"], ["s0", "s1"], axis=0, num_outputs=2, name="half_read"),
    helper.make_node("Identity", ["s1"], ["z"], name="second_output"),
    helper.make_node("Dropout", ["x"], ["d", ""], name="optional_output_unread"),
]
graph = helper.make_graph(
    nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
     helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])])
model = helper.make_model(graph)
removed = {}
for way in ("modelopt", "indexed"):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    patch = indexed_autocast_cleanup() if way == "indexed" else contextlib.nullcontext()
    with patch as on:
        PrecisionConverter._cleanup_no_consumer_nodes(SimpleNamespace(model=copy))
    kept = {m.name for m in copy.graph.node}
    removed[way] = [n.name for n in model.graph.node if n.name not in kept]
    removed[way + "_applied"] = on
print(json.dumps(removed))
"""


def test_indexed_autocast_cleanup_removes_what_modelopts_own_removes() -> None:
    """AutoCast's dead-node cleanup, indexed, removes the same nodes as ModelOpt's own
    (ModelOpt in a subprocess, as everywhere in the tests)."""
    if importlib.util.find_spec("modelopt") is None:
        pytest.skip("the precision stage needs nvidia-modelopt")
    proc = subprocess.run([sys.executable, "-c", AUTOCAST_CLEANUP_BOTH_WAYS],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    removed = json.loads(proc.stdout.strip().splitlines()[-1])
    # one pass, as ModelOpt's: the Cast feeding a dead Cast stays
    assert removed["modelopt"] == ["dead_after", "dead_relu", "optional_output_unread"]
    assert removed["indexed"] == removed["modelopt"]
    # the installed ModelOpt is the one the patch is written for (else it would not apply)
    assert removed["indexed_applied"] is True


def test_fp16_values_convert_as_autocast_does_a_chunk_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked, the conversion equals AutoCast's rule applied to the whole weight at once
    (clamp to FP16's range, non-zero values below its smallest subnormal set to it)."""
    from trtpack.precision.fp16 import autocast_weights

    rng = np.random.default_rng(11)
    values = rng.normal(0, 0.05, (37, 53)).astype(np.float32)
    values.flat[:8] = [1e-9, -1e-9, 3e-8, -4e-8, 0.0, 1e5, -1e6, np.nan]
    values.flat[-3:] = [-2e-8, 7e4, 5e-9]  # in the last, partial chunk
    top, lowest = np.finfo(np.float16).max, np.finfo(np.float16).smallest_subnormal
    clipped = np.clip(values, -top, top)
    expected = np.where((clipped != 0) & (np.abs(clipped) < lowest), lowest,
                        clipped).astype(np.float16)
    monkeypatch.setattr(autocast_weights, "FP16_CHUNK", 100)  # 20 chunks, the last partial
    got = autocast_weights.fp16_values(values)
    assert got.dtype == np.float16 and got.shape == values.shape
    np.testing.assert_array_equal(got, expected)  # NaN where NaN
    assert got.flat[1] == lowest and got.flat[5] == top and got.flat[6] == -top

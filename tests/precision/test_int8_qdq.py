"""trtpack's own INT8 Q/DQ (``trtpack.precision.int8.qdq``): the model ModelOpt's
``quantize`` builds (the same nodes, names, weights; the scales within float rounding), on a
transformer and a convolutional graph, and a calibration whose memory stays near the
weights (ModelOpt's held about ten copies of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.precision_fixtures import fp32_artifacts, tiny_npz
from trtpack.precision.calibration.data import load_feeds, save_feeds
from trtpack.precision.int8 import qdq
from trtpack.precision.int8.placement import place
from trtpack.precision.int8.search import run_model
from trtpack.precision.modelopt_jobs import Int8Job, ModelOptJob, ModelOptWorker
from trtpack.precision.source import prepare_source
from trtpack.testing.models import conv_onnx

ROOT = Path(__file__).resolve().parents[2]
OP_TYPES = ["MatMul", "Gemm", "Conv"]


def modelopt_qdq(source: Path, feeds_npz: Path, folder: Path) -> Path:
    """ModelOpt's quantize of ``source``, run as trtpack ran it before (its worker)."""
    worker = ModelOptWorker("int8", folder)
    output = folder / "modelopt" / "model.onnx"
    output.parent.mkdir()
    try:
        worker.submit(ModelOptJob("int8", input=str(source), output=str(output),
                                  result=str(worker.cwd / "result.json"),
                                  int8=Int8Job(calibration=str(feeds_npz),
                                               op_types_to_quantize=OP_TYPES)))
        code, _, stderr, _ = worker.wait(600)
        assert code == 0, stderr[-2000:]
    finally:
        worker.close()
    return output


def tiny_feeds(path: Path) -> Path:
    """tiny-bert calibration batches (realistic ids and padded masks, 4 x 16 each) saved as
    the precision stage saves them."""
    with np.load(tiny_npz(path.with_name("samples.npz"))) as samples:
        arrays = {k: samples[k] for k in samples.files}
    save_feeds(path, [{k: v[i:i + 4] for k, v in arrays.items()} for i in range(0, 48, 4)])
    return path


def graph_view(path: Path) -> tuple[dict[str, tuple[object, ...]], dict[str, np.ndarray]]:
    model = onnx.load(str(path))
    nodes = {n.name: (n.op_type, tuple(n.input), tuple(n.output),
                      tuple(sorted((a.name, str(helper.get_attribute_value(a)))
                                   for a in n.attribute)))
             for n in model.graph.node}
    return nodes, {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def assert_same_model(mine: Path, theirs: Path) -> int:
    """Node for node and initializer for initializer, scales to the last bit (an INT8
    model's outputs move with its scales' last bits). Returns the number of Q/DQ pairs."""
    my_nodes, my_inits = graph_view(mine)
    their_nodes, their_inits = graph_view(theirs)
    assert my_nodes == their_nodes
    assert my_inits.keys() == their_inits.keys()
    for name, value in their_inits.items():
        assert my_inits[name].dtype == value.dtype and my_inits[name].shape == value.shape, name
        np.testing.assert_array_equal(my_inits[name], value, err_msg=name)
    return sum(op == "QuantizeLinear" for op, *_ in my_nodes.values())


@pytest.fixture(scope="module")
def tiny_source(tiny_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qdq-source")
    return prepare_source(fp32_artifacts(tiny_build)["onnx"], folder / "source")


def test_own_qdq_is_modelopts_model_on_a_transformer(tiny_source: Path, tmp_path: Path
                                                     ) -> None:
    """tiny-bert: every MatMul but the attention ones ModelOpt leaves in FP32 on these
    shapes (a sequence of 16: N below 16 after the first batch's shape rule would differ)."""
    feeds_npz = tiny_feeds(tmp_path / "feeds.npz")
    theirs = modelopt_qdq(tiny_source, feeds_npz, tmp_path)
    mine = tmp_path / "mine" / "model.onnx"
    mine.parent.mkdir()
    done = qdq.quantize(tiny_source, mine, OP_TYPES, [], [], load_feeds(feeds_npz))
    pairs = assert_same_model(mine, theirs)
    assert pairs == done["qdq_pairs"] and done["quantized_nodes"] >= 8


def test_own_qdq_is_modelopts_model_on_convolutions(tmp_path: Path) -> None:
    """A Conv graph: the first Conv (3 input channels, from the graph input) quantized as
    ModelOpt's Conv rule allows, weights per output channel (axis 0)."""
    source = prepare_source(conv_onnx(tmp_path / "conv.onnx"), tmp_path / "source")
    rng = np.random.default_rng(0)
    feeds = [{"image": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
             for _ in range(3)]
    save_feeds(tmp_path / "feeds.npz", feeds)
    theirs = modelopt_qdq(source, tmp_path / "feeds.npz", tmp_path)
    mine = tmp_path / "mine" / "model.onnx"
    mine.parent.mkdir()
    done = qdq.quantize(source, mine, OP_TYPES, [], [], load_feeds(tmp_path / "feeds.npz"))
    assert_same_model(mine, theirs)
    assert done["quantized_nodes"] == 2


def attention_onnx(path: Path, hidden: int = 32) -> Path:
    """One self-attention block (Q/K/V projections, scaled scores, Softmax, context, output
    projection) with small random weights: its attention is nearly uniform, so the Softmax
    output's largest value stays far below 1."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(
        (rng.standard_normal((hidden, hidden)) * 0.02).astype(np.float32), f"w_{k}")
        for k in ("q", "k", "v", "o")]
    inits.append(numpy_helper.from_array(np.array(np.sqrt(hidden), np.float32), "root"))
    nodes = [helper.make_node("MatMul", ["x", f"w_{k}"], [k], name=f"proj_{k}")
             for k in ("q", "k", "v")]
    nodes += [helper.make_node("Transpose", ["k"], ["k_t"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "k_t"], ["scores"], name="bmm1"),
              helper.make_node("Div", ["scores", "root"], ["scaled"], name="scale"),
              helper.make_node("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["context"], name="bmm2"),
              helper.make_node("MatMul", ["context", "w_o"], ["y"], name="proj_o")]
    axes: list[str | int] = ["batch", "sequence", hidden]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, axes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, axes)],
                              inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                    str(path))
    return path


def test_own_qdq_gives_softmax_outputs_modelopts_unit_range(tmp_path: Path) -> None:
    """A Softmax output read by a quantized MatMul gets the range [0, 1] (scale 1/127),
    as ModelOpt (``_adjust_tensor_ranges``) and ONNX Runtime set it, not its measured
    largest value: a sample that attends more sharply than every calibration sample
    (a short one, on bert-large's random weights) is then not clipped."""
    source = prepare_source(attention_onnx(tmp_path / "attention.onnx"), tmp_path / "source")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((2, 32, 32)).astype(np.float32)} for _ in range(3)]
    save_feeds(tmp_path / "feeds.npz", feeds)
    theirs = modelopt_qdq(source, tmp_path / "feeds.npz", tmp_path)
    mine = tmp_path / "mine" / "model.onnx"
    mine.parent.mkdir()
    done = qdq.quantize(source, mine, OP_TYPES, [], [], load_feeds(tmp_path / "feeds.npz"))
    assert done["quantized_nodes"] == 6
    calibration = qdq.calibrate(source, place(onnx.load(str(source)).graph, OP_TYPES, [], []),
                                feeds)
    assert calibration.absmax["probs"] < 0.5  # measured: far below the rule's 1
    scale = graph_view(mine)[1]["probs_scale"]
    assert scale == np.float32(1.0 / 127.0)
    assert_same_model(mine, theirs)


def test_nodes_named_or_of_an_excluded_type_stay_fp32(tiny_source: Path, tmp_path: Path
                                                      ) -> None:
    feeds = load_feeds(tiny_feeds(tmp_path / "feeds.npz"))
    everything = tmp_path / "all.onnx"
    done = qdq.quantize(tiny_source, everything, OP_TYPES, [], [], feeds)
    quantized = [n.name for n in onnx.load(str(everything)).graph.node
                 if n.op_type == "MatMul" and any(i.endswith("_DequantizeLinear_Output")
                                                  for i in n.input)]
    kept = tmp_path / "kept.onnx"
    fewer = qdq.quantize(tiny_source, kept, OP_TYPES, quantized[:2], [], feeds)
    assert fewer["quantized_nodes"] == done["quantized_nodes"] - 2
    none = qdq.quantize(tiny_source, tmp_path / "none.onnx", OP_TYPES, [], ["MatMul"], feeds)
    assert none["quantized_nodes"] == 0


def matmul_chain(path: Path, layers: int = 4, hidden: int = 1024) -> int:
    """A residual MatMul -> Relu -> MatMul chain with dynamic batch and sequence axes (its
    weights in a data file beside it); returns the weights' bytes."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        up = numpy_helper.from_array(
            (rng.standard_normal((hidden, 4 * hidden)) / 32).astype(np.float32), f"w{k}_up")
        down = numpy_helper.from_array(
            (rng.standard_normal((4 * hidden, hidden)) / 64).astype(np.float32), f"w{k}_down")
        inits += [up, down]
        nodes += [helper.make_node("MatMul", [x, up.name], [f"up{k}"], name=f"up{k}"),
                  helper.make_node("Relu", [f"up{k}"], [f"relu{k}"], name=f"relu{k}"),
                  helper.make_node("MatMul", [f"relu{k}", down.name], [f"down{k}"],
                                   name=f"down{k}"),
                  helper.make_node("Add", [x, f"down{k}"], [f"h{k}"], name=f"add{k}")]
        x = f"h{k}"
    axes: list[str | int] = ["batch", "sequence", hidden]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, axes)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, axes)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=path.name + ".data")
    return sum(i.ByteSize() for i in inits)


MEASURE = """
import json, resource, sys
from pathlib import Path
import numpy as np, onnx, onnxruntime
from trtpack.precision.int8 import qdq
feeds = [{"x": np.random.default_rng(k).standard_normal((8, 64, 1024)).astype(np.float32)}
         for k in range(4)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
done = qdq.quantize(Path(sys.argv[1]), Path(sys.argv[2]), ["MatMul"], [], [], feeds)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"grown_bytes": grown * 1024, **done}))
"""


def test_own_qdq_holds_the_weights_about_once(tmp_path: Path) -> None:
    """The quantize's own peak (its process's, beyond its imports) on 128 MB of weights
    with 8 MB activations a batch: the session's weights and one batch, not ten copies
    (ModelOpt's quantize held about ten: benchmarks/README.md, "INT8's precision stage").
    Measured in a process of its own: what other tests run beside it does not count."""
    source = tmp_path / "model.onnx"
    weights = matmul_chain(source)
    found = subprocess.run([sys.executable, "-c", MEASURE, str(source),
                            str(tmp_path / "out.onnx")], capture_output=True, text=True,
                           check=False, cwd=tmp_path, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert found.returncode == 0, found.stderr[-2000:]
    done = json.loads(found.stdout.strip().splitlines()[-1])
    assert done["quantized_nodes"] == 8
    assert done["grown_bytes"] < 2.2 * weights, (done["grown_bytes"] / 2**20, weights / 2**20)


def test_references_run_measures_the_calibration_batches_as_calibrate_does(
        tiny_source: Path, tmp_path: Path) -> None:
    """The precision stage's one session: the FP32 references of every part, and the
    measurements of the calibration batches (bit for bit those of ``qdq.calibrate``) whether
    the batches are a part (measured in their references' runs) or not (the calibration
    split judged on tight batches: the padded batches run once more, measured only)."""
    feeds = load_feeds(tiny_feeds(tmp_path / "feeds.npz"))
    calibration, others = feeds[:3], feeds[3:]
    graph = onnx.load(str(tiny_source), load_external_data=False).graph
    expected = qdq.calibrate(tiny_source, place(graph, OP_TYPES, [], []), calibration)
    reference = run_model(tiny_source, others)
    for parts in ((("other", others), ("calibration", calibration)), (("other", others),)):
        refs, measured = qdq.references_and_calibration(tiny_source, parts, OP_TYPES,
                                                        calibration)
        assert len(refs) == sum(len(p) for _, p in parts)
        assert measured.batches == len(calibration) and measured.absmax
        assert measured.absmax == expected.absmax and measured.shapes == expected.shapes
        for got, want in zip(refs, reference, strict=False):
            assert got.keys() == want.keys()
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-4)

"""The erf GELU rewritten in the order ONNX Runtime fuses (``onnx_tools.gelu_form``): the same
values bit for bit where the graph runs as written, fused where ONNX Runtime optimizes, and
only on the exporter's exact pattern."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtpack.cases import load_cases
from trtpack.onnx_tools.gelu_form import rewire_erf_gelus
from trtpack.runtimes.onnxruntime import cpu_session, run_session


def gelu_graph(half_first: bool = True, x_first: bool = True, half: float = 0.5,
               extra_reader: bool = False) -> onnx.ModelProto:
    """``x * (0.5 * (1 + erf(x / sqrt 2)))`` as the dynamo exporter writes it, between two
    MatMuls (a feed-forward block's shape), operand orders as asked."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("w1", rng.standard_normal((16, 64), dtype=np.float32)),
        ("w2", rng.standard_normal((64, 16), dtype=np.float32)),
        ("sqrt2", np.array(1.4142135623730951, np.float32)),
        ("one", np.array(1.0, np.float32)), ("half", np.array(half, np.float32)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["up"], name="up"),
             helper.make_node("Div", ["up", "sqrt2"], ["scaled"], name="div"),
             helper.make_node("Erf", ["scaled"], ["erf"], name="erf"),
             helper.make_node("Add", ["erf", "one"], ["ones"], name="add"),
             helper.make_node("Mul", ["half", "ones"] if half_first else ["ones", "half"],
                              ["halves"], name="half"),
             helper.make_node("Mul", ["up", "halves"] if x_first else ["halves", "up"],
                              ["gelu"], name="gelu"),
             helper.make_node("MatMul", ["gelu", "w2"], ["y"], name="down")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("halves", TensorProto.FLOAT, ["b", 64]))
    graph = helper.make_graph(
        nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16])],
        outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def runtime_ops(model: onnx.ModelProto, tmp_path: Path) -> Counter[str]:
    """The operators ONNX Runtime runs for ``model`` after its own optimizations."""
    optimized = tmp_path / "optimized.onnx"
    cpu_session(model, few_runs=True, optimized_model_path=optimized)
    return Counter(n.op_type for n in onnx.load(str(optimized)).graph.node)


def realistic_feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((n, 16), dtype=np.float32) * scale}
            for n, scale in ((1, 0.1), (7, 1.0), (64, 4.0))]


@pytest.mark.parametrize("half_first", [True, False])
@pytest.mark.parametrize("x_first", [True, False])
def test_rewired_gelu_is_bit_identical_as_written_and_fused_by_onnxruntime(
        half_first: bool, x_first: bool, tmp_path: Path) -> None:
    before = gelu_graph(half_first, x_first)
    after = gelu_graph(half_first, x_first)
    assert rewire_erf_gelus(after) == 1
    assert [n.op_type for n in after.graph.node] == [n.op_type for n in before.graph.node]
    assert after.graph.node[-2].output[0] == "gelu"  # the GELU's output tensor is kept
    onnx.checker.check_model(after)
    feeds = realistic_feeds()
    written = [run_session(cpu_session(m, optimized=False), feeds) for m in (before, after)]
    for old, new in zip(*written, strict=True):
        assert old["y"].tobytes() == new["y"].tobytes()
    assert runtime_ops(before, tmp_path)["Gelu"] == 0  # the exporter's order: not fused
    assert runtime_ops(after, tmp_path)["Gelu"] == 1
    fused = run_session(cpu_session(after), feeds)
    for old, new in zip(written[0], fused, strict=True):
        np.testing.assert_allclose(new["y"], old["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph", [gelu_graph(half=0.49), gelu_graph(extra_reader=True)],
                         ids=["not-a-half", "intermediate-read-elsewhere"])
def test_only_the_exact_pattern_is_rewired(graph: onnx.ModelProto) -> None:
    before = graph.SerializeToString()
    assert rewire_erf_gelus(graph) == 0
    assert graph.SerializeToString() == before


def test_an_exported_bert_is_rewired_with_the_same_values_and_the_same_served_model(
        tiny_build: Path) -> None:
    """tiny-bert's simplified graph: each layer's GELU rewired (the simplify stage's
    record), its outputs at every profile corner as written bit for bit those of the graph
    before (the export's, onnxsim only folds constants here), the CPU model still fused."""
    report = json.loads((tiny_build / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    layers = json.loads((tiny_build / "artifacts" / "export" / "config.json").read_text())[
        "num_hidden_layers"]
    assert stages["simplify"]["metrics"]["gelus_rewired"] == layers
    fused = stages["cpu_model"]["metrics"]["fused_operators"]
    assert fused["Gelu"] + fused["BiasGelu"] == layers
    cases = load_cases(tiny_build / "artifacts" / "export" / "reference.npz")
    feeds = [c.inputs for c in cases]
    assert {c.corner for c in cases} == {"min", "opt", "max"}
    exported, simplified = (
        run_session(cpu_session(tiny_build / "artifacts" / stage / "model.onnx",
                                optimized=False), feeds) for stage in ("export", "simplify"))
    for old, new in zip(exported, simplified, strict=True):
        assert old.keys() == new.keys()
        for name in old:
            assert old[name].tobytes() == new[name].tobytes(), name


def test_a_users_onnx_keeps_its_gelus(tiny_build: Path) -> None:
    """An ONNX MODEL's later stages match its own outputs exactly: its GELUs stay as written."""
    from trtpack.api import BuildRequest, resolve_options
    from trtpack.stages import simplify

    exported = tiny_build / "artifacts" / "export" / "model.onnx"
    onnx_plan, _ = resolve_options(BuildRequest(str(exported), target="cpu"))
    hf_plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu", random_weights=True))
    assert not simplify.rewires_gelus(onnx_plan)
    assert simplify.rewires_gelus(hf_plan)
    assert simplify.fingerprint(onnx_plan) != simplify.fingerprint(hf_plan)


def test_the_benchmark_puts_the_exporters_order_back() -> None:
    """benchmarks/gelu_form.py times the rewired graph against its GELUs put back: the
    exporter's graph exactly."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gelu_form.py"
    spec = importlib.util.spec_from_file_location("benchmark_gelu_form", path)
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    exported = gelu_graph()
    model = gelu_graph()
    assert rewire_erf_gelus(model) == 1
    assert benchmark.exporter_order(model) == 1
    assert model.SerializeToString() == exported.SerializeToString()

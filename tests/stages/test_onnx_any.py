"""Any ONNX graph: value rules fed where random data is wrong, one-element integer inputs
refused without one, what was fed named when the model cannot run, weights held in Constant
nodes, a batch axis that is not first, FP16 that falls back to onnxconverter-common when
AutoCast cannot convert a graph (an ``If`` body), the generic per-sample gate, and
``--precision fp16`` on the CPU serving FP32 and saying so. Tiny models made here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_cli
from trtpack.cases import load_cases

RATE = 16000
HIDDEN = 64


def _branchy_model(path: Path) -> Path:
    """``x`` [batch, 8] and a recurrent ``state`` [2, batch, HIDDEN], a scalar int64 ``sr``: an
    ``If`` on ``sr == 16000`` runs a MatMul/Tanh body that needs ``state`` of the right
    batch; any other rate takes a branch that fails (like silero_vad's 8 kHz path on 16 kHz
    frames)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, HIDDEN)) / 3).astype(np.float32)
    u = (rng.standard_normal((HIDDEN, HIDDEN)) / 6).astype(np.float32)
    then_nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="body/MatMul"),
        helper.make_node("ReduceMean", ["state"], ["s0"], name="body/ReduceMean", axes=[0],
                         keepdims=0),
        helper.make_node("MatMul", ["s0", "u"], ["su"], name="body/MatMul_1"),
        helper.make_node("Add", ["xw", "su"], ["h"], name="body/Add"),
        helper.make_node("Tanh", ["h"], ["y_then"], name="body/Tanh"),
    ]
    constants = [helper.make_node("Constant", [], ["unused"], name="body/unused",
                                  value=numpy_helper.from_array(np.array([0], np.int64)))]
    outer_inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(u, "u")]
    then_graph = helper.make_graph(
        [constants[0], *then_nodes], "then", [],
        [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, ["batch", HIDDEN])])
    else_graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "bad_shape"], ["y_else"], name="else/Reshape")],
        "else", [], [helper.make_tensor_value_info("y_else", TensorProto.FLOAT,
                                                  ["batch", HIDDEN])],
        [numpy_helper.from_array(np.array([-1, 3], np.int64), "bad_shape")])
    nodes = [*constants[1:],
             helper.make_node("Constant", [], ["rate"], name="rate",
                              value=numpy_helper.from_array(np.array(RATE, np.int64))),
             helper.make_node("Equal", ["sr", "rate"], ["is16k"], name="Equal"),
             helper.make_node("If", ["is16k"], ["y"], name="If", then_branch=then_graph,
                              else_branch=else_graph)]
    graph = helper.make_graph(
        nodes, "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", HIDDEN]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HIDDEN])],
        outer_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


AXES = ("--input", "x=float32[batch,8]", "--input",
        f"state=float32[2,batch,{HIDDEN}]=-1..1",
        "--profile", "1:2:4")


def _build(model: Path, tmp_path: Path, cache_dir: Path, *extra: str) -> Any:
    return run_cli("build", str(model), "--target", "cpu", "--out", str(tmp_path / "out"),
                   "--cache-dir", str(cache_dir), "--json", *AXES, *extra)


def test_a_scalar_integer_input_without_a_rule_is_exit_2_naming_it(tmp_path: Path,
                                                                   cache_dir: Path) -> None:
    result = _build(_branchy_model(tmp_path / "m.onnx"), tmp_path, cache_dir)
    assert result.exit_code == 2
    assert "'sr'" in result.output and "--input sr=VALUE" in result.output
    assert not (tmp_path / "out").exists()


def test_an_error_from_running_the_model_says_what_was_fed(tmp_path: Path, cache_dir: Path) -> None:
    result = _build(_branchy_model(tmp_path / "m.onnx"), tmp_path, cache_dir, "--input", "sr=8000")
    assert result.exit_code == 2
    assert "'sr' = 8000 (from the rule 8000)" in result.output
    assert f"state: 2x1x{HIDDEN}" in result.output  # a large input: its shape


def test_a_constant_is_fed_in_verification_and_to_perf_analyzer(tmp_path: Path,
                                                                cache_dir: Path) -> None:
    model = _branchy_model(tmp_path / "m.onnx")
    result = _build(model, tmp_path, cache_dir, "--input", f"sr={RATE}")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    cases = load_cases(out / "artifacts" / "import" / "reference.npz")
    assert all(c.inputs["sr"].item() == RATE and c.inputs["sr"].shape == () for c in cases)
    states = np.concatenate([c.inputs["state"].ravel() for c in cases])
    assert states.min() >= -1 and states.max() <= 1 and states.std() > 0.3  # the range
    perf = json.loads((out / "tuning" / "perf_inputs_p0_opt.json").read_text())
    assert perf["data"][0]["sr"] == {"content": [RATE], "shape": []}
    recipe = (out / "recipe.yaml").read_text()
    assert f"value: {RATE}" in recipe and "value: -1..1" in recipe


def test_fp16_on_the_cpu_serves_fp32_and_says_why(tmp_path: Path, cache_dir: Path) -> None:
    result = _build(_branchy_model(tmp_path / "m.onnx"), tmp_path, cache_dir,
                    "--input", f"sr={RATE}",
                    "--precision", "fp16")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["precision"] == "fp32"
    assert any("serving the FP32 model" in w and "--no-engine" in w
               for w in report["warnings"])
    assert not [s for s in report["stages"] if s["name"] == "precision"
                and s["status"] != "skipped"]


def test_fp16_falls_back_when_autocast_cannot_convert_the_graph(tmp_path: Path,
                                                                cache_dir: Path) -> None:
    """AutoCast fails on this If body (ModelOpt 0.4x: a KeyError in its subgraph pass) and
    needs the batch row of ``state`` (its axis 1) for its reference run; onnxconverter-common
    converts it, the If kept FP32 whole when ONNX Runtime cannot type its body half
    converted. Verified per sample in ONNX Runtime on the CPU."""
    model = _branchy_model(tmp_path / "m.onnx")
    result = run_cli("build", str(model), "--target", "g5", "--no-engine", "--precision",
                     "fp16", "--out", str(tmp_path / "out"), "--cache-dir",
                     str(cache_dir), "--json", *AXES, "--input", f"sr={RATE}")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    precision = next(s for s in report["stages"] if s["name"] == "precision")
    metrics = precision["metrics"]
    assert metrics["converter"] in ("ModelOpt AutoCast", "onnxconverter-common float16")
    assert report["verification"] and all(r["passed"] for r in report["verification"])
    assert {r["metric"] for r in report["verification"] if r["output"] == "y"} \
        == {"scaled_error"}
    if metrics["converter"] != "ModelOpt AutoCast":
        assert metrics["autocast_failure"]
        assert any("AutoCast could not convert" in w for w in report["warnings"])
    stats = metrics["low_precision"]
    assert stats["matmul_gemm_nodes"] == 2  # the If body's MatMuls are counted
    for node, why in metrics["kept_fp32_reasons"].items():
        assert node and why
    if stats["share"] < 0.5:
        assert any("Conv/MatMul/Gemm nodes run in FP16" in w for w in report["warnings"])


def test_fp16_of_weights_in_external_constant_nodes(tmp_path: Path, cache_dir: Path) -> None:
    """Paddle's exporter keeps every weight in a Constant node; saved with external data,
    the precision stage's work folder must carry that data file too (it looked at
    initializers only: "External data path does not exist", exit 4 on 955ff60)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(1).standard_normal((8, HIDDEN)) / 3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], name="w", value=numpy_helper.from_array(w)),
         helper.make_node("MatMul", ["x", "w"], ["h"], name="MatMul"),
         helper.make_node("Tanh", ["h"], ["y"], name="Tanh")], "constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HIDDEN])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.onnx.data",
                    convert_attribute=True)
    result = run_cli("build", str(path), "--target", "g5", "--no-engine", "--precision",
                     "fp16", "--out", str(tmp_path / "out"), "--cache-dir",
                     str(cache_dir), "--json", "--profile", "1:2:4")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    stats = next(s for s in report["stages"] if s["name"] == "precision")["metrics"][
        "low_precision"]
    assert stats["matmul_gemm_low_precision"] == 1


def _samples(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_sample_inputs_are_fed_at_the_corners_they_fit(tmp_path: Path, cache_dir: Path) -> None:
    """Three real rows of ``x`` and of ``state`` (its batch on axis 1) repeated to each
    corner's batch; ``sr`` from its rule."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    state = rng.uniform(-1, 1, (2, 3, HIDDEN)).astype(np.float32)
    samples = _samples(tmp_path / "s.npz", x=x, state=state)
    result = _build(_branchy_model(tmp_path / "m.onnx"), tmp_path, cache_dir,
                    "--input", f"sr={RATE}",
                    "--sample-inputs", str(samples))
    assert result.exit_code == 0, result.output
    cases = load_cases(tmp_path / "out" / "artifacts" / "import" / "reference.npz")
    for case in cases:
        batch = case.inputs["x"].shape[0]
        np.testing.assert_array_equal(case.inputs["x"], x[np.arange(batch) % 3])
        np.testing.assert_array_equal(case.inputs["state"], state[:, np.arange(batch) % 3])
    assert not [w for w in json.loads(result.stdout)["warnings"] if "--sample-inputs" in w]


@pytest.mark.parametrize(("arrays", "problem"), [
    ({"x": np.zeros((3, 8), np.float32), "nope": np.zeros(3)}, "nope is not an input"),
    ({"x": np.zeros((3, 8, 1), np.float32)}, "'x' has 3 dimension(s)"),
    ({"x": np.zeros((3, 9), np.float32)}, "'x' dimension 1 is 9"),
    ({"x": np.zeros((3, 8), np.int64)}, "'x' is int64, the input is float32"),
    ({"x": np.full((3, 8), np.nan, np.float32)}, "NaN"),
    ({"state": np.zeros((2, 3, HIDDEN), np.float32)}, "no array for x"),
])
def test_bad_sample_inputs_are_exit_2_before_any_work(tmp_path: Path,
                                                      cache_dir: Path, arrays: dict[str, Any],
                                                      problem: str) -> None:
    samples = _samples(tmp_path / "s.npz", **arrays)
    result = _build(_branchy_model(tmp_path / "m.onnx"), tmp_path, cache_dir,
                    "--input", f"sr={RATE}",
                    "--sample-inputs", str(samples))
    assert result.exit_code == 2, result.output
    assert problem in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.failed").exists()


def test_token_ids_past_the_vocabulary_are_exit_2(tmp_path: Path) -> None:
    ids = np.full((2, 8), 999, np.int64)
    ids[1, 3] = 1000  # tiny-bert's vocabulary is 1000
    samples = _samples(tmp_path / "s.npz", input_ids=ids, attention_mask=np.ones_like(ids),
                       token_type_ids=np.zeros_like(ids))
    result = run_cli("build", "tiny-bert", "--target", "cpu", "--out", str(tmp_path / "o"),
                     "--sample-inputs", str(samples))
    assert result.exit_code == 2, result.output
    assert "token id 1000, outside the vocabulary [0, 1000)" in result.output


def _nonzero_model(path: Path) -> Path:
    """``scores`` [batch, 8] and the indices of the positive ones, ``picked`` [2, N]: a
    shape that depends on the data (as a detector's NMS output's does)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["scores"], name="Tanh"),
         helper.make_node("Greater", ["scores", "zero"], ["positive"], name="Greater"),
         helper.make_node("NonZero", ["positive"], ["picked"], name="NonZero")], "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("picked", TensorProto.INT64, [2, "n"])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "zero")])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                    str(path))
    return path


def test_an_output_of_data_dependent_shape_is_named_and_compared_where_shapes_agree(
        tmp_path: Path, cache_dir: Path) -> None:
    from trtpack.cases import Case
    from trtpack.sources.onnx_recipe import recipe_for_onnx
    from trtpack.verify.compare import compare_cases

    model = _nonzero_model(tmp_path / "m.onnx")
    result = run_cli("build", str(model), "--target", "cpu", "--out", str(tmp_path / "out"),
                     "--cache-dir", str(cache_dir), "--json", "--profile", "1:2:4")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert any("'picked': a shape that depends on the data" in w for w in report["warnings"])
    picked = [r for r in report["verification"] if r["output"] == "picked"]
    assert picked and all(r["passed"] and r["metric"] == "data_dependent" for r in picked)
    # a candidate that picked one index fewer: "not verified", named, not a failure
    recipe = recipe_for_onnx(model)
    ref = Case(0, "opt", {"x": np.ones((1, 8), np.float32)},
               {"scores": np.ones((1, 8), np.float32), "picked": np.zeros((2, 8), np.int64)})
    rows = compare_cases("fp16-vs-fp32", recipe, "fp16", [ref],
                         [{"scores": np.ones((1, 8), np.float32),
                           "picked": np.zeros((2, 7), np.int64)}])
    row = next(r for r in rows if r.output == "picked")
    assert row.passed and "not verified: 'picked' has a data-dependent shape" in row.reason


def test_the_float16_fallback_converts_an_if_body_as_a_graph_of_its_own(tmp_path: Path
                                                                        ) -> None:
    """onnxconverter-common cannot type an If body half converted inside its graph, so the
    fallback lifts each body into a model of its own (the values it reads from outside as
    FP32 inputs), converts it and puts it back: the taken branch's MatMuls run in FP16 and
    the model's output stays within the FP16 gate; the branch the reference input does not
    take (and so no sample checks) stays FP32, with the reason."""
    import onnx

    from trtpack.precision.fp16.onnxconverter_fallback import convert_graph
    from trtpack.precision.graph import fp16_nodes
    from trtpack.precision.modelopt_jobs import Fp16Job
    from trtpack.runtimes.onnxruntime import cpu_session
    from trtpack.verify.sample_metrics import scaled_error_per_sample

    source = onnx.load(str(_branchy_model(tmp_path / "m.onnx")))
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((3, 8)).astype(np.float32),
            "state": rng.uniform(-1, 1, (2, 3, HIDDEN)).astype(np.float32),
            "sr": np.array(RATE, np.int64)}
    blocked: dict[str, str] = {}
    kept: dict[str, str] = {}
    converted = convert_graph(source, feed, Fp16Job(), blocked, kept, keep_io_types=True)
    assert fp16_nodes(converted) == {"body/MatMul", "body/MatMul_1"}
    assert set(kept) == {"If/else_branch"} and "does not take" in kept["If/else_branch"]
    onnx.checker.check_model(converted)
    (ref,), (out,) = cpu_session(source).run(None, feed), cpu_session(converted).run(None, feed)
    assert out.dtype == np.float32
    score = scaled_error_per_sample(ref, out, feed, None)
    assert 0.97 <= score.min() < 1.0  # FP16 indeed, within the gate

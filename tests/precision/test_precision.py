"""The precision stage on a real tiny-bert build (2 layers, random weights): FP16 through
ModelOpt AutoCast, INT8 through ModelOpt Q/DQ, the fallback search, the recipe overlay, and
the isolation of ModelOpt in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from tests.conftest import run_cli
from tests.precision_fixtures import (
    TINY_PROFILES,
    build_options,
    fp32_artifacts,
    make_context,
    run_stage,
    strict_gate,
    tiny_npz,
    with_recipe,
)
from trtpack.errors import StageError, UserInputError
from trtpack.precision.cpu.int8 import INTEGER_KERNELS
from trtpack.precision.fp16.conversion import Fp16Conversion
from trtpack.precision.graph import (
    fp16_nodes,
    int8_quantized_nodes,
    low_precision_stats,
    producers,
)
from trtpack.precision.int8.conversion import Int8Conversion
from trtpack.precision.int8.search import run_model
from trtpack.precision.int8.surrogates import SurrogateBuilder, node_groups
from trtpack.precision.modelopt_jobs import ModelOptJob
from trtpack.precision.source import prepare_source, resolve_node_patterns
from trtpack.report import BuildReport
from trtpack.sources.recipe_files import load_recipe_file
from trtpack.stages import precision
from trtpack.stages.precision import ConversionView
from trtpack.verify.sample_metrics import pooled_cosine_per_sample
from trtpack.verify.samples import make_inputs

MODELOPT_LEFTOVERS = ("sym_shape_infer_temp.onnx", "augmented_model.onnx")


@pytest.fixture(scope="module")
def tiny(tiny_build: Path) -> dict[str, Path]:
    return fp32_artifacts(tiny_build)


def _fresh_inputs(shape: tuple[int, int], seed: int = 11) -> dict[str, np.ndarray]:
    """Inputs at a shape between the profile corners, unlike any verification case."""
    from trtpack.sources.resolve import resolve_model

    specs = resolve_model("tiny-bert").input_specs()
    return make_inputs(specs, {s.name: shape for s in specs}, vocab_size=1000, seed=seed)


def _assert_no_modelopt_leftovers(*folders: Path) -> None:
    for folder in folders:
        names = {p.name for p in folder.rglob("*")}
        assert not names & set(MODELOPT_LEFTOVERS), (folder, names)
        assert not [n for n in names if n.endswith(".data") and "-" in n], names  # <uuid>.data
        assert not [n for n in names if n.startswith(("modelopt-", ".work-"))], names


# ----------------------------------------------------------------------------- FP16


def test_fp16_autocast_keeps_io_types_and_matches_fp32(tiny: dict[str, Path], tmp_path: Path
                                                       ) -> None:
    plan = build_options("tiny-bert", "fp16", tmp_path / "out", TINY_PROFILES)
    cwd_before = set(os.listdir())
    outcome, messages, log = run_stage(plan, tiny, tmp_path / "precision")
    model_path = outcome.artifacts["precision_onnx"]
    assert model_path == tmp_path / "precision" / "model.onnx"
    model = onnx.load(str(model_path))
    elem = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input,
                                                           *model.graph.output)}
    assert elem == {"input_ids": onnx.TensorProto.INT64, "attention_mask": onnx.TensorProto.INT64,
                    "token_type_ids": onnx.TensorProto.INT64,
                    "last_hidden_state": onnx.TensorProto.FLOAT}
    matmuls = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm")]
    assert matmuls and fp16_nodes(model) == set(matmuls)
    assert outcome.metrics["low_precision"]["matmul_gemm_share"] == 1.0
    # one passing row per profile corner, compared with the FP32 ONNX
    assert {(r.profile, r.corner) for r in outcome.verification} == {
        (p, c) for p in (0, 1) for c in ("min", "opt", "max")}
    assert all(r.check == "fp16-vs-fp32" and r.passed for r in outcome.verification)
    assert all(r.metric_value is not None and r.metric_value >= 0.999
               for r in outcome.verification)
    # independent check on inputs the stage never saw
    feed = _fresh_inputs((3, 24))
    (ref,) = ort.InferenceSession(str(tiny["onnx"])).run(None, feed)
    (got,) = ort.InferenceSession(str(model_path)).run(None, feed)
    assert got.dtype == np.float32
    assert pooled_cosine_per_sample(ref, got, feed, "attention_mask").min() >= 0.999
    assert 0 < np.abs(ref - got).max() < 0.05  # FP16 really ran, and stayed close
    # ModelOpt ran elsewhere and left nothing behind
    assert "modelopt" not in sys.modules
    assert any("AutoCast" in m for m in messages)
    assert "ModelOpt autocast: exit 0" in log.read_text()
    # the weight matrices (here the word embeddings, kept FP32) in the model's data file
    assert sorted(p.name for p in (tmp_path / "precision").iterdir()) == ["model.onnx",
                                                                         "model.onnx.data"]
    assert set(os.listdir()) == cwd_before
    _assert_no_modelopt_leftovers(tmp_path)


def test_fp16_recipe_keeps_nodes_and_op_types_in_fp32(tiny: dict[str, Path], tmp_path: Path
                                                      ) -> None:
    fp32 = onnx.load(str(tiny["onnx"]), load_external_data=False)
    first_matmul = next(n.name for n in fp32.graph.node if n.op_type == "MatMul")
    plan = build_options("tiny-bert", "fp16", tmp_path / "out", TINY_PROFILES)
    plan = with_recipe(plan, precision_options={"fp16": {
        "keep_fp32_nodes": [first_matmul, "no_such_node.*"],
        "keep_fp32_op_types": ["Softmax"]}})
    outcome, _, _ = run_stage(plan, tiny, tmp_path / "precision")
    model = onnx.load(str(outcome.artifacts["precision_onnx"]))
    low = fp16_nodes(model)
    assert first_matmul not in low
    stats = low_precision_stats(model, "fp16")
    assert stats.low == stats.total - 1
    from trtpack.precision.graph import tensor_types

    types = tensor_types(model)
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert softmax and all(types[n.input[0]] == onnx.TensorProto.FLOAT for n in softmax)
    assert any("no_such_node" in w and "match no node" in w for w in outcome.warnings)


def test_fp16_fallback_keeps_the_worst_nodes_in_fp32_and_writes_an_overlay(
        tiny: dict[str, Path], tmp_path: Path) -> None:
    plan = build_options("tiny-bert", "fp16", tmp_path / "out", TINY_PROFILES)
    plan = strict_gate(plan, "fp16", atol=1e-3, min_cosine=0.999)
    outcome, messages, _ = run_stage(plan, tiny, tmp_path / "precision")
    m = outcome.metrics
    assert not m["before"]["passed"] and m["after"]["passed"]
    assert m["after"]["max_abs_diff"] <= 1e-3 < m["before"]["max_abs_diff"]
    added = m["excluded_by_fallback"]
    assert added and m["fallback"]["rounds"] >= 1
    assert any("fallback round 1" in msg for msg in messages)
    assert all(r.passed for r in outcome.verification)
    assert 0 < m["low_precision"]["low_precision_nodes"] < m["low_precision"]["compute_nodes"]
    overlay = yaml.safe_load(outcome.artifacts["recipe_overlay"].read_text())
    assert overlay == {"extends": "tiny-bert",
                       "precision_options": {"fp16": {"keep_fp32_nodes": added}}}


def test_models_with_external_data_convert_and_save_their_data_beside(
        tiny: dict[str, Path], tmp_path: Path) -> None:
    """Models keep their weight matrices in model.onnx.data: the stage reads such a model,
    and the worker writes one the same way."""
    from trtpack.onnx_tools.files import model_bytes, move_model, save_model

    folder = tmp_path / "simplify"
    folder.mkdir()
    # the build's artifacts are hard links into its stage cache, which onnx will not load
    # external data from: a copy of the folder first (as docs/builds.md says)
    source = tmp_path / "artifact"
    shutil.copytree(tiny["onnx"].parent, source)
    model = onnx.load(str(source / tiny["onnx"].name))
    save_model(model, folder / "model.onnx")
    assert (folder / "model.onnx.data").stat().st_size >= 1000 * 64 * 4  # word embeddings
    assert model_bytes(folder / "model.onnx") > 100_000
    plan = build_options("tiny-bert", "fp16", tmp_path / "out", TINY_PROFILES)
    outcome, _, _ = run_stage(plan, {**tiny, "onnx": folder / "model.onnx"},
                              tmp_path / "precision")
    assert all(r.passed for r in outcome.verification)
    out = tmp_path / "moved"
    out.mkdir()
    (tmp_path / "written").mkdir()
    save_model(onnx.load(str(outcome.artifacts["precision_onnx"])),
               tmp_path / "written" / "model.onnx")
    move_model(tmp_path / "written" / "model.onnx", out / "model.onnx")
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.onnx.data"]
    feed = _fresh_inputs((2, 12))
    (a,) = ort.InferenceSession(str(out / "model.onnx")).run(None, feed)
    (b,) = ort.InferenceSession(str(outcome.artifacts["precision_onnx"])).run(None, feed)
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- INT8


def test_int8_fallback_search_keeps_groups_in_fp32_and_the_overlay_reproduces_it(
        tiny: dict[str, Path], tmp_path: Path) -> None:
    npz = tiny_npz(tmp_path / "calibration.npz")
    plan = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES,
                            calibration=npz)
    plan = strict_gate(plan, "int8", min_cosine=0.99999)
    outcome, messages, log = run_stage(plan, tiny, tmp_path / "first")
    m = outcome.metrics
    # every MatMul/Gemm/Conv quantized fails this gate; the search finds what to keep in FP32
    assert not m["before"]["passed"] and m["after"]["passed"]
    assert m["after"]["worst_metric"] > m["before"]["worst_metric"]
    assert m["calibration"]["source"] == "npz" and m["calibration"]["holdout_samples"] > 0
    assert m["quantize_op_types"] == ["MatMul", "Gemm", "Conv"]
    excluded = m["excluded_nodes"]
    assert excluded and excluded == m["excluded_by_fallback"]
    assert set(m["excluded_node_hints"]) == set(excluded)
    stats = m["low_precision"]
    assert 0 < stats["matmul_gemm_low_precision"] < stats["matmul_gemm_nodes"]
    assert m["fallback"]["evaluations"] > len(m["fallback"]["sensitivity"]) > 1
    assert any("sensitivity" in msg for msg in messages)
    assert any(msg.startswith("fallback round 1") for msg in messages)
    model = onnx.load(str(outcome.artifacts["precision_onnx"]))
    quantized = int8_quantized_nodes(model)
    assert not quantized & set(excluded)
    assert len(quantized) == stats["matmul_gemm_low_precision"]
    # Q/DQ only in front of quantized nodes: residual Adds read the FP32 tensors
    produced_by = producers(model)
    for node in model.graph.node:
        if node.op_type in ("Add", "LayerNormalization") or node.name in excluded:
            assert all(getattr(produced_by.get(t), "op_type", None) != "DequantizeLinear"
                       for t in node.input), node.name
    # the overlay: extends the recipe, names the nodes; loading it reproduces the model
    overlay_path = outcome.artifacts["recipe_overlay"]
    overlay = yaml.safe_load(overlay_path.read_text())
    assert overlay["extends"] == "tiny-bert"
    assert overlay["precision_options"]["int8"] == {
        "quantize_op_types": ["MatMul", "Gemm", "Conv"], "exclude_nodes": excluded}
    recipe = load_recipe_file(overlay_path)
    assert recipe.name == "tiny-bert" and recipe.precision_options.int8.exclude_nodes == excluded
    again = strict_gate(plan.__class__(**{**plan.__dict__, "recipe": recipe}), "int8",
                    min_cosine=0.99999)
    second, _, _ = run_stage(again, tiny, tmp_path / "second")
    assert second.metrics["before"]["passed"] and second.metrics["fallback"]["rounds"] == 0
    assert "recipe_overlay" not in second.artifacts and second.metrics["conversions"] == 1
    feed = _fresh_inputs((2, 12))
    (a,) = ort.InferenceSession(str(outcome.artifacts["precision_onnx"])).run(None, feed)
    (b,) = ort.InferenceSession(str(second.artifacts["precision_onnx"])).run(None, feed)
    # the search's model (the surrogate, a graph edit of the quantized model) is the model
    # ModelOpt builds with those nodes excluded, to float rounding
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    (ref,) = ort.InferenceSession(str(tiny["onnx"])).run(None, feed)
    assert pooled_cosine_per_sample(ref, a, feed, "attention_mask").min() >= 0.9999
    assert "ModelOpt fallback1" not in log.read_text()  # no re-quantization
    assert m["conversions"] == 1
    _assert_no_modelopt_leftovers(tmp_path)


def test_int8_fallback_off_reports_the_failed_gate(tiny: dict[str, Path], tmp_path: Path
                                                   ) -> None:
    npz = tiny_npz(tmp_path / "calibration.npz")
    plan = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES,
                            calibration=npz, fallback="off")
    plan = strict_gate(plan, "int8", min_cosine=0.99999)
    outcome, _, _ = run_stage(plan, tiny, tmp_path / "precision")
    failed = [r for r in outcome.verification if not r.passed]
    assert failed and all("cosine" in r.reason for r in failed)
    assert outcome.metrics["fallback"] == {"mode": "off", "rounds": 0,
                                          "check_consultations": 0}
    assert "recipe_overlay" not in outcome.artifacts
    assert outcome.metrics["conversions"] == 1


def test_surrogates_equal_modelopt_conversions_with_those_nodes_excluded(
        tiny: dict[str, Path], tmp_path: Path) -> None:
    """What the search evaluates is what ModelOpt builds for the exclusions it picks."""
    from trtpack.precision.calibration.data import load_calibration, save_feeds

    plan = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES)
    ctx, _, _ = make_context(plan, tiny, tmp_path / "stage")
    work = tmp_path / "work"
    work.mkdir()
    source = prepare_source(tiny["onnx"], work / "source")
    conv = Int8Conversion(ConversionView(ctx), work, source)
    cal = load_calibration(plan.recipe, plan.profiles, tiny_npz(tmp_path / "c.npz"),
                           tokenizer=None, max_samples=64, seed=0)
    save_feeds(work / "calibration.npz", cal.feeds)
    conv.calibration = cal
    base = conv.convert("all", ["MatMul", "Gemm", "Conv"], [], "fp32")
    fp32 = onnx.load(str(source))
    quantized = onnx.load(str(base.path))
    groups = node_groups(fp32, int8_quantized_nodes(quantized))
    qkv = max(groups, key=lambda g: len(g.nodes))
    assert len(qkv.nodes) == 3  # Q, K and V read the same activation
    excluded = [*qkv.nodes, groups[-1].nodes[0]]
    real = conv.convert("excluded", ["MatMul", "Gemm", "Conv"], excluded, "fp32")
    builder = SurrogateBuilder(quantized, fp32)
    feeds = [_fresh_inputs((2, 12)), _fresh_inputs((4, 40), seed=5)]
    surrogate = run_model(builder.build(excluded), feeds)
    converted = run_model(real.path, feeds)
    for s, c in zip(surrogate, converted, strict=True):
        np.testing.assert_allclose(s["last_hidden_state"], c["last_hidden_state"], atol=1e-6)
    everything = run_model(builder.build(int8_quantized_nodes(quantized)), feeds)
    reference = run_model(source, feeds)
    for s, r in zip(everything, reference, strict=True):
        np.testing.assert_allclose(s["last_hidden_state"], r["last_hidden_state"], atol=1e-5)
    quantized_out = run_model(base.path, feeds)
    assert np.abs(quantized_out[0]["last_hidden_state"]
                  - reference[0]["last_hidden_state"]).max() > 1e-4  # INT8 does change it


def test_worker_failure_is_a_stage_error_with_the_reason(tiny: dict[str, Path], tmp_path: Path
                                                         ) -> None:
    plan = build_options("tiny-bert", "fp16", tmp_path / "out", TINY_PROFILES)
    ctx, _, log = make_context(plan, tiny, tmp_path / "stage")
    work = tmp_path / "work"
    work.mkdir()
    conv = Fp16Conversion(ConversionView(ctx), work, prepare_source(tiny["onnx"], work / "src"))
    with pytest.raises(StageError, match=r"ModelOpt fp16 conversion \(broken\) failed: "
                                         r"unknown mode 'nonsense'"):
        conv.modelopt(ModelOptJob("nonsense"), "broken")
    assert "exit 2" in log.read_text()
    assert [p.name for p in (tmp_path / "stage").iterdir()] == []  # its temp folder is gone


# ----------------------------------------------------------------------------- CLI


def test_cli_int8_with_synthetic_calibration_warns_visibly(tmp_path: Path, cache_dir: Path
                                                          ) -> None:
    out = tmp_path / "out"
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--precision", "int8", *profiles, "--out", str(out),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    assert "SYNTHETIC" in result.output and "UNKNOWN" in result.output
    assert "NVML" not in result.output
    report = BuildReport.load(out / "report.json")
    assert any("SYNTHETIC" in w for w in report.warnings)
    # --target cpu: the CPU form is gated first (no Q/DQ search needed here)
    stage = report.stage("precision")
    assert stage is not None and stage.status == "skipped"
    rows = [r for r in report.verification if r.check == "cpu-int8-vs-fp32"]
    assert len(rows) == 6 and all(r.passed for r in rows)
    # an INT8 model is what is served: on a CPU target, ONNX Runtime's integer-kernel form
    # (or the Q/DQ graph when that form fails its gates)
    served = onnx.load(str(out / "model_repository" / "tiny-bert" / "1" / "model.onnx"))
    integer_kernels = {n.op_type for n in served.graph.node} & set(INTEGER_KERNELS)
    assert integer_kernels or int8_quantized_nodes(served)


def test_cli_calibration_file_without_samples_exits_2(tmp_path: Path, cache_dir: Path) -> None:
    empty = tmp_path / "calibration.txt"
    empty.write_text("\n   \n")
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--precision", "int8", "--calibration", str(empty), *profiles,
                     "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir))
    assert result.exit_code == 2, result.output
    assert "no usable samples" in result.output
    assert "Traceback" not in result.output


def test_cli_failed_int8_gate_with_fallback_off_exits_1(tmp_path: Path, cache_dir: Path) -> None:
    recipe = tmp_path / "strict.yaml"
    recipe.write_text("extends: tiny-bert\nverify:\n  int8: {min_cosine: 0.999999}\n")
    npz = tiny_npz(tmp_path / "calibration.npz")
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    # the Q/DQ model's gate (a GPU target serves it; --no-engine: no TensorRT needed)
    result = run_cli("build", str(recipe), "--random-weights", "--target", "g5", "--no-engine",
                     "--precision", "int8", "--calibration", str(npz), "--fallback", "off",
                     *profiles, "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir))
    assert result.exit_code == 1, result.output
    report = BuildReport.load(tmp_path / "out.failed" / "report.json")
    assert report.status == "accuracy_failed"
    assert any(r.check == "int8-vs-fp32" and not r.passed for r in report.verification)


# ----------------------------------------------------------------------------- pure helpers


def test_node_patterns_are_exact_names_or_whole_name_regexes() -> None:
    names = ["MatMul", "MatMul_1", "/enc/layer.0/MatMul", "Gemm_3"]
    assert resolve_node_patterns(names, ["MatMul"]) == (["MatMul"], [])
    assert resolve_node_patterns(names, ["MatMul.*", "nope", "Gemm_3"]) == (
        ["MatMul", "MatMul_1", "Gemm_3"], ["nope"])
    assert resolve_node_patterns(names, ["/enc/layer.0/MatMul"]) == (
        ["/enc/layer.0/MatMul"], [])
    assert resolve_node_patterns(names, ["(bad"]) == ([], ["(bad"])


def test_fingerprint_follows_calibration_content_fallback_and_seed(tmp_path: Path) -> None:
    import dataclasses

    path = tmp_path / "c.txt"
    path.write_text("first sentence\n")
    plan = build_options("tiny-bert", "int8", tmp_path / "out", calibration=path)
    base = precision.fingerprint(plan)
    assert json.dumps(base)  # JSON-able
    path.write_text("another sentence\n")
    assert precision.fingerprint(plan) != base
    changed = precision.fingerprint(plan)
    for change in ({"fallback": "off"}, {"seed": 1}):
        assert precision.fingerprint(dataclasses.replace(plan, **change)) != changed
    path.unlink()
    with pytest.raises(UserInputError, match="does not exist"):
        precision.fingerprint(plan)


def test_precision_modules_import_without_heavy_packages() -> None:
    from tests.architecture.test_import_pure import run_blocked

    proc = run_blocked(
        "import trtpack.stages.precision, trtpack.precision.calibration.data\n"
        "import trtpack.precision.int8.search, trtpack.precision.modelopt_worker\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in HEAVY]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_cli_int8_held_out_failure_after_the_search_exits_1(tiny: dict[str, Path],
                                                            tmp_path: Path, cache_dir: Path
                                                            ) -> None:
    """The held-out split gates the build: a calibration .npz whose only short sample (one
    token) lands in the held-out split, with a gate between what that sample scores and
    what the corners and the search split score. The calibration and search samples pass,
    so the build keeps the model and the held-out gate fails it: exit 1, the sample named."""
    from trtpack.precision.calibration.files import npz_lengths
    from trtpack.precision.calibration.splits import split_three
    from trtpack.sources.resolve import resolve_model

    recipe = resolve_model("tiny-bert")
    n = 40
    shapes = {s.name: (n + 1, 16) for s in recipe.input_specs()}
    feeds = make_inputs(recipe.input_specs(), shapes, vocab_size=1000, seed=3)
    feeds["attention_mask"][:] = 1
    feeds["attention_mask"][n, 1:] = 0
    feeds["input_ids"][n, 1:] = 0
    splits = split_three(npz_lengths(feeds, recipe), 128, 0)
    assert n in splits.held_out  # the only short sample
    npz = tmp_path / "calibration.npz"
    np.savez(npz, **feeds)  # type: ignore[arg-type]
    # the model the build below makes: its first attempt (every MatMul/Gemm quantized)
    # passes the default gate, so the fallback keeps it
    plan = build_options("tiny-bert", "int8", tmp_path / "o", TINY_PROFILES,
                            calibration=npz)
    first, _, _ = run_stage(plan, tiny, tmp_path / "first" / "precision")
    assert first.metrics["fallback"]["rounds"] == 0
    splits_metrics = first.metrics["splits"]
    passing = min(splits_metrics["search"]["worst"], splits_metrics["calibration"]["worst"],
                  *(r.metric_value for r in first.verification if r.metric_value is not None))
    # the one-token input (the held-out sample's slot) that INT8 serves worst
    int8 = ort.InferenceSession(str(first.artifacts["precision_onnx"]))
    fp32 = ort.InferenceSession(str(tiny["onnx"]))
    # padded as the build pads it: to the smallest profile sequence size (4)
    probe = {k: np.repeat(v[n:n + 1, :4], 1000, axis=0) for k, v in feeds.items()}
    probe["input_ids"][:, 0] = np.arange(1000)
    ref = fp32.run(None, probe)[0]
    got = int8.run(None, probe)[0]
    values = pooled_cosine_per_sample(ref, got, probe, "attention_mask")
    worst_id = int(values.argmin())
    assert values[worst_id] < passing - 1e-4, (values.min(), passing)
    feeds["input_ids"][n, 0] = worst_id
    np.savez(npz, **feeds)  # type: ignore[arg-type]
    gate = passing - 1e-7
    strict = tmp_path / "strict.yaml"
    strict.write_text(f"extends: tiny-bert\nverify:\n  int8: {{min_cosine: {gate:.8f}}}\n")
    cli_profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    result = run_cli("build", str(strict), "--random-weights", "--target", "g5",
                     "--no-engine", "--precision", "int8", "--calibration", str(npz),
                     *cli_profiles,
                     "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir))
    assert result.exit_code == 1, result.output
    report = BuildReport.load(tmp_path / "out.failed" / "report.json")
    assert report.status == "accuracy_failed"
    failed = [r for r in report.verification if not r.passed]
    assert failed and all(r.check == "int8-heldout" for r in failed)
    assert "int8-heldout" in result.output and "samples below" in result.output


def test_int8_percentile_calibration_sets_activation_ranges(tiny: dict[str, Path],
                                                             tmp_path: Path) -> None:
    """--calibration-method percentile: ModelOpt's max model, each activation's scale set to
    the 99.99th percentile of |x| over the calibration split / 127 (weights untouched)."""
    from onnx import numpy_helper

    from trtpack.precision.calibration.data import load_calibration
    from trtpack.precision.int8.activation_ranges import (
        DEFAULT_PERCENTILE,
        activation_quantizers,
        percentile_ranges,
    )

    npz = tiny_npz(tmp_path / "calibration.npz")
    plan = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES,
                            calibration=npz, calibration_method="percentile")
    outcome, _, _ = run_stage(plan, tiny, tmp_path / "stage")
    assert outcome.metrics["calibration"]["method"] == "percentile"
    model = onnx.load(str(outcome.artifacts["precision_onnx"]))
    quantizers = activation_quantizers(model)
    assert quantizers
    cal = load_calibration(plan.recipe, plan.profiles, npz, tokenizer=None,
                           max_samples=plan.recipe.precision_options.int8
                           .max_calibration_samples, seed=plan.seed)
    copy = tmp_path / "fp32"  # onnx refuses the cache's hard-linked external data
    shutil.copytree(tiny["onnx"].parent, copy)
    fp32 = onnx.load(str(copy / tiny["onnx"].name))
    ranges = percentile_ranges(fp32, sorted(quantizers), cal.feeds, DEFAULT_PERCENTILE)
    inits = {i.name: i for i in model.graph.initializer}
    readers = {n.input[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    for tensor, nodes in quantizers.items():
        scale = float(numpy_helper.to_array(inits[nodes[0].input[1]]))
        assert scale == pytest.approx(ranges[tensor] / 127.0, rel=1e-5), tensor
        dq = readers[nodes[0].output[0]]  # its DequantizeLinear uses the same scale
        assert float(numpy_helper.to_array(inits[dq.input[1]])) == pytest.approx(scale)
    assert all(r.passed for r in outcome.verification)


def test_int8_mse_calibration_sets_least_error_ranges(tiny: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """--calibration-method mse: trtpack's own Q/DQ with each measured activation's scale
    set to the least-squared-error range of its calibration histogram / 127, below the max
    model's range somewhere and never above it; the build passes; the served model's scales
    differ from ``max``'s."""
    from onnx import numpy_helper

    from trtpack.precision.calibration.data import load_calibration
    from trtpack.precision.int8.activation_ranges import activation_quantizers, mse_ranges
    from trtpack.precision.int8.placement import fixed_ranges

    npz = tiny_npz(tmp_path / "calibration.npz")

    def scales(method: str) -> tuple[object, dict[str, float], onnx.ModelProto]:
        plan = build_options("tiny-bert", "int8", tmp_path / f"out-{method}", TINY_PROFILES,
                             calibration=npz, calibration_method=method)
        outcome, _, _ = run_stage(plan, tiny, tmp_path / f"stage-{method}")
        assert all(r.passed for r in outcome.verification), method
        assert outcome.metrics["calibration"]["method"] == method
        model = onnx.load(str(outcome.artifacts["precision_onnx"]))
        inits = {i.name: i for i in model.graph.initializer}
        return plan, {t: float(numpy_helper.to_array(inits[nodes[0].input[1]]))
                      for t, nodes in activation_quantizers(model).items()}, model

    plan, mse, model = scales("mse")
    _, by_max, _ = scales("max")
    assert set(mse) == set(by_max) and mse
    copy = tmp_path / "fp32"  # onnx refuses the cache's hard-linked external data
    shutil.copytree(tiny["onnx"].parent, copy)
    fp32 = onnx.load(str(copy / tiny["onnx"].name))
    fixed = fixed_ranges(fp32.graph, mse)  # none here: tiny-bert's attention stays FP32
    for tensor in fixed:
        assert mse[tensor] == by_max[tensor] == pytest.approx(1 / 127)
    cal = load_calibration(plan.recipe, plan.profiles, npz, tokenizer=None,
                           max_samples=plan.recipe.precision_options.int8
                           .max_calibration_samples, seed=plan.seed)
    measured = sorted(t for t in mse if t not in fixed)
    ranges = mse_ranges(fp32, measured, cal.feeds)  # the same histograms, another session
    for tensor in measured:
        assert mse[tensor] == pytest.approx(ranges[tensor] / 127.0, rel=1e-4), tensor
        assert mse[tensor] <= by_max[tensor] * (1 + 1e-6), tensor
    assert any(mse[t] < 0.9 * by_max[t] for t in measured)  # a clip well below max
    readers = {n.input[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    inits = {i.name: i for i in model.graph.initializer}
    for tensor, nodes in activation_quantizers(model).items():
        dq = readers[nodes[0].output[0]]  # its DequantizeLinear uses the same scale
        assert float(numpy_helper.to_array(inits[dq.input[1]])) == pytest.approx(mse[tensor])


def test_right_padding_leaves_real_tokens_outputs_fp32_and_int8(tiny: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """Why a tight batch may be shorter than the profile minimum (``tight_floor``): with
    padding on the right, the exported graph's outputs at the real tokens are the same
    whether a batch is padded to 16 tokens or to its longest sample (7), in the FP32 model
    and in its INT8 Q/DQ model alike, and so is every sample's pooled cosine."""
    from trtpack.precision.int8.qdq import quantize

    source = prepare_source(tiny["onnx"], tmp_path / "source")
    rng = np.random.default_rng(5)
    lengths = [3, 5, 7]
    mask = (np.arange(7)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    tight = {"input_ids": rng.integers(5, 1000, (3, 7)) * mask, "attention_mask": mask,
             "token_type_ids": np.zeros((3, 7), dtype=np.int64)}
    padded = {k: np.pad(v, ((0, 0), (0, 9))) for k, v in tight.items()}  # padding id 0
    calibration = [{"input_ids": rng.integers(5, 1000, (4, 16)),
                    "attention_mask": np.ones((4, 16), dtype=np.int64),
                    "token_type_ids": np.zeros((4, 16), dtype=np.int64)} for _ in range(3)]
    (tmp_path / "int8").mkdir()
    int8 = tmp_path / "int8" / "model.onnx"
    quantize(source, int8, ["MatMul", "Gemm"], [], [], calibration)
    reference = run_model(source, [padded])[0]["last_hidden_state"]
    for model in (source, int8):
        out_padded = run_model(model, [padded])[0]["last_hidden_state"]
        out_tight = run_model(model, [tight])[0]["last_hidden_state"]
        for r, n in enumerate(lengths):
            np.testing.assert_allclose(out_tight[r, :n], out_padded[r, :n], rtol=0, atol=1e-5)
        np.testing.assert_allclose(
            pooled_cosine_per_sample(reference[:, :7], out_tight, tight, "attention_mask"),
            pooled_cosine_per_sample(reference, out_padded, padded, "attention_mask"),
            rtol=0, atol=1e-6)
    assert not np.allclose(run_model(int8, [tight])[0]["last_hidden_state"],
                           run_model(source, [tight])[0]["last_hidden_state"], atol=1e-5)


def test_modelopt_jobs_are_typed_and_round_trip_through_json() -> None:
    from trtpack.precision.modelopt_jobs import Fp16Job, Int8Job

    int8 = ModelOptJob("int8", "in.onnx", "out.onnx", "result.json", int8=Int8Job(
        "calibration.npz", nodes_to_exclude=["MatMul_1"], op_types_to_quantize=["MatMul"]))
    fp16 = ModelOptJob("fp16", "in.onnx", fp16=Fp16Job(keep_io_types=False,
                                                       reference_inputs="ref.npz"))
    for job in (int8, fp16):
        assert ModelOptJob.from_json(job.to_json()) == job
    assert json.loads(int8.to_json())["int8"]["nodes_to_exclude"] == ["MatMul_1"]

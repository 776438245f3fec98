"""What quantizing every MatMul costs (issue 24): the INT8 CPU form a build serves against
ONNX Runtime's dynamic quantization of all weight MatMuls, as Optimum's dynamic INT8 does,
with and without SmoothQuant first, and with the served form's outlier channels kept FP32.

    trtpack build minilm --target cpu --precision int8 --out /tmp/b_int8
    python benchmarks/cpu_int8_everything.py /tmp/b_int8 \
        benchmarks/results/cpu-int8-everything.json

Each variant is the build's simplified FP32 graph (SmoothQuant-smoothed on the first 128
lines of trtpack's default calibration text when an alpha is given), fused by the CPU model
stage's fusion, then quantized with the stage's own settings and no layer kept in FP32.
Accuracy: every line of data/calibration/heldout.txt and of benchmarks/unseen/*.txt alone
(no padding), mean-pooled, cosine against the build's fused FP32 CPU model; the worst per
set. Text models with an attention mask only (minilm-like sentence encoders).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SETS = [REPO / "data" / "calibration" / "heldout.txt",
        *sorted((REPO / "benchmarks" / "unseen").glob("*.txt"))]
CALIBRATION = REPO / "trtpack" / "data" / "calibration-text.txt"
ALPHAS: tuple[float | None, ...] = (None, 0.5, 0.8)


def lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    import onnx
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from trtpack.onnx_tools.files import save_model
    from trtpack.precision.cpu.fusion import cpu_graph
    from trtpack.precision.cpu.int8 import (
        EVERY_LAYER,
        EVERY_LAYER_SMOOTHED,
        make_cpu_int8,
        quantize_cpu_graph,
        weight_matmul_share,
    )
    from trtpack.precision.smoothquant import smooth_model
    from trtpack.verify.sample_metrics import pooled_cosine_per_sample

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="an INT8 --target cpu build folder")
    parser.add_argument("json", type=Path, help="where the results go")
    args = parser.parse_args()
    build: Path = args.build
    config = json.loads((build / "artifacts" / "export" / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(build / "artifacts" / "export" / "tokenizer"))

    def session(path: Path) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    reference = session(build / "artifacts" / "cpu_model" / "fp32" / "model.onnx")
    names = {i.name for i in reference.get_inputs()}

    def feed(texts: list[str]) -> dict[str, np.ndarray]:
        encoded = tokenizer(texts, padding=True, truncation=True, max_length=128,
                            return_tensors="np")
        return {k: v.astype(np.int64) for k, v in encoded.items() if k in names}

    def worst_per_set(path: Path) -> dict[str, float]:
        candidate = session(path)
        result = {}
        for text_file in SETS:
            worst = 1.0
            for text in lines(text_file):
                inputs = feed([text])
                (cosine,) = pooled_cosine_per_sample(reference.run(None, inputs)[0],
                                                     candidate.run(None, inputs)[0], inputs,
                                                     "attention_mask")
                worst = min(worst, float(cosine))
            result[text_file.stem] = round(worst, 4)
        return result

    calibration = lines(CALIBRATION)[:128]
    feeds = [feed(calibration[i:i + 8]) for i in range(0, len(calibration), 8)]
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="int8-everything-"))
    try:
        # a copy: onnx refuses a sidecar with several hard links (the stage cache's)
        source = work / "source" / "model.onnx"
        source.parent.mkdir()
        for name in ("model.onnx", "model.onnx.data"):
            if (build / "artifacts" / "simplify" / name).is_file():
                shutil.copy2(build / "artifacts" / "simplify" / name, source.parent / name)
        served = build / "artifacts" / "cpu_model" / "int8" / "model.onnx"
        variants: list[tuple[str, Path]] = [("served CPU INT8 form", served)]
        for alpha in ALPHAS:
            folder = work / f"alpha-{alpha}"
            smoothed = folder / "smoothed" / "model.onnx"
            smoothed.parent.mkdir(parents=True)
            model = onnx.load(str(source))
            if alpha is not None:
                smooth_model(model, feeds, alpha)
            save_model(model, smoothed)
            graph = cpu_graph(smoothed, config_model_type=config.get("model_type"),
                              num_heads=config.get("num_attention_heads"),
                              hidden_size=config.get("hidden_size"),
                              mask_input="attention_mask")
            fused = folder / "fused" / "model.onnx"
            fused.parent.mkdir()
            save_model(graph.model, fused)
            quantized = folder / "int8.onnx"
            quantize_cpu_graph(fused, quantized, [])
            label = "every MatMul" + (f", SmoothQuant alpha {alpha}" if alpha else
                                      ", no SmoothQuant")
            variants.append((label, quantized))
            # the served form's recipe: outlier channels FP32, LayerNorm outputs smoothed
            shape = {"config_model_type": config.get("model_type"),
                     "num_heads": config.get("num_attention_heads"),
                     "hidden_size": config.get("hidden_size"), "mask_input": "attention_mask"}
            form = make_cpu_int8(EVERY_LAYER, source, folder / "outliers",
                                 folder / "outliers.onnx", shape, feeds, alpha,
                                 EVERY_LAYER_SMOOTHED, [])
            variants.append(("every MatMul, outlier channels FP32, SmoothQuant on LayerNorm "
                             "outputs " + (f"alpha {alpha}" if alpha else "off"), form.path))
        for label, path in variants:
            done, total = weight_matmul_share(onnx.load(str(path), load_external_data=False))
            row = {"variant": label, "int8_matmuls": f"{done}/{total}",
                   "worst": worst_per_set(path)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.json.write_text(json.dumps({"build": str(build), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

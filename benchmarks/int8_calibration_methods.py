"""INT8 activation calibration methods side by side on decision data: one build per
method of the same recipe and options, sharing one stage cache (only the precision stage
reruns after the first), each with its wall time, CPU-seconds and peak, and from its
report.json the precision stage's time and peak, the MatMul/Gemm INT8 share, the kept
layers and the worst sample (1 - cosine) of each DECISION split: calibration, prefix,
search, check. The held-out split is not printed unless asked (``--show-holdout``): a
method is chosen on decision data, the held-out figure read after the choice.

    python benchmarks/int8_calibration_methods.py bert-large --random-weights \\
        --profile 1x128:16x128:128x128                       # max vs mse, ~11 min quiet
    python benchmarks/int8_calibration_methods.py minilm --heldout-text   # + heldout.txt

``--heldout-text`` (minilm only) also compares each served model with FP32
sentence-transformers on data/calibration/heldout.txt (text no build option reads; a
decision set of earlier INT8 studies): the worst sentence's 1 - cosine.
Every build is ``--precision int8 --target g5 --no-engine`` (the Q/DQ model, no TensorRT).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, run_measured

DECISION_SPLITS = ("calibration", "prefix", "search", "check")


def figures(report: dict[str, Any], show_holdout: bool) -> dict[str, Any]:
    """A build's decision figures from its report.json."""
    stages = {s["name"]: s for s in report["stages"]}
    metrics = stages["precision"]["metrics"]
    low = metrics["low_precision"]
    splits = metrics["splits"]
    shown = [*DECISION_SPLITS, *(["holdout"] if show_holdout else [])]
    worst = {n: round(1.0 - splits[n]["worst"], 8) for n in shown if n in splits}
    decision = [worst[n] for n in DECISION_SPLITS if n in worst]
    return {"status": report["status"], "peak_mb": round(report["peak_memory_mb"] or 0),
            "precision_seconds": round(stages["precision"]["seconds"] or 0, 1),
            "precision_peak_mb": round(stages["precision"]["peak_memory_mb"] or 0),
            "cached_stages": [n for n, s in stages.items() if s.get("cached")],
            "matmul_gemm_int8": [low["matmul_gemm_low_precision"], low["matmul_gemm_nodes"]],
            "kept_layers": len(metrics.get("kept_layers") or []),
            "worst_error": worst, "decision_worst_error": max(decision) if decision else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--methods", default="max,mse")
    parser.add_argument("--heldout-text", action="store_true")
    parser.add_argument("--show-holdout", action="store_true")
    parser.add_argument("--json", type=Path)
    args, build_args = parser.parse_known_args()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="trtpack-int8-methods-") as tmp:
        cache = Path(tmp) / "cache"
        for method in args.methods.split(","):
            out = Path(tmp) / f"out-{method}"
            cmd = [sys.executable, "-m", "trtpack.cli", "build", args.recipe, "--precision",
                   "int8", "--target", "g5", "--no-engine", "--calibration-method", method,
                   "--cache-dir", str(cache), "--out", str(out), "--json", *build_args]
            m = run_measured(cmd)
            failed = out.with_name(out.name + ".failed") / "report.json"
            if m.returncode == 1 and failed.is_file():  # an accuracy gate failed: its figures
                report = json.loads(failed.read_text())
            elif m.returncode != 0:
                print(m.stderr[-3000:], file=sys.stderr)
                return 1
            else:
                report = json.loads(m.stdout)
            row = {"seconds": round(m.seconds, 1), "cpu_seconds": m.cpu_seconds,
                   "process_peak_mb": round(m.peak_mb), "exit": m.returncode,
                   **figures(report, args.show_holdout)}
            if args.heldout_text and m.returncode == 0:
                from int8_minilm import transformers_cosines

                served = next(out.glob("model_repository/*/1/model.onnx"))
                _, cosines = transformers_cosines(served)
                row["heldout_text_worst_error"] = round(1.0 - float(cosines.min()), 8)
            rows[method] = row
            print(method, json.dumps(row), flush=True)
            for path in out.rglob("*"):  # GBs on bert-large: gone before the next build
                if path.is_file() and path.suffix in (".onnx", ".data", ".bin"):
                    path.unlink()
    result = {"machine": machine(), "recipe": args.recipe, "build_args": build_args,
              "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

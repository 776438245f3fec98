"""Issue 49's design card at INT8, checked line by line: one build of

    trtpack build bert-large --random-weights --precision int8 --target g5 --no-engine \
        --profile 1x128:16x128:128x128 --no-cache

(its own cache folder and output folder in a temporary directory), its wall time and the
peak of its process tree sampled here, and from its report.json: the precision stage's and
the whole build's peak, the MatMul/Gemm INT8 share and the held-out worst sample. Prints
each "Done when" figure against its bound and writes them as JSON.

    python benchmarks/int8_design_card.py --json /tmp/design-card-int8.json
    python benchmarks/int8_design_card.py --quantizer modelopt   # ModelOpt's path: ~19 GB

About 7 minutes on a quiet 2-core machine (trtpack's quantizer); the bounds are the issue's:
exit 0, precision stage and whole build <= 6 GB, every MatMul/Gemm INT8, held-out worst
>= 0.9988, wall <= 1.2 x 380 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, run_measured

ROOT = Path(__file__).resolve().parents[1]
CARD = ["build", "bert-large", "--random-weights", "--precision", "int8", "--target", "g5",
        "--no-engine", "--profile", "1x128:16x128:128x128", "--no-cache"]
PEAK_MB = 6 * 1024  # the 6 GB, as report.json's MB (MiB)
HELD_OUT_WORST = 0.9988
WALL_S = 1.2 * 380


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """What issue 49's lines read from a build's report.json."""
    stages = {s["name"]: s for s in report["stages"]}
    precision = stages["precision"]
    metrics = precision["metrics"]
    low = metrics["low_precision"]
    held = metrics["splits"]["holdout"]
    return {"status": report["status"], "total_seconds": round(report["total_seconds"], 1),
            "peak_mb": round(report["peak_memory_mb"]),
            "precision_seconds": round(precision["seconds"], 1),
            "precision_peak_mb": round(precision["peak_memory_mb"]),
            "quantizer": metrics.get("quantizer"),
            "matmul_gemm_int8": [low["matmul_gemm_low_precision"], low["matmul_gemm_nodes"]],
            "held_out_worst": held["worst"], "held_out_worst_text": held.get("worst_text"),
            # what calibrated it (the recipe's auto: max or mse, chosen on the search split)
            "calibration_method": metrics["calibration"].get("method"),
            "calibration_choice": metrics["calibration"].get("choice"),
            "stages": {n: [round(s["seconds"], 1), round(s["peak_memory_mb"] or 0)]
                       for n, s in stages.items() if s["status"] != "skipped"}}


def checks(exit_code: int, wall: float, found: dict[str, Any]) -> dict[str, bool]:
    int8, nodes = found["matmul_gemm_int8"]
    return {"exit 0": exit_code == 0,
            "precision stage <= 6 GB": found["precision_peak_mb"] <= PEAK_MB,
            "whole build <= 6 GB": found["peak_mb"] <= PEAK_MB,
            "every MatMul/Gemm INT8": int8 == nodes > 0,
            "held-out worst >= 0.9988": found["held_out_worst"] >= HELD_OUT_WORST,
            "wall <= 1.2 x 380 s": wall <= WALL_S}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantizer", choices=("trtpack", "modelopt"), default="trtpack")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env: dict[str, str | None] = {
        "PYTHONPATH": str(ROOT),
        "TRTPACK_INT8_QUANTIZER": "modelopt" if args.quantizer == "modelopt" else None}
    at_start = machine()
    with tempfile.TemporaryDirectory(prefix="trtpack-card-int8-") as tmp:
        out = Path(tmp) / "out"
        measured = run_measured([sys.executable, "-m", "trtpack.cli", *CARD, "--cache-dir",
                                 str(Path(tmp) / "cache"), "--out", str(out)], env=env)
        report_path = out / "report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else None
    result: dict[str, Any] = {
        "command": "trtpack " + " ".join(CARD), "quantizer": args.quantizer,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": at_start, "exit": measured.returncode,
        "wall_seconds": round(measured.seconds, 1), "sampled_peak_mb": round(measured.peak_mb)}
    if report is None:
        result["error"] = measured.stderr.strip().splitlines()[-3:]
    else:
        result.update(figures(report))
        result["checks"] = checks(measured.returncode, measured.seconds, result)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

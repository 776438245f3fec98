"""The memory pre-check's estimate (``trtpack.pipeline.memory_check``) against the peak each
stage measured (trtpack's report: the process tree's RSS, sampled every 50 ms), for three
models: tiny-bert, minilm (two profiles) and a small convolutional ONNX model; and how long
``trtpack build minilm --profile 1x8:4x32:100000x128`` takes to be refused.

    python benchmarks/memory_estimate.py --json benchmarks/results/memory-estimate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _measure import machine, run_measured

from trtpack.api import BuildRequest, resolve_options
from trtpack.pipeline.memory_check import estimate_corners
from trtpack.testing.models import conv_onnx

MB = 2**20
CASES = (  # label, model (conv: the ONNX file made here), profile
    ("tiny-bert", "tiny-bert", "1x4:2x8:4x16"),
    ("minilm", "minilm", "1x8:4x32:8x128"),
    ("minilm", "minilm", "1x8:8x128:32x256"),
    ("conv ONNX (32/64 ch)", "conv", "1x3x64x64:4x3x128x128:16x3x256x256"),
)
ABSURD = ["build", "minilm", "--target", "cpu", "--profile", "1x8:4x32:100000x128"]


def trtpack(*args: str) -> list[str]:
    return [sys.executable, "-m", "trtpack.cli", *args]


def case_rows(label: str, model: str, profile: str, tmp: Path) -> list[dict[str, object]]:
    cache, out = tmp / "cache", tmp / f"out-{label.split()[0]}-{profile}"
    measured = run_measured(trtpack("build", model, "--target", "cpu", "--profile", profile,
                                    "--cache-dir", str(cache), "--out", str(out), "--json"))
    report_file = out / "report.json" if out.is_dir() else out.with_name(out.name + ".failed") \
        / "report.json"
    report = json.loads(report_file.read_text())
    options, _ = resolve_options(BuildRequest(model, profiles=[profile], target="cpu"))
    estimates = estimate_corners(options)
    rows = []
    for stage in report["stages"]:
        guesses = [e.stages[stage["name"]] for e in estimates if stage["name"] in e.stages]
        if not guesses or stage.get("peak_memory_mb") is None:
            continue
        estimate = max(guesses) / MB
        rows.append({"model": label, "profile": profile, "stage": stage["name"],
                     "estimate_mb": round(estimate), "measured_mb": round(stage["peak_memory_mb"]),
                     "ratio": round(estimate / stage["peak_memory_mb"], 2),
                     "build_exit": measured.returncode, "status": report.get("status")})
    return rows


def refusal_seconds(tmp: Path, runs: int = 3) -> list[float]:
    seconds = []
    for k in range(runs):
        started = time.perf_counter()
        result = run_measured(trtpack(*ABSURD, "--out", str(tmp / f"absurd{k}"),
                                      "--cache-dir", str(tmp / "absurd-cache")))
        seconds.append(time.perf_counter() - started)
        assert result.returncode == 2, result.stderr
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trtpack-memory-") as name:
        tmp = Path(name)
        conv = str(conv_onnx(tmp / "conv.onnx", channels=(32, 64)))
        rows = []
        for label, model, profile in CASES:
            rows += case_rows(label, conv if model == "conv" else model, profile, tmp)
        refused = refusal_seconds(tmp)
    print("| model | profile | stage | estimate MB | measured peak MB | estimate / measured |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['profile']} | {r['stage']} | {r['estimate_mb']:,} | "
              f"{r['measured_mb']:,} | {r['ratio']} |")
    print(f"\nrefusal of {' '.join(ABSURD[1:])}: "
          f"{', '.join(f'{s:.1f}' for s in refused)} s (median {statistics.median(refused):.1f})")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows,
                                         "refusal_seconds": refused}, indent=1) + "\n")


if __name__ == "__main__":
    main()

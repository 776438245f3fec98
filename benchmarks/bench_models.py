"""`trtpack bench` for minilm (real weights) and bert-base (random weights), fp32/fp16/int8,
in one run on this machine:

    python benchmarks/bench_models.py benchmarks/results/bench-models.json [--seconds 3]

Each variant is built for `--target cpu` (int8 calibrated on data/calibration/sentences.txt;
the builds of one model share a fresh stage cache), then `trtpack bench OUT` times, at every
profile corner and on the inputs the build verified on (real tokenized text), the served model
in ONNX Runtime, the FP32 ONNX in ONNX Runtime and PyTorch eager, with warm-up and a fixed time
budget per row. Prints a markdown table (p50 latency per corner and the served model's
speed-up against PyTorch eager) and writes every benchmark section, the machine and the load
average before and after to the JSON path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "data" / "calibration" / "sentences.txt"
MODELS = ("minilm", "bert-base")
PRECISIONS = ("fp32", "fp16", "int8")


def trtpack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtpack.cli", *args], capture_output=True,
                          text=True, check=False)


def build_and_bench(model: str, precision: str, work: Path, cache: Path, seconds: float,
                    threads: int | None) -> dict[str, Any]:
    out = work / f"{model}-{precision}"
    # fp16 is checked for a later GPU build: --target cpu serves FP32 and skips it
    target = ["g5", "--no-engine"] if precision == "fp16" else ["cpu"]
    args = ["build", model, "--target", *target, "--precision", precision, "--out", str(out),
            "--cache-dir", str(cache), "--json"]
    if model != "minilm":
        args.append("--random-weights")
    if precision == "int8":
        args += ["--calibration", str(CALIBRATION)]
    started = time.perf_counter()
    built = trtpack(*args)
    if built.returncode != 0:
        print(f"[{model} {precision}] build failed (exit {built.returncode}):\n"
              f"{built.stderr[-3000:]}", file=sys.stderr, flush=True)
        return {"failed": f"build exit {built.returncode}"}
    build_seconds = time.perf_counter() - started
    bench_args = ["bench", str(out), "--seconds", str(seconds)]
    if threads:
        bench_args += ["--threads", str(threads)]
    benched = trtpack(*bench_args)
    if benched.returncode != 0:
        print(f"[{model} {precision}] bench failed:\n{benched.stderr[-3000:]}", file=sys.stderr,
              flush=True)
        return {"failed": f"bench exit {benched.returncode}"}
    report = json.loads((out / "report.json").read_text())
    print(f"[{model} {precision}] built in {build_seconds:.0f} s, benched", flush=True)
    return {"build_seconds": round(build_seconds, 1), "benchmark": report["benchmark"],
            "profiles": report["profiles"]}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| model | precision | corner | served p50 ms | FP32 ONNX p50 ms | "
             "PyTorch p50 ms | served vs PyTorch |", "|---|---|---|---:|---:|---:|---:|"]
    for key, result in results.items():
        model, precision = key.split(":")
        if "failed" in result:
            lines.append(f"| {model} | {precision} | {result['failed']} | | | | |")
            continue
        rows = result["benchmark"]["rows"]
        corners = list(dict.fromkeys((r["profile"], r["corner"], r["shapes"]) for r in rows))
        for profile, corner, shapes in corners:
            at = {r["runtime"]: r for r in rows
                  if (r["profile"], r["corner"]) == (profile, corner)}
            shape = shapes.split(",")[0].split("=", 1)[-1]

            def p50(runtime: str, at: dict[str, Any] = at) -> str:
                r = at.get(runtime)
                return f"{r['p50_ms']:.1f}" if r and r["status"] == "ok" else "–"

            served = at.get("served") or {}
            speed = served.get("speedup_vs_pytorch")
            lines.append(f"| {model} | {precision} | {corner} {shape} | {p50('served')} | "
                         f"{p50('onnx-fp32')} | {p50('pytorch')} | "
                         f"{'–' if speed is None else f'{speed:.2f}×'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", type=Path)
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per row")
    parser.add_argument("--threads", type=int, default=None, help="default: all cores")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="trtpack-bench-models-") as tmp:
        for model in args.models.split(","):
            cache = Path(tmp) / f"cache-{model}"
            for precision in args.precisions.split(","):
                results[f"{model}:{precision}"] = build_and_bench(
                    model, precision, Path(tmp), cache, args.seconds, args.threads)
    table = markdown(results)
    data = {"command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "seconds_total": round(time.perf_counter() - started, 1),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "results": results, "table": table}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(data, indent=1) + "\n")
    machine = next((r["benchmark"]["machine"] for r in results.values() if "benchmark" in r),
                   {})
    print(f"\n{machine.get('cpu')}, {machine.get('logical_cores')} cores; load average before "
          f"{data['load_average_before']}, after {data['load_average_after']}; "
          f"{data['seconds_total']:.0f} s in all\n")
    print(table)


if __name__ == "__main__":
    main()

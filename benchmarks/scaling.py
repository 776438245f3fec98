"""How a build's time and peak memory grow with the model: each stage's wall time and peak
resident memory (trtpack's report: the stage's process tree, sampled every 50 ms) against the
model's weights plus its largest activations (``resources.activation_bytes``, the one
definition the memory pre-check uses, from ``pipeline.memory_check.estimate_corners``).

    python benchmarks/scaling.py --models tiny-bert,minilm --precisions fp32,fp16 \
        --targets cpu,g5 --json benchmarks/results/scaling.json

Runs ``trtpack build MODEL --precision P --target T --no-cache`` (``g5`` with
``--no-engine``: the ONNX a GPU build serves) with a fresh cache folder per build, one build
at a time, for every combination asked; ``--random-weights`` for every recipe except minilm
(whose real weights ship in a package). Runnable in pieces: rows are merged into ``--json``
by (model, precision, target, profile), so the grid can be filled over several sessions;
the Markdown table printed is of every row in the file. The budget: no stage's peak above
``BUDGET`` x (weights + activations) for a model over ``LARGE_MODEL_BYTES``.
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

MODELS = ("tiny-bert", "minilm", "bert-base", "bert-large", "big-embedding")
REAL_WEIGHTS = ("minilm",)  # recipes built with their own weights (offline)
BUDGET = 3.0  # a stage's peak, in (weights + activations)
LARGE_MODEL_BYTES = 300 * 10**6  # the budget applies to models over this
MB = 2**20


def footprint(model: str, precision: str, target: str, profile: str | None
              ) -> dict[str, int]:
    """The model's weights and its largest activations over the build's corners (the
    pre-check's estimate: ONNX Runtime's run, attention as separate operations)."""
    from trtpack.api import BuildRequest, resolve_options
    from trtpack.pipeline.memory_check import estimate_corners

    options, _ = resolve_options(BuildRequest(
        model, precision=precision, target=target, build_engine=target == "cpu",
        random_weights=model not in REAL_WEIGHTS, profiles=[profile] if profile else []))
    corners = estimate_corners(options)
    return {"weights": max(c.weights for c in corners),
            "activations": max(max(c.activations.values()) for c in corners)}


def build_row(model: str, precision: str, target: str, profile: str | None,
              tmp: Path) -> dict[str, Any]:
    out = tmp / f"out-{model}-{precision}-{target}"
    cmd = [sys.executable, "-m", "trtpack.cli", "build", model, "--precision", precision,
           "--target", target, "--no-cache", "--cache-dir", str(tmp / f"cache-{out.name}"),
           "--out", str(out), "--json",
           *(["--no-engine"] if target != "cpu" else []),
           *(["--random-weights"] if model not in REAL_WEIGHTS else []),
           *(["--profile", profile] if profile else [])]
    measured = run_measured(cmd)
    row: dict[str, Any] = {
        "model": model, "precision": precision, "target": target, "profile": profile or "",
        "command": " ".join(["trtpack", *cmd[3:]]).replace(str(tmp), "$TMP"),
        "exit": measured.returncode, "seconds": round(measured.seconds, 1),
        "cpu_seconds": measured.cpu_seconds, "peak_mb": round(measured.peak_mb),
        "load_average": machine()["load_average_at_start"],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if measured.returncode != 0:
        lines = measured.stderr.strip().splitlines()
        row["error"] = [line for line in lines if line.startswith("error:")][:1] \
            or lines[-1:] or ["(no output)"]
        return row
    report = json.loads(measured.stdout)
    row.update(footprint(model, precision, target, profile))
    base = row["weights"] + row["activations"]
    row["stages"] = [
        {"name": s["name"], "seconds": round(s["seconds"], 1),
         "peak_mb": round(s["peak_memory_mb"]) if s.get("peak_memory_mb") else None,
         "ratio": round(s["peak_memory_mb"] * MB / base, 2) if s.get("peak_memory_mb") else None}
        for s in report["stages"] if s["status"] != "skipped"]
    precision_stage = next((s for s in report["stages"] if s["name"] == "precision"), None)
    metrics = (precision_stage or {}).get("metrics") or {}
    if metrics.get("precision") == "int8":  # what the INT8 model is, beside what it cost
        low = metrics["low_precision"]
        row["int8"] = {"quantizer": metrics.get("quantizer"),
                       "matmul_gemm_int8": low["matmul_gemm_low_precision"],
                       "matmul_gemm": low["matmul_gemm_nodes"],
                       "held_out_worst": (metrics["splits"].get("holdout") or {}).get("worst"),
                       "calibration_samples": metrics["calibration"]["samples"]}
    row["worst_ratio"] = max((s["ratio"] for s in row["stages"] if s["ratio"] is not None),
                             default=None)
    row["within_budget"] = None if row["weights"] <= LARGE_MODEL_BYTES else \
        bool(row["worst_ratio"] is not None and row["worst_ratio"] <= BUDGET)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | precision | target | weights MB | activations MB | stage: s / peak MB "
             "(peak ÷ (weights + activations)) | whole: s / CPU s / peak MB | load |",
             "|---|---|---|---:|---:|---|---|---:|"]
    for r in rows:
        if r.get("exit"):
            lines.append(f"| {r['model']} | {r['precision']} | {r['target']} | | | exit "
                         f"{r['exit']}: {' '.join(r.get('error', []))[:120]} | | |")
            continue
        stages = "; ".join(f"{s['name']} {s['seconds']:.1f} / {s['peak_mb'] or 0:,} "
                           f"({s['ratio']:.1f}×)" if s["ratio"] is not None
                           else f"{s['name']} {s['seconds']:.1f}" for s in r["stages"])
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['target']} | {r['weights'] / MB:,.0f} | "
            f"{r['activations'] / MB:,.0f} | {stages} | {r['seconds']:.1f} / "
            f"{r['cpu_seconds']:.1f} / {r['peak_mb']:,} | {r['load_average']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--targets", default="cpu,g5",
                        help="cpu, and GPU targets (built with --no-engine)")
    parser.add_argument("--profile", default="", help="one --profile for every build "
                        "(empty: each recipe's own)")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/scaling.json"))
    parser.add_argument("--keep", type=Path, help="move each build folder here (its "
                        "report.json and logs) instead of removing it")
    args = parser.parse_args()
    existing = json.loads(args.json.read_text()) if args.json.is_file() else {"rows": []}
    rows: list[dict[str, Any]] = existing["rows"]
    with tempfile.TemporaryDirectory(prefix="trtpack-scaling-") as name:
        for model in args.models.split(","):
            for precision in args.precisions.split(","):
                for target in args.targets.split(","):
                    row = build_row(model, precision, target, args.profile or None, Path(name))
                    key = (model, precision, target, row["profile"])
                    rows = [r for r in rows if (r["model"], r["precision"], r["target"],
                                                r["profile"]) != key] + [row]
                    print(markdown([row]).splitlines()[-1], flush=True)
                    if "int8" in row:
                        print(f"  int8: {json.dumps(row['int8'])}", flush=True)
                    if args.keep is not None:
                        import shutil

                        args.keep.mkdir(parents=True, exist_ok=True)
                        for folder in Path(name).glob("out-*"):
                            shutil.rmtree(args.keep / folder.name, ignore_errors=True)
                            shutil.move(str(folder), str(args.keep / folder.name))
                    for leftover in Path(name).iterdir():  # one build's files at a time
                        if leftover.is_dir():
                            import shutil

                            shutil.rmtree(leftover, ignore_errors=True)
    order = {m: k for k, m in enumerate(MODELS)}
    rows.sort(key=lambda r: (order.get(r["model"], 99), r["precision"], r["target"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine(), "budget": BUDGET,
                                     "large_model_bytes": LARGE_MODEL_BYTES, "rows": rows},
                                    indent=2))
    print()
    print(markdown(rows))
    over = [r for r in rows if r.get("within_budget") is False]
    for r in over:
        print(f"over budget: {r['model']} {r['precision']} {r['target']} "
              f"(worst stage {r['worst_ratio']}x)")


if __name__ == "__main__":
    main()

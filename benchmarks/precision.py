"""FP32 vs FP16 vs INT8 for minilm (real weights) and bert-base (random weights), one run.

    python benchmarks/precision.py benchmarks/results/precision.json

For each model, three `trtpack build` (fp32 and int8 calibrated on
data/calibration/sentences.txt for `--target cpu`, fp16 for `--target g5 --no-engine`) share
a fresh stage cache, so the precision stage really runs. Then, in this process, with ONNX
Runtime on the CPU:

- accuracy: mean-pooled embedding cosine of each variant against the FP32 model on
  data/calibration/heldout.txt (sentences no build has seen), min and mean;
- share of MatMul/Gemm nodes in low precision, and the nodes the fallback kept in high;
- conversion time: the precision stage (ModelOpt runs, fallback search, verification);
- latency: median of repeated runs at the profile's opt and max shapes, real tokenized text.

Prints a markdown table and writes everything (reports included) to the JSON path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, run_measured

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = REPO / "data" / "calibration" / "sentences.txt"
HELDOUT = REPO / "data" / "calibration" / "heldout.txt"
PRECISIONS = ("fp32", "fp16", "int8")


def build(model: str, precision: str, out: Path, cache: Path) -> dict[str, Any]:
    """One build's wall time, peak and report; ``failed`` (and stderr echoed) if it failed."""
    # fp16 is checked for a later GPU build: --target cpu serves FP32 and skips it
    target = ["g5", "--no-engine"] if precision == "fp16" else ["cpu"]
    cmd = [sys.executable, "-m", "trtpack.cli", "build", model, "--target", *target,
           "--precision", precision, "--out", str(out), "--cache-dir", str(cache), "--json"]
    if model != "minilm":
        cmd.append("--random-weights")
    if precision == "int8":
        cmd += ["--calibration", str(CALIBRATION)]
    m = run_measured(cmd)
    if m.returncode != 0:
        print(f"[{model}] {precision} build failed (exit {m.returncode}):\n{m.stderr[-4000:]}",
              file=sys.stderr, flush=True)
        return {"failed": f"exit {m.returncode}: {m.stderr.strip().splitlines()[-1:]}",
                "seconds": m.seconds, "peak_mb": m.peak_mb}
    report: dict[str, Any] = json.loads(m.stdout)
    return {"seconds": m.seconds, "peak_mb": m.peak_mb, "report": report}


def _tokenizer(out: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(out / "artifacts" / "export" / "tokenizer"))


def _served(out: Path, model: str) -> Path:
    return out / "model_repository" / model / "1" / "model.onnx"


def heldout_cosines(tokenizer: Any, fp32: Any, variant: Any) -> np.ndarray:
    from trtpack.verify.sample_metrics import pooled_cosine_per_sample

    sentences = [s.strip() for s in HELDOUT.read_text().splitlines() if s.strip()]
    found = []
    for start in range(0, len(sentences), 8):
        enc = tokenizer(sentences[start:start + 8], padding=True, truncation=True,
                        max_length=128, return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in enc.items()}
        (a,) = fp32.run(None, feed)
        (b,) = variant.run(None, feed)
        found.append(pooled_cosine_per_sample(a, b, feed, "attention_mask"))
    return np.concatenate(found)


def latency_ms(session: Any, feed: dict[str, np.ndarray], min_runs: int = 10,
               min_seconds: float = 3.0) -> float:
    for _ in range(3):
        session.run(None, feed)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - started < min_seconds:
        t = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def text_feed(tokenizer: Any, batch: int, seq: int) -> dict[str, np.ndarray]:
    sentences = [s.strip() for s in HELDOUT.read_text().splitlines() if s.strip()]
    long = [" ".join(sentences[i:i + 12]) for i in range(batch)]  # fill the sequence
    enc = tokenizer(long, padding="max_length", truncation=True, max_length=seq,
                    return_tensors="np")
    return {k: v.astype(np.int64) for k, v in enc.items()}


def measure_model(model: str, work: Path, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    from trtpack.shapes import parse_profiles
    from trtpack.sources.resolve import resolve_model

    cache = work / f"cache-{model}"
    builds: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for precision in PRECISIONS:
        print(f"[{model}] building {precision} ...", file=sys.stderr, flush=True)
        built = build(model, precision, work / f"{model}-{precision}", cache)
        if "failed" in built:
            failed[precision] = built["failed"]
        else:
            builds[precision] = built
    if "fp32" not in builds:
        return {"model": model, "random_weights": model != "minilm", "threads": threads,
                "results": {}, "failed": failed, "reports": {}}
    recipe = resolve_model(model)
    profile = parse_profiles(recipe.profiles, recipe.input_specs())[0]
    batch_seq = {corner: shapes["input_ids"] for corner, shapes in profile.corners()}
    tokenizer = _tokenizer(work / f"{model}-fp32")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {p: ort.InferenceSession(str(_served(work / f"{model}-{p}", model)), options,
                                        providers=["CPUExecutionProvider"])
                for p in builds}
    rows: dict[str, Any] = {}
    for precision in builds:
        print(f"[{model}] measuring {precision} ...", file=sys.stderr, flush=True)
        report = builds[precision]["report"]
        stage = next(s for s in report["stages"] if s["name"] == "precision")
        metrics = stage.get("metrics", {})
        cos = heldout_cosines(tokenizer, sessions["fp32"], sessions[precision])
        lat = {corner: latency_ms(sessions[precision], text_feed(tokenizer, *batch_seq[corner]))
               for corner in ("opt", "max")}
        low = metrics.get("low_precision", {})
        rows[precision] = {
            "heldout_cosine_min": float(cos.min()), "heldout_cosine_mean": float(cos.mean()),
            "heldout_sentences": len(cos),
            "gate_worst_metric": (metrics.get("after") or {}).get("worst_metric"),
            "gate_worst_before_fallback": (metrics.get("before") or {}).get("worst_metric"),
            "matmul_gemm_low_precision": low.get("matmul_gemm_low_precision"),
            "matmul_gemm_nodes": low.get("matmul_gemm_nodes"),
            "matmul_gemm_share": low.get("matmul_gemm_share"),
            "excluded_by_fallback": metrics.get("excluded_by_fallback", []),
            "precision_stage_seconds": stage["seconds"] if stage["status"] == "ok" else 0.0,
            "precision_stage_cached": stage["cached"],
            "modelopt_seconds": metrics.get("conversion_seconds"),
            "modelopt_conversions": metrics.get("conversions"),
            "fallback_seconds": (metrics.get("fallback") or {}).get("seconds"),
            "build_seconds": builds[precision]["seconds"],
            "build_peak_mb": builds[precision]["peak_mb"],
            "latency_ms": {f"{corner} {'x'.join(map(str, batch_seq[corner]))}": v
                           for corner, v in lat.items()},
            "warnings": report.get("warnings", []),
        }
    return {"model": model, "random_weights": model != "minilm", "threads": threads,
            "results": rows, "failed": failed,
            "reports": {p: b["report"] for p, b in builds.items()}}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | precision | MatMul/Gemm in low precision | held-out cosine min (mean) "
             "| conversion s | latency ms (opt / max shape) | vs FP32 (max) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        name = r["model"] + (" (random weights)" if r["random_weights"] else "")
        for precision, why in r["failed"].items():
            lines.append(f"| {name} | {precision} | build failed: {why} | | | | |")
        if "fp32" not in r["results"]:
            continue
        base = list(r["results"]["fp32"]["latency_ms"].values())[-1]
        for precision, row in r["results"].items():
            lat = list(row["latency_ms"].items())
            share = ("—" if precision == "fp32" else
                     f"{row['matmul_gemm_low_precision']}/{row['matmul_gemm_nodes']} "
                     f"({row['matmul_gemm_share']:.0%})")
            if row["excluded_by_fallback"]:
                share += f", {len(row['excluded_by_fallback'])} kept by fallback"
            conv = "—" if precision == "fp32" else f"{row['precision_stage_seconds']:.0f}"
            if row["precision_stage_cached"]:
                conv += " (cached: use a fresh --work)"
            lat_s = " / ".join(f"{v:.1f} ({k.split()[1]})" for k, v in lat)
            print_cos = ("1 (reference)" if precision == "fp32" else
                         f"{row['heldout_cosine_min']:.4f} ({row['heldout_cosine_mean']:.4f})")
            lines.append(f"| {name} | {precision} | {share} | {print_cos} | {conv} | {lat_s} "
                         f"| {base / lat[-1][1]:.2f}× |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json_path", type=Path, help="where to write the results (JSON)")
    parser.add_argument("--models", nargs="+", default=["minilm", "bert-base"])
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--work", type=Path, help="keep the builds here (default: a temp dir)")
    args = parser.parse_args()
    started = time.perf_counter()
    at_start = machine()
    with tempfile.TemporaryDirectory(prefix="trtpack-precision-bench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = [measure_model(m, work, args.threads) for m in args.models]
    text = table(results)
    print(text)
    args.json_path.parent.mkdir(parents=True, exist_ok=True)
    args.json_path.write_text(json.dumps({
        "machine": at_start, "seconds": time.perf_counter() - started, "table": text,
        "calibration": str(CALIBRATION.relative_to(REPO)),
        "heldout": str(HELDOUT.relative_to(REPO)), "models": results}, indent=2, default=str))


if __name__ == "__main__":
    main()

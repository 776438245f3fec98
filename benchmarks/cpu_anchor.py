"""trtpack's CPU models against the CPU anchor users pick: Hugging Face Optimum's ONNX path,
and PyTorch eager, in one run on the same inputs; and the machine's FP32 ceiling.

    python benchmarks/cpu_anchor.py --fp32-build OUT_FP32 --int8-build OUT_INT8 \\
        benchmarks/results/cpu-anchor.json [--model minilm|bert-base --threads 2 \\
        --rounds 5 --seconds 0.6]

OUT_FP32 / OUT_INT8: ``trtpack build minilm --target cpu [--precision int8 --calibration
data/calibration/everyday-50.txt]`` (all-MiniLM-L6-v2, real weights: speed and accuracy) or
``trtpack build bert-base --random-weights --target cpu [--precision int8]`` (random
weights: speed only) output folders; their served model.onnx is timed. PyTorch eager and
the Optimum-like export are made from the FP32 build's recipe by trtpack's own loader, with
the build's weights (random: the seed every build uses), checked against the PyTorch outputs
the build recorded. The corners are the build's profile corners (min, opt, max).

What "Optimum" is here: optimum-onnx 0.1.0 pins transformers<4.58 and cannot share
trtpack's environment, so this script calls what Optimum calls, with Optimum's settings:
  * export: ``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``, opset 14,
    dynamic batch/sequence axes), as ``optimum-cli export onnx`` does, of the model with
    eager attention (so that ORT fuses its Attention, as Optimum's O2 does on the
    transformers it supports);
  * O2 / O3: ``onnxruntime.transformers.optimizer.optimize_model(model_type="bert",
    num_heads, hidden_size, opt_level=2, optimization_options=FusionOptions)`` with
    Optimum's O2 fusions, and O3 = O2 + GELU approximation (FastGelu);
  * dynamic INT8 (``AutoQuantizationConfig.avx512_vnni(is_static=False)``):
    ``onnxruntime.quantization.quantize_dynamic`` of the plain export, per-channel s8
    weights, u8 activations, no reduce_range, every operator ORT's registry quantizes.
PyTorch eager: ``torch.inference_mode()``, the same thread count.

Timing: every model at one corner is timed in rotation (A B C … A B C …, ``--rounds``
rounds of ``--seconds`` each), ONNX Runtime sessions with ``--threads`` intra-op threads and
no spinning (``session.intra_op.allow_spinning=0``), OMP_WAIT_POLICY=PASSIVE for PyTorch:
an idle spinning pool of one model would slow the next. p50 = the median of the rounds'
medians; spread = (max - min) / median of the rounds' medians. Accuracy: each sentence of
data/calibration/heldout.txt (read by no build option) alone, mean-pooled and compared
with FP32 PyTorch by cosine; the worst and the mean (random weights: a check that every model
computes the same function, not an accuracy claim).

FP32 ceiling: torch.mm FP32 of the model's two FFN shapes at 1024 rows, with the same
threads, timed like the models (GFLOP/s from the median); the model's MatMul FLOPs per
corner from its config; their ratio is the lowest time any FP32 implementation could reach,
shown beside half of PyTorch eager's p50 (what "FP32 >= 2x eager" needs).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _anchor_models import (
    ceiling_markdown,
    fp32_ceiling,
    gemm_calls,
    load_anchor_model,
    served_model,
    weight_check,
)

REPO = Path(__file__).resolve().parents[1]
HELDOUT = REPO / "data" / "calibration" / "heldout.txt"
MODELS = ("minilm", "bert-base")
ACCURACY_NOTE = {
    "pretrained": "worst per-sentence cosine of mean-pooled embeddings vs FP32 PyTorch",
    "random": "random weights: not an accuracy claim (the cosines only check that every "
              "model computes the same function as eager PyTorch; speed is what counts)"}


def optimum_export(folder: str, path: Path) -> None:
    import torch
    from transformers import AutoModel

    # eager attention: the MatMul/Softmax pattern ORT's Attention fusion matches (the
    # TorchScript export of transformers 5's SDPA path is not fused: O2 would lose Attention)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    names = ("input_ids", "attention_mask", "token_type_ids")
    sample = tuple(torch.ones(2, 8, dtype=torch.long) for _ in names)
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    axes["last_hidden_state"] = {0: "batch_size", 1: "sequence_length"}

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

    with torch.inference_mode():
        torch.onnx.export(Wrapper(), sample, str(path), input_names=list(names),
                          output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=14, dynamo=False)


def optimum_optimize(src: Path, dst: Path, level: int, num_heads: int, hidden: int
                     ) -> dict[str, int]:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_gelu_approximation = level >= 3  # Optimum's O3
    optimized = optimize_model(str(src), model_type="bert", num_heads=num_heads,
                               hidden_size=hidden, opt_level=2, use_gpu=False,
                               optimization_options=options, only_onnxruntime=False)
    optimized.save_model_to_file(str(dst))
    return {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}


def optimum_dynamic_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), per_channel=True, reduce_range=False,
                     weight_type=QuantType.QInt8)


def session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def corner_inputs(tokenizer: Any, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Real tokens: the held-out text's token stream cut into rows of exactly ``seq``."""
    text = " ".join(s for s in HELDOUT.read_text().splitlines() if s.strip())
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rows = []
    for row in range(batch):
        start = row * (seq - 2)
        rows.append([tokenizer.cls_token_id, *ids[start:start + seq - 2],
                     tokenizer.sep_token_id])
    input_ids = np.array(rows, np.int64)
    return {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.zeros_like(input_ids)}


def time_rotation(calls: dict[str, Callable[[], object]], rounds: int, seconds: float
                  ) -> dict[str, dict[str, Any]]:
    for call in calls.values():  # warm-up
        for _ in range(3):
            call()
    medians: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            found: list[float] = []
            started = time.perf_counter()
            while not found or time.perf_counter() - started < seconds:
                t0 = time.perf_counter()
                call()
                found.append(time.perf_counter() - t0)
            medians[name].append(statistics.median(found) * 1000)
    return {name: {"p50_ms": round(statistics.median(v), 3),
                   "spread": round((max(v) - min(v)) / statistics.median(v), 4),
                   "round_p50_ms": [round(x, 3) for x in v]} for name, v in medians.items()}


def _run_call(s: Any, feed: dict[str, np.ndarray]) -> Callable[[], object]:
    return lambda: s.run(None, feed)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", type=Path)
    parser.add_argument("--model", choices=MODELS, default="minilm",
                        help="the recipe the builds were made from (bert-base: random weights)")
    parser.add_argument("--fp32-build", type=Path, required=True)
    parser.add_argument("--int8-build", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.6, help="per model per round")
    args = parser.parse_args()

    import torch

    from trtpack.verify.sample_metrics import pooled_cosine_per_sample

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    served = {"trtpack fp32": args.fp32_build, "trtpack int8": args.int8_build}
    with tempfile.TemporaryDirectory(prefix="cpu-anchor-") as tmp:
        work = Path(tmp)
        anchor = load_anchor_model(args.model, args.fp32_build, work)
        tokenizer, torch_model = anchor.tokenizer, anchor.torch_model
        same_weights = weight_check(anchor, args.fp32_build)
        optimum_export(anchor.folder, work / "export.onnx")
        geometry = (anchor.num_heads, anchor.hidden)
        fused = {"optimum O2": optimum_optimize(work / "export.onnx", work / "o2.onnx", 2,
                                                *geometry),
                 "optimum O3": optimum_optimize(work / "export.onnx", work / "o3.onnx", 3,
                                                *geometry)}
        optimum_dynamic_int8(work / "export.onnx", work / "int8.onnx")
        paths = {"optimum export fp32": work / "export.onnx", "optimum O2": work / "o2.onnx",
                 "optimum O3": work / "o3.onnx", "optimum dynamic int8": work / "int8.onnx"}
        # before this issue: the TensorRT-shaped FP32 graph that --target cpu served
        paths["trtpack fp32 before (plain graph)"] = (args.fp32_build / "artifacts" /
                                                      "simplify" / "model.onnx")
        paths.update({name: served_model(out, anchor.name) for name, out in served.items()})
        sessions = {name: session(path, args.threads) for name, path in paths.items()}

        sentences = [s.strip() for s in HELDOUT.read_text().splitlines() if s.strip()]
        cosines: dict[str, list[float]] = {name: [] for name in [*sessions, "pytorch eager"]}
        for sentence in sentences:
            enc = tokenizer([sentence], return_tensors="np", truncation=True, max_length=128)
            feed = {k: v.astype(np.int64) for k, v in enc.items()}
            with torch.inference_mode():
                ref = torch_model(**{k: torch.from_numpy(v) for k, v in feed.items()}
                                  ).last_hidden_state.numpy()
            cosines["pytorch eager"].append(1.0)
            for name, s in sessions.items():
                names = {i.name for i in s.get_inputs()}
                got = s.run(None, {k: v for k, v in feed.items() if k in names})[0]
                (cosine,) = pooled_cosine_per_sample(ref, got, feed, "attention_mask")
                cosines[name].append(float(cosine))

        timings: dict[str, dict[str, Any]] = {}
        for batch, seq in anchor.corners:
            feed = corner_inputs(tokenizer, batch, seq)
            tensors = {k: torch.from_numpy(v) for k, v in feed.items()}

            def eager(tensors: dict[str, Any] = tensors) -> object:
                with torch.inference_mode():
                    return torch_model(**tensors).last_hidden_state

            calls: dict[str, Callable[[], object]] = {"pytorch eager": eager}
            for name, s in sessions.items():
                names = {i.name for i in s.get_inputs()}
                calls[name] = _run_call(s, {k: v for k, v in feed.items() if k in names})
            timings[f"{batch}x{seq}"] = time_rotation(calls, args.rounds, args.seconds)
            print(f"{batch}x{seq}: " + ", ".join(f"{n} {t['p50_ms']:.2f}"
                                                  for n, t in timings[f"{batch}x{seq}"].items()),
                  file=sys.stderr)
        mm_calls, mm_flops = gemm_calls(anchor)
        ceiling = fp32_ceiling(anchor, time_rotation(mm_calls, args.rounds, args.seconds),
                               mm_flops, timings)
    import platform

    import onnxruntime

    result = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "python":
                    platform.python_version(), "onnxruntime": onnxruntime.__version__,
                    "torch": torch.__version__},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "threads": args.threads, "rounds": args.rounds, "seconds_per_round": args.seconds,
        "model": anchor.name, "weights": anchor.weights, "weight_check": same_weights,
        "accuracy_note": ACCURACY_NOTE[anchor.weights],
        "optimum_fusions": fused, "sentences": len(sentences),
        "accuracy": {name: {"worst": round(min(v), 5), "mean": round(statistics.fmean(v), 5),
                            "worst_sentence": sentences[int(np.argmin(v))]}
                     for name, v in cosines.items()},
        "timings": timings,
        "fp32_ceiling": ceiling,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print()
    print(ceiling_markdown(ceiling))
    return 0


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def markdown(result: dict[str, Any]) -> str:
    corners = list(result["timings"])
    head = ("| model | unseen worst | " + " | ".join(f"p50 ms {c} (spread)" for c in corners)
            + " |\n|---|---:|" + "---:|" * len(corners))
    lines = [f"{result.get('model', 'minilm')}: accuracy = "
             f"{result.get('accuracy_note', ACCURACY_NOTE['pretrained'])}", "", head]
    for name, acc in result["accuracy"].items():
        cells = [f"{result['timings'][c][name]['p50_ms']:.2f} "
                 f"({result['timings'][c][name]['spread']:.0%})" for c in corners]
        lines.append(f"| {name} | {acc['worst']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

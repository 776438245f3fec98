"""ONNX Runtime's CPU kernels for one transformer block's normalization, fused and unfused:
why the CPU model writes SkipLayerNormalization back as Sum + LayerNormalization
(``trtpack.precision.cpu.kernels``); and its fused Attention on a padded batch with ONNX
Runtime's default mask value and with trtpack's (``cpu_fusion.MASK_FILTER_VALUE``).

    python benchmarks/cpu_kernels.py benchmarks/results/cpu-kernels.json [--hidden 384]

Each form is a one-node or few-node ONNX model on random normal inputs of shape
(batch, sequence, hidden) at minilm's corners, run by ONNX Runtime with all graph
optimizations on (so the forms it would fuse back are fused back, and the table says which
operators it ran), 2 intra-op threads, no spinning; p50 of 300 runs after 20 warm-ups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

CORNERS = ((1, 8), (4, 32), (8, 128))
FORMS = {
    "SkipLayerNormalization (bias inside)": "skip",
    "Add bias, Add residual, LayerNormalization": "add",
    "Add bias, Sum residual, LayerNormalization (trtpack)": "sum",
}


def model(form: str, hidden: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, hidden).astype(np.float32), n)
             for n in ("gamma", "beta", "bias")]
    if form == "skip":
        nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                                  ["y"], domain="com.microsoft", epsilon=1e-12)]
    else:
        nodes = [helper.make_node("Add", ["x", "bias"], ["biased"]),
                 helper.make_node("Sum" if form == "sum" else "Add", ["biased", "skip"], ["total"]),
                 helper.make_node("LayerNormalization", ["total", "gamma", "beta"], ["y"],
                                  axis=-1, epsilon=1e-12)]
    graph = helper.make_graph(
        nodes, form, [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", hidden])
                      for n in ("x", "skip")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def session(model: bytes, optimized: Path | None = None) -> Any:
    """ONNX Runtime on ``model`` as the benchmark runs every form: all optimizations, 2
    intra-op threads, no spinning (``optimized``: where the graph it runs is written)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def p50_us(run: Any, feed: dict[str, np.ndarray], warm_up: int, runs: int) -> float:
    """The median of ``runs`` timed calls of ``run(None, feed)`` after ``warm_up``, in µs."""
    for _ in range(warm_up):
        run(None, feed)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run(None, feed)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e6, 1)


def attention_rows(hidden: int, heads: int = 12) -> list[dict[str, object]]:
    """``Attention`` at 8x128 with the rows padded to 20-40 real tokens (as a batch of
    sentences is) and unpadded, per mask value; its outputs on real tokens compared."""
    from onnx import TensorProto, helper, numpy_helper

    from trtpack.precision.cpu.fusion import MASK_FILTER_VALUE

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.05, (hidden, 3 * hidden)).astype(np.float32),
                                     "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, 3 * hidden).astype(np.float32), "b")]
    x = rng.normal(0, 1, (8, 128, hidden)).astype(np.float32)
    padded = np.zeros((8, 128), np.int32)
    for row, length in enumerate((40, 20, 35, 30, 25, 30, 35, 30)):
        padded[row, :length] = 1
    rows: list[dict[str, object]] = []
    reference = None
    for label, value in (("ONNX Runtime's default (-10000)", -10000.0),
                         (f"trtpack ({MASK_FILTER_VALUE:g})", MASK_FILTER_VALUE)):
        node = helper.make_node("Attention", ["x", "w", "b", "mask"], ["y"],
                                domain="com.microsoft", num_heads=heads, mask_filter_value=value)
        graph = helper.make_graph(
            [node], "attention",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden]),
             helper.make_tensor_value_info("mask", TensorProto.INT32, ["b", "s"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                        helper.make_opsetid("com.microsoft", 1)])
        attention = session(model.SerializeToString())
        for batch, mask in (("8x128 padded", padded), ("8x128 unpadded", np.ones_like(padded))):
            feed = {"x": x, "mask": mask}
            out = attention.run(None, feed)[0]
            difference = None
            if batch.endswith(" padded"):
                reference = out if reference is None else reference
                difference = float(np.abs(out - reference)[padded.astype(bool)].max())
            row = {"corner": batch, "form": f"Attention, mask value {label}",
                   "p50_us": p50_us(attention.run, feed, warm_up=5, runs=50),
                   "max_abs_difference_on_real_tokens": difference}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    import onnx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--hidden", type=int, default=384)
    args = parser.parse_args()
    rows = []
    for batch, seq in CORNERS:
        rng = np.random.default_rng(batch * seq)
        feed = {n: rng.normal(0, 1, (batch, seq, args.hidden)).astype(np.float32)
                for n in ("x", "skip")}
        for label, form in FORMS.items():
            optimized = args.json.with_suffix(".graph.onnx")
            block = session(model(form, args.hidden), optimized)
            ran = [n.op_type for n in onnx.load(str(optimized)).graph.node]
            optimized.unlink()
            row = {"corner": f"{batch}x{seq}", "form": label, "ran": ran,
                   "p50_us": p50_us(block.run, feed, warm_up=20, runs=300)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    rows += attention_rows(args.hidden)
    args.json.write_text(json.dumps({"hidden": args.hidden, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

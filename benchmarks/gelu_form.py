"""The erf GELU in the exporter's order against the order ONNX Runtime fuses
(``trtpack.onnx_tools.gelu_form``, issue 47): verify's ONNX Runtime pass over a build's
simplified graph both ways, in rotation in one process.

    python benchmarks/gelu_form.py BUILD_DIR [--rounds 3] [--threads N] [--json FILE]

BUILD_DIR is a finished ``trtpack build`` (``--target cpu``) of a model trtpack exported: its
``artifacts/simplify/model.onnx`` has the GELUs rewired; the script puts them back in the
exporter's order (``x * (0.5 * (1 + erf))``) for the other side. Each side runs verify's
session (``few_runs``, pre-packed as verify decides) on the build's reference inputs at
every profile corner. First both sides run with ONNX Runtime's optimizations off: their
outputs must be the same bit for bit (the rewrite's claim); then the timed rounds, sides
alternating, CPU-seconds of this process (the figure a loaded machine inflates least) and
wall seconds, with the largest difference between the sides' optimized outputs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine


def exporter_order(model: Any) -> int:
    """Put each rewired GELU of ``model`` (``Mul(Mul(x, Add(Erf(..), 1)), 0.5)``) back in the
    dynamo exporter's order ``Mul(x, Mul(0.5, Add(...)))``; returns how many."""
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    count = 0
    for erf in (n for n in model.graph.node if n.op_type == "Erf"):
        (add,) = readers[erf.output[0]]
        (inner,) = readers[add.output[0]]
        (outer,) = readers[inner.output[0]]
        x = producer[erf.input[0]].input[0]
        half = next(i for i in outer.input if i != inner.output[0])
        inner.input[:] = [half, add.output[0]]
        outer.input[:] = [x, inner.output[0]]
        count += 1
    return count


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads (default: ONNX Runtime's, as verify)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import onnx

    from trtpack.cases import load_cases
    from trtpack.runtimes.onnxruntime import cpu_session, few_runs_prepacked, run_session

    fusable = args.build / "artifacts" / "simplify" / "model.onnx"
    cases = load_cases(args.build / "artifacts" / "export" / "reference.npz")
    feeds = [c.inputs for c in cases]
    work = Path(tempfile.mkdtemp(prefix="gelu-form-"))
    try:
        model = onnx.load(str(fusable), load_external_data=False)
        gelus = exporter_order(model)
        exported = work / "model.onnx"
        shutil.copyfile(fusable.with_name("model.onnx.data"), work / "model.onnx.data")
        onnx.save(model, str(exported))
        sides = {"exporter's order": exported, "fusable order": fusable}

        def run(path: Path, optimized: bool = True) -> list[dict[str, np.ndarray]]:
            return run_session(cpu_session(path, args.threads, few_runs=True, optimized=optimized,
                                           prepacked=few_runs_prepacked(feeds)), feeds)

        written = [run(p, optimized=False) for p in sides.values()]
        identical = all(a[k].tobytes() == b[k].tobytes()
                        for a, b in zip(*written, strict=True) for k in a)
        print(f"{gelus} GELUs; as written, outputs identical at every corner: {identical}")
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        outputs: dict[str, list[dict[str, np.ndarray]]] = {}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in order:
                cpu, wall = cpu_seconds(), time.perf_counter()
                outputs[name] = run(sides[name])
                rows[name].append((cpu_seconds() - cpu, time.perf_counter() - wall))
                print(f"round {round_} {name}: {rows[name][-1][0]:.2f} CPU-s, "
                      f"{rows[name][-1][1]:.2f} s", flush=True)
        diff = max(float(np.abs(a[k] - b[k]).max())
                   for a, b in zip(*outputs.values(), strict=True) for k in a)
        result: dict[str, Any] = {
            "build": str(args.build), "gelus": gelus, "identical_as_written": identical,
            "max_abs_diff_optimized": diff, "threads": args.threads, "machine": machine(),
            "sides": {name: {"cpu_s": [r[0] for r in v], "wall_s": [r[1] for r in v],
                             "median_cpu_s": float(np.median([r[0] for r in v])),
                             "median_wall_s": float(np.median([r[1] for r in v]))}
                      for name, v in rows.items()}}
        for name, side in result["sides"].items():
            print(f"{name}: median {side['median_cpu_s']:.2f} CPU-s, "
                  f"{side['median_wall_s']:.2f} s")
        print(f"optimized outputs: largest difference between the sides {diff:.3g}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

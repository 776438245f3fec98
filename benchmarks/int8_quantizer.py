"""trtpack's own INT8 Q/DQ (``precision/int8/qdq.py``) against ModelOpt's ``quantize`` (as
trtpack's worker called it before) on the same job: a model's simplified FP32 graph and the
calibration batches the precision stage makes (trtpack's default text, the recipe's sample
count and seed). Each quantizer runs in a process of its own (wall time, peak resident
memory of the process tree); then the two models are compared node for node (names, op
types, inputs, outputs, attributes), initializer for initializer, scales by relative
difference.

    python benchmarks/int8_quantizer.py --model bert-base --profile 1x128:16x128:128x128 \
        --json benchmarks/results/int8-quantizer-bert-base.json
    python benchmarks/int8_quantizer.py --model bert-large --profile 1x128:16x128:128x128 \
        --quantizers trtpack        # ModelOpt's needs about 19 GB there

Builds MODEL first (``--precision fp32 --target g5 --no-engine --random-weights``), or takes
``--build DIR`` (a finished build folder of it). ``--repeat N`` alternates the quantizers N
times (A/B on a loaded machine). Figures: benchmarks/README.md, "INT8's precision stage".
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import int8_inputs, machine, run_measured

ROOT = Path(__file__).resolve().parents[1]
OP_TYPES = ["MatMul", "Gemm", "Conv"]

TRTPACK = """
import sys
from pathlib import Path
from trtpack.precision.calibration.data import load_feeds
from trtpack.precision.int8 import qdq
qdq.quantize(Path(sys.argv[1]), Path(sys.argv[3]), OP_TYPES, [], [],
             load_feeds(Path(sys.argv[2])))
""".replace("OP_TYPES", repr(OP_TYPES))

MODELOPT = """
import sys
from pathlib import Path
from trtpack.precision.modelopt_jobs import Int8Job, ModelOptJob
from trtpack.precision.modelopt_worker import run_int8
job = ModelOptJob("int8", input=sys.argv[1], output=sys.argv[3], int8=Int8Job(
    calibration=sys.argv[2], op_types_to_quantize=OP_TYPES))
run_int8(job, Path.cwd())  # the worker's job, as trtpack ran it before
""".replace("OP_TYPES", repr(OP_TYPES))


def compare(mine: Path, theirs: Path) -> dict[str, Any]:
    """Node for node, initializer for initializer; the largest relative scale difference."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    def view(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        model = onnx.load(str(path), load_external_data=False)
        nodes = {n.name: (n.op_type, list(n.input), list(n.output),
                          sorted((a.name, str(helper.get_attribute_value(a)))
                                 for a in n.attribute)) for n in model.graph.node}
        return nodes, {i.name: i for i in model.graph.initializer}

    my_nodes, my_inits = view(mine)
    their_nodes, their_inits = view(theirs)
    scales = [n for n in their_inits if n.endswith("_scale") and n in my_inits]
    worst = 0.0
    for name in scales:
        a = numpy_helper.to_array(my_inits[name]).astype(np.float64)
        b = numpy_helper.to_array(their_inits[name]).astype(np.float64)
        worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))))
    return {"nodes": [len(my_nodes), len(their_nodes)],
            "same_nodes": my_nodes == their_nodes,
            "same_initializer_names": my_inits.keys() == their_inits.keys(),
            "qdq_pairs": sum(op == "QuantizeLinear" for op, *_ in my_nodes.values()),
            "scales": len(scales), "worst_relative_scale_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--profile", default="1x128:16x128:128x128")
    parser.add_argument("--build", type=Path, help="a finished build folder of MODEL")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/int8-quantizer"))
    parser.add_argument("--quantizers", default="trtpack,modelopt")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = args.workdir
    job = int8_inputs(args.model, args.profile, work, args.build)
    runs: list[dict[str, Any]] = []
    outputs: dict[str, Path] = {}
    for k in range(args.repeat):
        for quantizer in args.quantizers.split(","):
            folder = work / f"{quantizer}-{k}"
            folder.mkdir()
            script = TRTPACK if quantizer == "trtpack" else MODELOPT
            measured = run_measured(
                [sys.executable, "-c", script, str(job.graph), str(job.calibration),
                 str(folder / "model.onnx")],
                env={"PYTHONPATH": str(ROOT)}, cwd=str(folder))
            run = {"quantizer": quantizer, "exit": measured.returncode,
                   "seconds": round(measured.seconds, 1), "peak_mb": round(measured.peak_mb),
                   "load_average": machine()["load_average_at_start"]}
            if measured.returncode:
                run["error"] = measured.stderr.strip().splitlines()[-1:]
            runs.append(run)
            outputs.setdefault(quantizer, folder / "model.onnx")
            print(json.dumps(run), flush=True)
    result: dict[str, Any] = {
        "model": args.model, "profile": args.profile, "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "calibration_batches": job.batch_shapes, "runs": runs}
    if {"trtpack", "modelopt"} <= outputs.keys() and all(r["exit"] == 0 for r in runs):
        result["comparison"] = compare(outputs["trtpack"], outputs["modelopt"])
        print(json.dumps(result["comparison"]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

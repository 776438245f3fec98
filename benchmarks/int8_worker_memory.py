"""Where ModelOpt's INT8 quantize spends its memory: trtpack's worker call
(``modelopt_worker.quantize_int8``) run alone on a model's simplified FP32 graph and its
calibration batches, printing the process's anonymous resident memory on entry to and exit
from each ModelOpt / ONNX Runtime call that loads, copies or runs the model.

    python benchmarks/int8_worker_memory.py --model bert-base \
        --profile 1x128:16x128:128x128 --workdir /tmp/int8-memory

Builds MODEL first (``--precision fp32 --target g5 --no-engine --random-weights``, its FP32
graph and tokenizer are what the INT8 build quantizes), makes the calibration batches as the
precision stage does (trtpack's default text, the recipe's sample count and seed), then
quantizes in a process of its own. ``--env NAME=VALUE`` sets the quantizing process's
environment (e.g. ``MALLOC_MMAP_THRESHOLD_=65536``). Figures: benchmarks/README.md,
"INT8's precision stage".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import int8_inputs

ROOT = Path(__file__).resolve().parents[1]

TRACE = r'''
import functools, importlib, sys, time
from pathlib import Path
T0 = time.time()
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) // 1024
    return 0
depth = [0]
def wrap(owner, name, label):
    fn = getattr(owner, name)
    @functools.wraps(fn)
    def traced(*a, **k):
        print(f"{time.time() - T0:7.1f} s {'  ' * depth[0]}> {label}: {rss():,} MB", flush=True)
        depth[0] += 1
        try:
            return fn(*a, **k)
        finally:
            depth[0] -= 1
            print(f"{time.time() - T0:7.1f} s {'  ' * depth[0]}< {label}: {rss():,} MB",
                  flush=True)
    setattr(owner, name, traced)
import onnx, onnxruntime as ort
from modelopt.onnx.quantization import quantize
from onnxruntime.quantization import calibrate
q = importlib.import_module("modelopt.onnx.quantization.quantize")
i8 = importlib.import_module("modelopt.onnx.quantization.int8")
op = importlib.import_module("modelopt.onnx.quantization.ort_patching")
wrap(onnx, "load", "onnx.load")
wrap(ort.InferenceSession, "__init__", "onnxruntime session")
wrap(q, "_preprocess_onnx", "preprocess")
wrap(q, "find_nodes_from_mha_to_exclude", "MHA check")
wrap(i8, "find_nodes_from_matmul_to_exclude", "small-GEMM check")
wrap(i8, "quantize_static", "quantize_static")
wrap(op, "load_model_with_shape_infer", "load with shape inference")
wrap(calibrate.MinMaxCalibrater, "augment_graph", "augment graph")
wrap(op, "_compute_data_minmax_calibrator", "a calibration batch's ranges")
from trtpack.precision.modelopt_jobs import Int8Job
from trtpack.precision.modelopt_worker import prepare_int8_input, quantize_int8
source, _ = prepare_int8_input(Path(sys.argv[1]))
spec = Int8Job(calibration=sys.argv[2], op_types_to_quantize=["MatMul", "Gemm", "Conv"])
quantize_int8(quantize, spec, source, Path("quantized.onnx"), "max")
print(f"{time.time() - T0:7.1f} s done: {rss():,} MB", flush=True)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--profile", default="1x128:16x128:128x128")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/int8-memory"))
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    job = int8_inputs(args.model, args.profile, args.workdir)
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           **dict(e.split("=", 1) for e in args.env)}
    subprocess.run([sys.executable, "-c", TRACE, str(job.graph), str(job.calibration)],
                   cwd=args.workdir, env=env, check=True)


if __name__ == "__main__":
    main()

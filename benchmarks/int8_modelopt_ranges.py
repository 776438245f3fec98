"""ModelOpt's INT8 calibration of a build's graph, without ModelOpt's whole-graph quantize
(~19 GB on bert-large): its calibrator alone, set up as ``modelopt.onnx.quantization.int8.
quantize`` sets it up for ``max``: ``ort_utils.configure_ort`` patches ONNX Runtime's
calibrators; ``ort_patching._create_calibrator_with_extra_options`` makes ONNX Runtime's
``MinMaxCalibrater`` over the nodes to quantize, its session ``ORT_DISABLE_ALL``;
``ort_patching._adjust_tensor_ranges`` sets a Softmax output to [0, 1]; ONNX Runtime's
``quant_utils.compute_scale_zp`` makes the symmetric INT8 scale. It runs on the build's
simplified FP32 graph after ModelOpt's preprocessing, over the build's calibration batches.
Each activation scale is then compared, bit for bit, with the scale in the build's served Q/DQ
model (trtpack's own quantizer): equal, or how many float32 ulps apart; and each activation
trtpack quantizes that ModelOpt has no range for (a tensor without a shape-inferred type,
which ModelOpt's calibrator skips and ONNX Runtime's quantizer then leaves in FP32).

    python benchmarks/int8_modelopt_ranges.py --build OUT --json /tmp/modelopt-ranges.json

OUT: a finished ``--precision int8`` build for a GPU target (its ``artifacts/simplify`` graph
and ``artifacts/precision/model.onnx``). For the design card (bert-large, 8 batches of
16x128) its peak is about 11.3 GB (ModelOpt's calibration session holds a whole batch's
activations; check ``free -g`` first) and it took ~9 minutes on two loaded cores. Figures:
benchmarks/README.md,
"INT8 design card: trtpack's Q/DQ against ModelOpt's calibrator on bert-large".
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
from _measure import int8_inputs, machine, run_measured

OP_TYPES = ["MatMul", "Gemm", "Conv"]

# Run in a process of its own: ModelOpt patches onnxruntime's quantization modules.
CALIBRATE = """
import json, sys
from pathlib import Path
import numpy as np
import onnx
from onnxruntime.quantization import CalibrationMethod, calibrate
from onnxruntime.quantization.calibrate import CalibrationDataReader
from modelopt.onnx.quantization.ort_utils import configure_ort
from trtpack.precision.calibration.data import load_feeds
from trtpack.precision.modelopt_worker import prepare_int8_input

source, feeds_path, work, out = map(Path, sys.argv[1:5])
op_types = OP_TYPES
prepared, _ = prepare_int8_input(source)
graph = onnx.load(str(prepared), load_external_data=False).graph
nodes = [n.name for n in graph.node if n.op_type in op_types]
graph_op_types = sorted({n.op_type for n in graph.node})
softmax_outputs = {n.output[0] for n in graph.node if n.op_type == "Softmax"}
del graph
options, _ = configure_ort(graph_op_types, list(op_types), None, ["cpu"], False)
feeds = load_feeds(feeds_path)

class Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter(feeds)
    def get_next(self):
        return next(self.it, None)

calibrator = calibrate.create_calibrator(
    prepared, nodes, augmented_model_path=str(work / "augmented_model.onnx"),
    calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True,
    extra_options={"execution_providers": options["ExecutionProviders"],
                   "trt_rtx_backend": options["TrtRtxBackend"]})
calibrator.collect_data(Reader())
ranges = calibrator.compute_data()
found = {}
for name, data in ranges.data.items():
    low, high = (float(np.asarray(v).reshape(-1)[0]) for v in data.range_value)
    if name in softmax_outputs:
        low, high = 0.0, 1.0
    found[name] = [low, high]
out.write_text(json.dumps(found))
""".replace("OP_TYPES", repr(OP_TYPES))


def ort_scale(low: float, high: float) -> Any:
    """ONNX Runtime's symmetric INT8 scale of [low, high] as its QDQ quantizer makes it."""
    import numpy as np
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.INT8, symmetric=True)
    _, scale = compute_scale_zp(np.float32(low), np.float32(high), qmin, qmax, symmetric=True)
    return np.asarray(scale, dtype=np.float32)


def compare(served: Path, ranges: dict[str, list[float]]) -> dict[str, Any]:
    """Each activation scale of the served Q/DQ model against ModelOpt's."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(served), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    rows = []
    for q in model.graph.node:
        t = q.input[0]
        if q.op_type != "QuantizeLinear" or t in inits:
            continue  # a weight's pair: its scale comes from the weight alone
        mine = numpy_helper.to_array(inits[q.input[1]]).astype(np.float32)
        if t not in ranges:
            rows.append({"tensor": t, "modelopt": None, "trtpack": float(mine)})
            continue
        theirs = ort_scale(*ranges[t])
        ulps = abs(int(mine.view(np.int32)) - int(theirs.view(np.int32)))
        rows.append({"tensor": t, "modelopt": float(theirs), "trtpack": float(mine),
                     "ulps": ulps})
    compared = [r for r in rows if r["modelopt"] is not None]
    return {"activations": len(rows), "equal": sum(r["ulps"] == 0 for r in compared),
            "differ": [r for r in compared if r["ulps"]],
            "no_modelopt_range": [r["tensor"] for r in rows if r["modelopt"] is None],
            "max_ulps": max((r["ulps"] for r in compared), default=0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, required=True,
                        help="a finished --precision int8 build for a GPU target")
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--profile", default="1x128:16x128:128x128")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    served = args.build / "artifacts" / "precision" / "model.onnx"
    with tempfile.TemporaryDirectory(prefix="trtpack-modelopt-ranges-") as tmp:
        work = Path(tmp)
        job = int8_inputs(args.model, args.profile, work / "job", build=args.build)
        ranges_path = work / "ranges.json"
        measured = run_measured([sys.executable, "-c", CALIBRATE, str(job.graph),
                                 str(job.calibration), str(work), str(ranges_path)])
        if measured.returncode:
            sys.exit(measured.stderr.strip()[-2000:])
        ranges = json.loads(ranges_path.read_text())
    result: dict[str, Any] = {
        "build": str(args.build), "calibration_batches": job.batch_shapes,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(), "modelopt_calibrator_seconds": round(measured.seconds, 1),
        "modelopt_calibrator_peak_mb": round(measured.peak_mb),
        **compare(served, ranges)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

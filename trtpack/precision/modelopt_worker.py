"""Runs one ModelOpt conversion in its own process (see ``trtpack.precision.modelopt_jobs``):

    python -m trtpack.precision.modelopt_worker JOB.json
    python -m trtpack.precision.modelopt_worker --preload MODE   (the job's path on stdin)

The second form imports ModelOpt first and then waits for its job, so that a worker started
early is ready when the job comes. The job is a ``ModelOptJob`` (JSON); the result (seconds,
...) is written where it says.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.onnx_tools.files import data_path, save_model
from trtpack.precision.fp16.autocast_cleanup import indexed_autocast_cleanup
from trtpack.precision.fp16.autocast_weights import (
    out_of_range_nodes,
    restore_weights,
    save_converted,
    strip_weights,
)
from trtpack.precision.int8.placement import INT8_OPSET
from trtpack.precision.modelopt_jobs import Int8Job, ModelOptJob, WorkerResult
from trtpack.processes import die_with_parent

if TYPE_CHECKING:
    from collections.abc import Callable
    
    import numpy as np
    import onnx
    from onnxruntime.quantization.calibrate import CalibrationDataReader


def exact(names: list[str]) -> list[str]:
    return [f"^{re.escape(n)}$" for n in names]


def _calibration_reader(feeds_path: str) -> CalibrationDataReader:
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    from trtpack.precision.calibration.data import load_feeds

    feeds = load_feeds(Path(feeds_path))

    class FeedReader(CalibrationDataReader):  # type: ignore[misc]
        """Batches of different shapes (bucketed to the profiles), in order."""

        def __init__(self) -> None:
            self.feeds = feeds
            self._it = iter(self.feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

        def get_first(self) -> dict[str, np.ndarray]:
            return self.feeds[0]

        def rewind(self) -> None:
            self._it = iter(self.feeds)

        def __len__(self) -> int:
            return len(self.feeds)

    return FeedReader()


def prepare_int8_input(source: Path) -> tuple[Path, list[str]]:
    """ModelOpt's preprocessing steps that rewrite the whole model, done on the graph alone.

    ``quantize`` upgrades the opset to 19 and duplicates initializers shared by several
    nodes, and saves a full copy of the model (weights included) after each step. Done
    here first, on the graph without its weights (external data stays in the source's data
    file, which the copy beside it refers to), the same model reaches ``quantize`` with
    nothing left for those steps to do. Returns the path to quantize and what was done."""
    import onnx
    from modelopt.onnx.utils import duplicate_shared_constants

    model = onnx.load(str(source), load_external_data=False)
    done = []
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if 1 < version < INT8_OPSET:
        model = onnx.version_converter.convert_version(model, INT8_OPSET)
        done.append(f"opset {version} -> {INT8_OPSET}")
    model, duplicated = duplicate_shared_constants(model)
    if duplicated:
        done.append("shared initializers duplicated")
    if not done:
        return source, done
    prepared = source.with_name("modelopt-" + source.name)  # beside it: same weight file
    onnx.save_model(model, str(prepared))
    return prepared, done


def run_int8(job: ModelOptJob, work: Path) -> WorkerResult:
    import onnx
    from modelopt.onnx.quantization import quantize

    spec = job.int8
    assert spec is not None
    source, prepared = prepare_int8_input(Path(job.input))
    tmp_out = work / "quantized.onnx"
    method = spec.calibration_method
    try:
        quantize_int8(quantize, spec, source, tmp_out, method)
    except ValueError as e:
        # ONNX Runtime's entropy collector (which ModelOpt calls) cannot histogram an
        # activation whose range is (nearly) a single value: "Too many bins for data range"
        if method != "entropy" or "Too many bins" not in str(e):
            raise
        method = "max"
        for leftover in work.glob("quantized*"):
            leftover.unlink()
        quantize_int8(quantize, spec, source, tmp_out, method)
    if not tmp_out.is_file():
        raise RuntimeError("ModelOpt quantize finished without writing a model")
    model = onnx.load(str(tmp_out), load_external_data=True)
    rewired: list[str] = []
    if spec.op_types_to_quantize and spec.dedicated_qdq:
        from trtpack.precision.graph import dedicate_qdq

        rewired = dedicate_qdq(model, spec.op_types_to_quantize)
    save_model(model, Path(job.output))
    if source != Path(job.input):
        source.unlink(missing_ok=True)
    return {"dedicated_qdq_rewired": rewired, "prepared": prepared,
            "calibration_method": method}


def quantize_int8(quantize: Callable[..., None], spec: Int8Job, source: Path, tmp_out: Path,
                  method: str) -> None:
    """One ModelOpt INT8 quantize call of ``spec`` with calibration ``method``."""
    quantize(
        onnx_path=str(source),
        quantize_mode="int8",
        calibration_data_reader=_calibration_reader(spec.calibration),
        calibration_method=method,
        calibration_eps=["cpu"],
        op_types_to_quantize=list(spec.op_types_to_quantize) or None,
        op_types_to_exclude=list(spec.op_types_to_exclude) or None,
        nodes_to_exclude=exact(spec.nodes_to_exclude) or None,
        high_precision_dtype=spec.high_precision,
        # weights outside the protobuf in every copy ModelOpt saves (the same model; its
        # intermediate copies are written and read faster, without protobuf serialization)
        use_external_data_format=True,
        output_path=str(tmp_out),
        log_level="INFO",
    )


KILL_AUTOCAST_VARIABLE = "TRTPACK_TEST_KILL_AUTOCAST"
"""Set to 1, the worker kills itself (SIGSEGV) where AutoCast would start: the crash of a
model AutoCast segfaults on, on demand, for the fallback's test."""


def run_fp16(job: ModelOptJob, work: Path) -> WorkerResult:
    assert job.fp16 is not None
    if job.fp16.converter == "float16":
        from trtpack.precision.fp16.onnxconverter_fallback import convert_float16

        return convert_float16(job, work)
    if os.environ.get(KILL_AUTOCAST_VARIABLE) == "1":  # tests: AutoCast's process crashes
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    return run_autocast(job, work)


def run_autocast(job: ModelOptJob, work: Path) -> WorkerResult:
    import numpy as np
    from modelopt.onnx.autocast import convert_to_mixed_precision
    from modelopt.onnx.autocast.convert import DEFAULT_DATA_MAX

    spec = job.fp16
    assert spec is not None
    source = Path(job.input)
    range_nodes: list[str] = []
    reference = spec.reference_inputs
    if reference:
        # the range rule computed once per stage and kept in a file across its conversions
        assert spec.range_nodes_file is not None
        cached = Path(spec.range_nodes_file)
        if cached.is_file():
            range_nodes = json.loads(cached.read_text())
        else:
            with np.load(reference) as data:
                feed = {k: data[k] for k in data.files}
            range_nodes = out_of_range_nodes(source, feed, DEFAULT_DATA_MAX)
            cached.write_text(json.dumps(range_nodes))
    excluded = [*spec.nodes_to_exclude, *range_nodes]
    # With reference inputs both of AutoCast's value rules are applied here (I/O range
    # above, initializer range in strip_weights), so AutoCast converts the graph alone: its
    # own reference run and its copies of the weights (8 GB for bert-large's 1.3 GB) are
    # skipped, and the weights are cast to FP16 one at a time afterwards.
    weights: dict[str, onnx.TensorProto] = {}
    onnx_path = source
    if reference:
        onnx_path = source.with_name("graph-" + source.name)
        weights, beyond = strip_weights(source, onnx_path)
        excluded += beyond
    try:
        with indexed_autocast_cleanup():  # its dead-node cleanup without a scan per tensor
            model = convert_to_mixed_precision(
                onnx_path=str(onnx_path),
                low_precision_type="fp16",
                keep_io_types=spec.keep_io_types,
                nodes_to_exclude=exact(list(dict.fromkeys(excluded))) or None,
                op_types_to_exclude=list(spec.op_types_to_exclude) or None,
                data_max=np.inf if reference else DEFAULT_DATA_MAX,
                providers=["cpu"],
            )
    finally:
        if onnx_path != source:
            onnx_path.unlink(missing_ok=True)
    output = Path(job.output)
    with open(data_path(output), "wb") as data:  # the FP16 weights go there as they are made
        pending = restore_weights(model, weights, source.parent, data)
    save_converted(model, output, pending, source.parent)
    if reference:
        # AutoCast's model must run where it is verified: a failure (a shape mismatch in a
        # Cast it inserted, a crash) is this worker's, and the stage falls back
        from trtpack.precision.fp16.runtime_check import run_problem

        with np.load(reference) as data:
            problem = run_problem(Path(job.output), {k: data[k] for k in data.files})
        if problem is not None:
            raise RuntimeError(f"AutoCast's FP16 model does not run in ONNX Runtime: "
                               f"{problem}")
    return {"out_of_range_nodes": range_nodes,
            "weights_outside_autocast": len(weights)}


def preload(mode: str) -> None:
    """Import what a conversion in ``mode`` needs (ModelOpt and torch: seconds), so that a
    worker started early is ready when its job comes."""
    if mode == "int8":
        import modelopt.onnx.quantization
        import modelopt.onnx.utils
    elif mode == "fp16":
        import modelopt.onnx.autocast  # noqa: F401
    elif mode == "float16":
        import onnxconverter_common.float16  # noqa: F401


def main(argv: list[str]) -> int:
    die_with_parent()
    if len(argv) == 2 and argv[0] == "--preload":
        # started ahead of its job: import first, then read the job's path from stdin
        preload(argv[1])
        argv = [sys.stdin.readline().strip()]
    if len(argv) != 1 or not argv[0]:
        sys.stderr.write("usage: python -m trtpack.precision.modelopt_worker "
                         "(JOB.json | --preload MODE < JOB-PATH)\n")
        return 2
    job = ModelOptJob.from_json(Path(argv[0]).read_text())
    work = Path.cwd()
    started = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if job.mode == "int8":
        result = run_int8(job, work)
    elif job.mode == "fp16":
        result = run_fp16(job, work)
    else:
        sys.stderr.write(f"unknown mode {job.mode!r}\n")
        return 2
    result["seconds"] = time.perf_counter() - started
    Path(job.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # done: skip the interpreter's teardown of torch and ModelOpt (about a second)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
